package ledger

import (
	"bytes"
	"compress/zlib"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// sampleJSON is a finished create_order record's JSON (taken from a
// ledger file).
const sampleJSON = `{"tenant":"default","key":"fffdec48-c172-4c3c-aad9-828fea60214c","tool":"create_order","fingerprint":"814e7d3ecccb91ef568ad1ad794fa5fcf159f45c496a552e45c0f305199efe2f","state":"succeeded","attempts":1,"generation":1,"incarnation":"t1a233aae79b2f9ec71f665f0","on_lease_expiry":"retryable","principal":"local-agent","downstream":"embedded","result_format":1,"result":{"confirmation":{"message_id":"msg_5692aeca501773d2b701af377fbe6802","state":"queued"},"order":{"order_id":"ord_1a233aae79b42d679f090510","version":1,"status":"placed","customer_id":"bench-ae625c83-1110","items":[{"sku":"coffee-1kg","quantity":1,"unit_price_minor":1850}],"currency":"EUR","total_minor":1850,"operation_key":"fffdec48-c172-4c3c-aad9-828fea60214c","created_at":"2026-12-01T22:12:48.155253693Z","updated_at":"2026-12-01T22:12:48.155253693Z"}},"summary":"order ord_1a233aae79b42d679f090510","downstream_ref":"ord_1a233aae79b42d679f090510","first_seen_at":"2026-12-01T22:12:48.155253693Z","updated_at":"2026-12-01T22:12:48.155253693Z","completed_at":"2026-12-01T22:12:48.155253693Z","audit_seqs":[2214]}`

// sampleResult is that record's saved result, byte for byte.
const sampleResult = `{"confirmation":{"message_id":"msg_5692aeca501773d2b701af377fbe6802","state":"queued"},"order":{"order_id":"ord_1a233aae79b42d679f090510","version":1,"status":"placed","customer_id":"bench-ae625c83-1110","items":[{"sku":"coffee-1kg","quantity":1,"unit_price_minor":1850}],"currency":"EUR","total_minor":1850,"operation_key":"fffdec48-c172-4c3c-aad9-828fea60214c","created_at":"2026-12-01T22:12:48.155253693Z","updated_at":"2026-12-01T22:12:48.155253693Z"}}`

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustJSONQuiet(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// sampleRecord is sampleJSON decoded.
func sampleRecord(t testing.TB) *Record {
	t.Helper()
	var r Record
	if err := json.Unmarshal([]byte(sampleJSON), &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// TestSampleRecordStored: a finished create_order is stored in at most 55 %
// of its JSON's bytes and decodes to what it held, its result byte for
// byte.
func TestSampleRecordStored(t *testing.T) {
	v, err := EncodeRecord(sampleRecord(t))
	if err != nil {
		t.Fatal(err)
	}
	r, err := DecodeRecord(v)
	if err != nil {
		t.Fatal(err)
	}
	if string(r.Result) != sampleResult {
		t.Errorf("result = %s, want %s", r.Result, sampleResult)
	}
	if got := mustJSON(t, r); got != sampleJSON {
		t.Errorf("stored and decoded:\n got %s\nwant %s", got, sampleJSON)
	}
	t.Logf("stored in %d bytes, its JSON %d", len(v), len(sampleJSON))
	if len(v) > len(sampleJSON)*55/100 {
		t.Errorf("stored in %d bytes, its JSON is %d: want at most 55 %%", len(v), len(sampleJSON))
	}
}

// TestRecordRoundTrip: every field of a record survives its stored form, the
// result byte for byte.
func TestRecordRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 1, 22, 12, 48, 155253693, time.UTC)
	local := at.In(time.FixedZone("X", 3600))
	cases := map[string]*Record{
		"empty": {},
		"in_progress with arguments": {
			Tenant: "t\x01é", Key: "k", Tool: "create_order", Fingerprint: "fp", State: StateInProgress, Attempts: 2, Generation: 7,
			Incarnation: "t1", LeaseOwner: "owner", LeaseExpires: local, OnLeaseExpiry: StateUnknown, Principal: "p",
			Args: json.RawMessage(`{"customer_id":"c","items":[{"sku":"s","quantity":1,"unit_price_minor":1}],"note":"\u2028 <&>"}`), Downstream: "orders_api http://x",
			FirstSeenAt: at, UpdatedAt: local,
		},
		"awaiting approval": {
			Tenant: "t", Key: "k", State: StateAwaitingApproval, Approval: &Approval{
				ID: "apr_1", Status: ApprovalPending, Reason: "policy", Rule: "big", ResourceVersion: 3, Diff: json.RawMessage(`[{"op":"replace"}]`),
				DiffText: "- a\n+ b", CreatedAt: at, ExpiresAt: at.Add(time.Hour), Resource: json.RawMessage(`{"order_id":"o"}`),
			},
			AuditSeqs: []uint64{1, 1 << 60},
		},
		"failed": {
			Tenant: "t", Key: "k", State: StateFailed, ResultFormat: ResultFormat,
			Error: &OpError{Code: "invalid", Message: "no", Details: json.RawMessage(`{"field":"items"}`)}, CompletedAt: at,
		},
		"succeeded": {
			Tenant: "t", Key: "k", State: StateSucceeded, ResultFormat: ResultFormat, Result: json.RawMessage(sampleResult),
			Summary: "order o", DownstreamRef: "o", CompletedAt: at, AuditSeqs: []uint64{5, 6},
		},
		"tombstone": {Tenant: "t", Key: "k", State: StateSucceeded, Tombstone: true, Summary: "order o"},
	}
	for name, r := range cases {
		t.Run(name, func(t *testing.T) {
			want := mustJSON(t, r)
			before := mustJSON(t, r)
			v, err := EncodeRecord(r)
			if err != nil {
				t.Fatal(err)
			}
			if mustJSON(t, r) != before {
				t.Error("EncodeRecord changed its record")
			}
			got, err := DecodeRecord(v)
			if err != nil {
				t.Fatal(err)
			}
			if g := mustJSON(t, got); g != want {
				t.Errorf("round trip:\n got %s\nwant %s", g, want)
			}
			if !bytes.Equal(got.Result, r.Result) {
				t.Errorf("result %q, want %q", got.Result, r.Result)
			}
			if !got.LeaseExpires.Equal(r.LeaseExpires) || !got.FirstSeenAt.Equal(r.FirstSeenAt) {
				t.Errorf("times %v %v, want %v %v", got.LeaseExpires, got.FirstSeenAt, r.LeaseExpires, r.FirstSeenAt)
			}
		})
	}
}

func zlibForTest(plain string) []byte {
	var b bytes.Buffer
	w := zlib.NewWriter(&b)
	w.Write([]byte(plain))
	w.Close()
	return b.Bytes()
}

// TestNewerRecordFormatRefused: a record of a result format above this
// build's, and one stored by a development build before the format was
// reset, are ErrSchemaVersion.
func TestNewerRecordFormatRefused(t *testing.T) {
	for name, v := range map[string][]byte{
		"newer":                   zlibForTest(`{"tenant":"t","key":"k","result_format":2}`),
		"development, plain JSON": []byte(`{"tenant":"t","key":"k","result_format":1}`),
		"development, compressed": []byte(`{"result_format":2,"audit_seqs":[2214],"z":"eH1wkGLww5O60tLSUlKTTSx0kw3NjXRNko2TdRMTUyx1LYws0lITzQyMDE2SiUyBFoYmqeYpxqnJyclJloapaaZmFokphokp5pYmaYmmaclphqaWaSamySaWZommpkapJqbJBmnGBqaGlpapaalGaZSnYMNEI2PjxMRUc8skozTL1GRzwzQzM9M0UJgQn7Jz8pMTc3QT01PzQKFEZCIHpT4scYnkIBOjFDNzyzQDSwNTQ5CDsMYxHvUl+blJxSX5eamQ8ghbYjAy0zU00jUwDDEysjI0sjKx0DM0NTUyNTazNI7CTCgEVGMkIrzqawF4crl9"}`),
	} {
		if _, err := DecodeRecord(v); !errors.Is(err, ErrSchemaVersion) {
			t.Errorf("%s: %v, want ErrSchemaVersion", name, err)
		}
	}
	if r, err := DecodeRecord(zlibForTest(`{"tenant":"t","key":"k","result_format":1}`)); err != nil || r.Key != "k" {
		t.Errorf("a record of this build's format at another zlib level: %+v, %v", r, err)
	}
}

// TestDamagedRecordIsAnError: bytes that are not a record are an error
// (never ErrSchemaVersion, never a panic); a decompression that would
// exceed the bound stops there.
func TestDamagedRecordIsAnError(t *testing.T) {
	good, err := EncodeRecord(&Record{Tenant: "t", Key: "k", Result: json.RawMessage(sampleResult)})
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)/3] ^= 0xff
	for name, v := range map[string][]byte{
		"empty":        nil,
		"not zlib":     []byte("\x00\xffnot json"),
		"cut short":    good[:len(good)/2],
		"damaged":      flipped,
		"not a record": zlibForTest(`[1,2]`),
		"not JSON":     zlibForTest(`{"tenant":`),
		"cut JSON":     []byte(`{"state":`),
	} {
		if r, err := DecodeRecord(v); err == nil {
			t.Errorf("%s: decoded %+v, want an error", name, r)
		} else if errors.Is(err, ErrSchemaVersion) {
			t.Errorf("%s: %v: damage is not a newer format", name, err)
		}
	}
	big := zlibForTest(`{"tenant":"` + strings.Repeat("a", 1<<16) + `"}`)
	if _, err := inflateRecord(big, 1<<10); err == nil || !strings.Contains(err.Error(), "more than 1024 bytes") {
		t.Errorf("inflating past the bound: %v", err)
	}
}

// TestTombstoneEncoding: a tombstone is stored by EncodeRecord like any
// record and decodes to the tombstone.
func TestTombstoneEncoding(t *testing.T) {
	tomb := tombstone(sampleRecord(t))
	v, err := EncodeRecord(tomb)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRecord(v)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := mustJSON(t, got), mustJSON(t, tomb); a != b {
		t.Errorf("tombstone stored and read back:\n got %s\nwant %s", a, b)
	}
}

// FuzzDecodeRecord: no input panics, and whatever decodes is stored again
// and decodes to the same record.
func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte(sampleJSON))
	if v, err := EncodeRecord(&Record{Tenant: "t", Key: "k", Result: json.RawMessage(sampleResult), AuditSeqs: []uint64{3}}); err == nil {
		f.Add(v)
	}
	f.Add(zlibForTest(""))
	f.Fuzz(func(t *testing.T, v []byte) {
		r, err := DecodeRecord(v)
		if err != nil {
			return
		}
		again, err := EncodeRecord(r)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", r, err)
		}
		r2, err := DecodeRecord(again)
		if err != nil {
			t.Fatalf("stored again, does not decode: %v", err)
		}
		if a, b := mustJSONQuiet(r), mustJSONQuiet(r2); a != b {
			t.Fatalf("stored again:\n%s\n%s", a, b)
		}
	})
}
