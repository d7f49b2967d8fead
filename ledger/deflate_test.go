package ledger

import (
	"bytes"
	"compress/zlib"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
)

// inflateForTest decompresses z with compress/zlib and recordDict, as
// every format-2 reader does.
func inflateForTest(t testing.TB, z []byte) []byte {
	t.Helper()
	r, err := zlib.NewReaderDict(bytes.NewReader(z), []byte(recordDict))
	if err != nil {
		t.Fatalf("zlib header: %v", err)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("inflate: %v", err)
	}
	return out
}

// TestDeflateFixedRoundTrip: what deflateFixed writes, compress/zlib reads
// back byte for byte — matches into the dictionary, the longest matches
// (258), distances up to the window's 32 KB and past it.
func TestDeflateFixedRoundTrip(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 100_000)
	for i := range random {
		random[i] = byte(rnd.Uint32())
	}
	halfRandom := append(bytes.Clone(random[:40_000]), random[:40_000]...) // repeats at distance 40 000, beyond the window
	nearRepeat := append(bytes.Clone(random[:30_000]), random[:30_000]...) // repeats at distance 30 000
	cases := map[string]string{
		"empty":             "",
		"one byte":          "{",
		"three bytes":       `{"t`,
		"the dictionary":    recordDict,
		"dictionary twice":  recordDict + recordDict,
		"a run":             strings.Repeat("a", 10_000),
		"format-1 record":   format1Record,
		"dictionary's tail": recordDict[len(recordDict)-7:] + "Z\"}",
		"random":            string(random),
		"far repeat":        string(halfRandom),
		"near repeat":       string(nearRepeat),
		"every byte": func() string {
			var b []byte
			for i := range 512 {
				b = append(b, byte(i))
			}
			return string(b)
		}(),
	}
	for name, plain := range cases {
		t.Run(name, func(t *testing.T) {
			z := deflateFixed(nil, []byte(plain))
			if got := inflateForTest(t, z); !bytes.Equal(got, []byte(plain)) {
				t.Fatalf("round trip of %d bytes gave %d bytes, different", len(plain), len(got))
			}
		})
	}
}

// TestDeflateFixedSize: a tombstone compressed by deflateFixed is at most
// a fifth longer than compress/flate's at recordLevel, and less than two
// thirds of its JSON.
func TestDeflateFixedSize(t *testing.T) {
	r := sampleRecord(t)
	tomb := tombstone(r)
	flate, err := EncodeRecord(tomb)
	if err != nil {
		t.Fatal(err)
	}
	fixed, err := encodeTombstone(tomb)
	if err != nil {
		t.Fatal(err)
	}
	plain := mustJSON(t, tomb)
	t.Logf("tombstone: JSON %d bytes, stored by compress/flate %d, by deflateFixed %d", len(plain), len(flate), len(fixed))
	if len(fixed) > len(flate)*120/100 {
		t.Errorf("deflateFixed's tombstone is %d bytes, compress/flate's %d: want at most 120 %%", len(fixed), len(flate))
	}
	if len(fixed) > len(plain)*2/3 {
		t.Errorf("deflateFixed's tombstone is %d bytes, its JSON %d: want at most two thirds", len(fixed), len(plain))
	}
}

// TestTombstoneEncoding: a tombstone stored by encodeTombstone decodes to
// the same record as one stored by EncodeRecord.
func TestTombstoneEncoding(t *testing.T) {
	r := sampleRecord(t)
	r.AuditSeqs = []uint64{7, 9}
	tomb := tombstone(r)
	v, err := encodeTombstone(tomb)
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

// FuzzDeflateFixed: every input comes back from compress/zlib unchanged.
func FuzzDeflateFixed(f *testing.F) {
	f.Add([]byte(format1Record))
	f.Add([]byte(recordDict))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, plain []byte) {
		if got := inflateForTest(t, deflateFixed(nil, plain)); !bytes.Equal(got, plain) {
			t.Fatalf("round trip of %q gave %q", plain, got)
		}
	})
}
