package ledger

import (
	"bytes"
	"compress/zlib"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// format1Record is a finished create_order as the build before format 2
// stored it (taken from a ledger file that build wrote).
const format1Record = `{"tenant":"default","key":"fffdec48-c172-4c3c-aad9-828fea60214c","tool":"create_order","fingerprint":"814e7d3ecccb91ef568ad1ad794fa5fcf159f45c496a552e45c0f305199efe2f","state":"succeeded","attempts":1,"generation":1,"incarnation":"t1a233aae79b2f9ec71f665f0","on_lease_expiry":"retryable","principal":"local-agent","downstream":"embedded","result_format":1,"result":{"confirmation":{"message_id":"msg_5692aeca501773d2b701af377fbe6802","state":"queued"},"order":{"order_id":"ord_1a233aae79b42d679f090510","version":1,"status":"placed","customer_id":"bench-ae625c83-1110","items":[{"sku":"coffee-1kg","quantity":1,"unit_price_minor":1850}],"currency":"EUR","total_minor":1850,"operation_key":"fffdec48-c172-4c3c-aad9-828fea60214c","created_at":"2026-12-01T22:12:48.155253693Z","updated_at":"2026-12-01T22:12:48.155253693Z"}},"summary":"order ord_1a233aae79b42d679f090510","downstream_ref":"ord_1a233aae79b42d679f090510","first_seen_at":"2026-12-01T22:12:48.155253693Z","updated_at":"2026-12-01T22:12:48.155253693Z","completed_at":"2026-12-01T22:12:48.155253693Z","audit_seqs":[2214]}`

// format1Result is that record's saved result, byte for byte.
const format1Result = `{"confirmation":{"message_id":"msg_5692aeca501773d2b701af377fbe6802","state":"queued"},"order":{"order_id":"ord_1a233aae79b42d679f090510","version":1,"status":"placed","customer_id":"bench-ae625c83-1110","items":[{"sku":"coffee-1kg","quantity":1,"unit_price_minor":1850}],"currency":"EUR","total_minor":1850,"operation_key":"fffdec48-c172-4c3c-aad9-828fea60214c","created_at":"2026-12-01T22:12:48.155253693Z","updated_at":"2026-12-01T22:12:48.155253693Z"}}`

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestFormat1RecordDecodes: a record stored by the build before format 2
// decodes to what it held, its result byte for byte, and is stored again
// in format 2 with nothing lost.
func TestFormat1RecordDecodes(t *testing.T) {
	r, err := DecodeRecord([]byte(format1Record))
	if err != nil {
		t.Fatal(err)
	}
	if string(r.Result) != format1Result {
		t.Errorf("result = %s, want %s", r.Result, format1Result)
	}
	if r.Tenant != "default" || r.Key != "fffdec48-c172-4c3c-aad9-828fea60214c" || r.State != StateSucceeded ||
		r.ResultFormat != 1 || r.DownstreamRef != "ord_1a233aae79b42d679f090510" || len(r.AuditSeqs) != 1 || r.AuditSeqs[0] != 2214 {
		t.Errorf("decoded %+v", r)
	}
	if got := mustJSON(t, r); got != format1Record {
		t.Errorf("format-1 record decoded and marshalled again:\n got %s\nwant %s", got, format1Record)
	}
	v, err := EncodeRecord(r)
	if err != nil {
		t.Fatal(err)
	}
	again, err := DecodeRecord(v)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustJSON(t, again); got != format1Record {
		t.Errorf("stored again in format 2 and decoded:\n got %s\nwant %s", got, format1Record)
	}
	if len(v) > len(format1Record)*45/100 {
		t.Errorf("format 2 is %d bytes, format 1 %d: want at most 45 %%", len(v), len(format1Record))
	}
}

// TestRecordRoundTrip: every field of a record survives format 2, the
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
			Tenant: "t", Key: "k", State: StateSucceeded, ResultFormat: ResultFormat, Result: json.RawMessage(format1Result),
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

// TestFormat2RefusedByFormat1Reader: a build that reads format 1 only —
// its decoding was json.Unmarshal into Record, refusing a result format
// above 1 — refuses a format-2 record (ErrSchemaVersion there) rather
// than reading an empty one, and still finds the record's audit entries.
func TestFormat2RefusedByFormat1Reader(t *testing.T) {
	r := sampleRecord(t)
	for _, rec := range []*Record{r, {Tenant: "t", Key: "k", State: StateInProgress, AuditSeqs: []uint64{9}}} {
		v, err := EncodeRecord(rec)
		if err != nil {
			t.Fatal(err)
		}
		var old Record
		if err := json.Unmarshal(v, &old); err != nil {
			t.Fatalf("a format-2 record is not JSON to a format-1 reader: %v", err)
		}
		if old.ResultFormat <= 1 {
			t.Errorf("a format-1 reader sees result_format %d in %s: it would read the record as empty", old.ResultFormat, v)
		}
		var seqs struct {
			AuditSeqs []uint64 `json:"audit_seqs"`
		}
		if json.Unmarshal(v, &seqs); !slicesEqual(seqs.AuditSeqs, rec.AuditSeqs) {
			t.Errorf("audit_seqs as a format-1 reader finds them: %v, want %v", seqs.AuditSeqs, rec.AuditSeqs)
		}
	}
}

func slicesEqual(a, b []uint64) bool {
	return mustJSONQuiet(a) == mustJSONQuiet(b)
}

func mustJSONQuiet(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestNewerRecordFormatRefused: a record of a format above this build's,
// in the outer member or in a format-1 record, is ErrSchemaVersion.
func TestNewerRecordFormatRefused(t *testing.T) {
	z := deflateForTest(t, `{"tenant":"t","key":"k","state":"succeeded"}`)
	for name, v := range map[string]string{
		"outer":             `{"result_format":3,"z":"` + base64.StdEncoding.EncodeToString(z) + `"}`,
		"outer, keys moved": `{"z":"` + base64.StdEncoding.EncodeToString(z) + `","audit_seqs":[1],"result_format":3}`,
		"format 1":          `{"tenant":"t","key":"k","result_format":3}`,
		"inner":             `{"result_format":2,"z":"` + base64.StdEncoding.EncodeToString(deflateForTest(t, `{"tenant":"t","result_format":3}`)) + `"}`,
	} {
		if _, err := DecodeRecord([]byte(v)); !errors.Is(err, ErrSchemaVersion) {
			t.Errorf("%s: %v, want ErrSchemaVersion", name, err)
		}
	}
	v := `{"audit_seqs":[4],"result_format":2,"z":"` + base64.StdEncoding.EncodeToString(z) + `"}`
	if r, err := DecodeRecord([]byte(v)); err != nil || r.Key != "k" || len(r.AuditSeqs) != 1 || r.AuditSeqs[0] != 4 {
		t.Errorf("format 2 with its members in another order: %+v, %v", r, err)
	}
}

func deflateForTest(t testing.TB, plain string) []byte {
	var b bytes.Buffer
	w, err := zlib.NewWriterLevelDict(&b, zlib.BestCompression, []byte(recordDict))
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(plain))
	w.Close()
	return b.Bytes()
}

// TestDamagedRecordIsAnError: bytes that are not a record are an error
// (never ErrSchemaVersion, never a panic); a decompression that would
// exceed the bound stops there.
func TestDamagedRecordIsAnError(t *testing.T) {
	good, err := EncodeRecord(&Record{Tenant: "t", Key: "k", Result: json.RawMessage(format1Result)})
	if err != nil {
		t.Fatal(err)
	}
	var s storedRecord
	if err := json.Unmarshal(good, &s); err != nil {
		t.Fatal(err)
	}
	cut := `{"result_format":2,"z":"` + base64.StdEncoding.EncodeToString(s.Z[:len(s.Z)/2]) + `"}`
	flipped := bytes.Clone(s.Z)
	flipped[len(flipped)/3] ^= 0xff
	for name, v := range map[string]string{
		"empty":          "",
		"not JSON":       "\x00\xffnot json",
		"cut JSON":       string(good[:len(good)-3]),
		"format 1 cut":   format1Record[:100],
		"no z":           `{"result_format":2}`,
		"format 0":       `{"result_format":0,"z":""}`,
		"z not base64":   `{"result_format":2,"z":"%%%"}`,
		"z cut short":    cut,
		"z damaged":      `{"result_format":2,"z":"` + base64.StdEncoding.EncodeToString(flipped) + `"}`,
		"z not a record": `{"result_format":2,"z":"` + base64.StdEncoding.EncodeToString(deflateForTest(t, `[1,2]`)) + `"}`,
	} {
		if r, err := DecodeRecord([]byte(v)); err == nil {
			t.Errorf("%s: decoded %+v, want an error", name, r)
		} else if errors.Is(err, ErrSchemaVersion) {
			t.Errorf("%s: %v: damage is not a newer format", name, err)
		}
	}
	big := deflateForTest(t, `{"tenant":"`+strings.Repeat("a", 1<<16)+`"}`)
	if _, err := inflateRecord(big, 1<<10); err == nil || !strings.Contains(err.Error(), "more than 1024 bytes") {
		t.Errorf("inflating past the bound: %v", err)
	}
}

// TestRecordDictPinned: format 2's dictionary is part of the format; a
// change to it makes every stored format-2 record unreadable and needs a
// new format, not an edit.
func TestRecordDictPinned(t *testing.T) {
	sum := sha256.Sum256([]byte(recordDict))
	const want = "6c4feb6023c5da1bc16b234bf04aab91c865f26878f64739eb51688b18e19982"
	if got := hex.EncodeToString(sum[:]); got != want {
		t.Errorf("recordDict's SHA-256 is %s, want %s: the dictionary of format 2 must never change", got, want)
	}
}

// FuzzDecodeRecord: no input panics, and whatever decodes is stored again
// and decodes to the same record.
func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte(format1Record))
	if v, err := EncodeRecord(&Record{Tenant: "t", Key: "k", Result: json.RawMessage(format1Result), AuditSeqs: []uint64{3}}); err == nil {
		f.Add(v)
	}
	f.Add([]byte(`{"result_format":2,"z":""}`))
	f.Add([]byte(`{"result_format":2,"audit_seqs":[1,2],"z":"eJw="}`))
	f.Fuzz(func(t *testing.T, v []byte) {
		if fast, ok := parseStoredRecord(v); ok {
			var slow storedRecord
			if err := json.Unmarshal(v, &slow); err != nil || mustJSONQuiet(slow) != mustJSONQuiet(fast) {
				t.Fatalf("parseStoredRecord read %q as %+v; encoding/json: %+v, %v", v, fast, slow, err)
			}
		}
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

// sampleRecord is format1Record decoded: a finished create_order.
func sampleRecord(t testing.TB) *Record {
	t.Helper()
	r, err := DecodeRecord([]byte(format1Record))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// previousTombstone is sampleRecord's tombstone as the build before this
// one stored it (its own DEFLATE writer, fixed Huffman codes).
const previousTombstone = `{"result_format":2,"audit_seqs":[2214],"z":"eH1wkGLww5O60tLSUlKTTSx0kw3NjXRNko2TdRMTUyx1LYws0lITzQyMDE2SiUyBFoYmqeYpxqnJyclJloapaaZmFokphokp5pYmaYmmaclphqaWaSamySaWZommpkapJqbJBmnGBqaGlpapaalGaZSnYMNEI2PjxMRUc8skozTL1GRzwzQzM9M0UJgQn7Jz8pMTc3QT01PzQKFEZCIHpT4scYnkIBOjFDNzyzQDSwNTQ5CDsMYxHvUl+blJxSX5eamQ8ghbYjAy0zU00jUwDDEysjI0sjKx0DM0NTUyNTazNI7CTCgEVGMkIrzqawF4crl9"}`

// TestTombstoneEncoding: a tombstone stored by EncodeRecord, and one
// stored by the build before, decode to the tombstone.
func TestTombstoneEncoding(t *testing.T) {
	tomb := tombstone(sampleRecord(t))
	v, err := EncodeRecord(tomb)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string][]byte{"stored": v, "stored by the build before": []byte(previousTombstone)} {
		got, err := DecodeRecord(v)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if a, b := mustJSON(t, got), mustJSON(t, tomb); a != b {
			t.Errorf("%s, read back:\n got %s\nwant %s", name, a, b)
		}
	}
}
