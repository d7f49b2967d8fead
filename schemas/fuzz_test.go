package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"regexp"
	"strconv"
	"testing"
	"unicode/utf16"
)

var fuzzSeeds = []string{
	validOrder,
	validNotification,
	`{"customer_id":"c","limit":20}`,
	`{"order_id":"ord_1"}`,
	`{"operation_key":"` + testKey + `"}`,
	`{}`,
	`{"a":[1,2.5,-0,1e21,{"b":null,"c":true}],"d":"\u00e9\ud83d\ude00<&>","":0}`,
	`{"customer_id":"c","limit":1e400}`,
	`{"x":"` + "\xff\xfe" + `"}`,
	`[]`,
	`null`,
}

// decodeObject decodes data as a JSON object with exact numbers.
func decodeObject(data []byte) (map[string]any, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil || dec.More() {
		return nil, false
	}
	return m, true
}

var plainInteger = regexp.MustCompile(`^-?[0-9]+$`)

// reserialize writes v as JSON with shuffled keys, random whitespace,
// random \u escapes and integers spelled as floats.
func reserialize(buf *bytes.Buffer, v any, rng *rand.Rand) {
	space := func() {
		for rng.Intn(3) == 0 {
			buf.WriteByte(" \t\n\r"[rng.Intn(4)])
		}
	}
	space()
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			space()
			writeString(buf, k, rng)
			space()
			buf.WriteByte(':')
			reserialize(buf, v[k], rng)
		}
		space()
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			reserialize(buf, e, rng)
		}
		space()
		buf.WriteByte(']')
	case string:
		writeString(buf, v, rng)
	case json.Number:
		s := string(v)
		if plainInteger.MatchString(s) {
			switch rng.Intn(5) {
			case 1:
				s += ".0"
			case 2:
				s += "e0"
			case 3:
				s += ".000E+0"
			case 4:
				if s != "0" && s != "-0" { // 00e-1 is not JSON
					s += "0e-1"
				}
			}
		}
		buf.WriteString(s)
	default:
		b, _ := json.Marshal(v)
		buf.Write(b)
	}
	space()
}

func writeString(buf *bytes.Buffer, s string, rng *rand.Rand) {
	buf.WriteByte('"')
	for _, r := range s {
		if rng.Intn(4) == 0 {
			for _, u := range utf16.Encode([]rune{r}) {
				fmt.Fprintf(buf, `\u%04x`, u)
			}
			continue
		}
		b, _ := json.Marshal(string(r))
		buf.Write(b[1 : len(b)-1])
	}
	buf.WriteByte('"')
}

// FuzzFingerprintStable: re-serializing the same object (key order,
// whitespace, escapes, integer spellings) never changes its fingerprint,
// neither through Fingerprint nor through Prepare.
func FuzzFingerprintStable(f *testing.F) {
	for i, s := range fuzzSeeds {
		f.Add([]byte(s), int64(i))
	}
	v := mustNew(f)
	f.Fuzz(func(t *testing.T, data []byte, seed int64) {
		m, ok := decodeObject(data)
		if !ok {
			return
		}
		want, _, err := Fingerprint("create_order", m)
		if err != nil {
			return // numbers beyond float64 have no canonical form
		}
		var buf bytes.Buffer
		reserialize(&buf, m, rand.New(rand.NewSource(seed)))
		m2, ok := decodeObject(buf.Bytes())
		if !ok {
			t.Fatalf("reserialized JSON does not decode: %s", buf.Bytes())
		}
		got, canon, err := Fingerprint("create_order", m2)
		if err != nil || got != want {
			_, wantCanon, _ := Fingerprint("create_order", m)
			t.Fatalf("fingerprint changed (%v):\n%s\n%s\nfrom %s", err, wantCanon, canon, buf.Bytes())
		}
		for _, tool := range v.Tools() {
			a, err := v.Prepare(tool, json.RawMessage(data))
			if err != nil {
				continue
			}
			b, err := v.Prepare(tool, json.RawMessage(buf.Bytes()))
			if err != nil || a.Fingerprint != b.Fingerprint {
				t.Fatalf("%s: Prepare of reserialized arguments = %v, %v; want fingerprint %s\n%s", tool, b, err, a.Fingerprint, buf.Bytes())
			}
		}
	})
}

// leaf is a scalar inside a decoded object and a way to replace it.
type leaf struct {
	value any
	set   func(any)
}

func leaves(v any, top bool, out []leaf) []leaf {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if top && k == "operation_key" {
				continue // excluded from the fingerprint by definition
			}
			switch e.(type) {
			case map[string]any, []any:
				out = leaves(e, false, out)
			default:
				out = append(out, leaf{e, func(n any) { v[k] = n }})
			}
		}
	case []any:
		for i, e := range v {
			switch e.(type) {
			case map[string]any, []any:
				out = leaves(e, false, out)
			default:
				out = append(out, leaf{e, func(n any) { v[i] = n }})
			}
		}
	}
	return out
}

// FuzzFingerprintChanges: changing any one leaf value (other than the
// top-level operation_key) changes the fingerprint.
func FuzzFingerprintChanges(f *testing.F) {
	for i, s := range fuzzSeeds {
		f.Add([]byte(s), uint16(i))
	}
	f.Fuzz(func(t *testing.T, data []byte, pick uint16) {
		m, ok := decodeObject(data)
		if !ok {
			return
		}
		before, beforeCanon, err := Fingerprint("create_order", m)
		if err != nil {
			return
		}
		ls := leaves(m, true, nil)
		if len(ls) == 0 {
			return
		}
		l := ls[int(pick)%len(ls)]
		switch x := l.value.(type) {
		case string:
			l.set(x + "x")
		case bool:
			l.set(!x)
		case nil:
			l.set(false)
		case json.Number:
			n, err := strconv.ParseFloat(string(x), 64)
			if err != nil {
				return
			}
			n += math.Max(1, math.Abs(n))
			if math.IsInf(n, 0) {
				return
			}
			l.set(json.Number(strconv.FormatFloat(n, 'g', -1, 64)))
		}
		after, afterCanon, err := Fingerprint("create_order", m)
		if err != nil {
			t.Fatalf("Fingerprint after mutation: %v", err)
		}
		if after == before {
			t.Fatalf("mutation did not change the fingerprint:\n%s\n%s", beforeCanon, afterCanon)
		}
	})
}

// FuzzPrepareNoPanic: any bytes given to Prepare, for any tool, either
// succeed or yield a bounded *ValidationError; successes are fixed points.
func FuzzPrepareNoPanic(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	v := mustNew(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, tool := range v.Tools() {
			req, err := v.Prepare(tool, json.RawMessage(data))
			if err != nil {
				var verr *ValidationError
				if !errors.As(err, &verr) {
					t.Fatalf("%s: Prepare = %T %v, want *ValidationError", tool, err, err)
				}
				if len(verr.Problems) == 0 || len(verr.Problems) > maxProblems {
					t.Fatalf("%s: %d problems", tool, len(verr.Problems))
				}
				for _, p := range verr.Problems {
					if p.Message == "" || len(p.Message) > 1024 || len(p.Path) > 1024 {
						t.Fatalf("%s: unbounded problem %q: %.200q", tool, p.Path, p.Message)
					}
				}
				continue
			}
			again, err := v.Prepare(tool, req.Args)
			if err != nil || again.Fingerprint != req.Fingerprint {
				t.Fatalf("%s: Prepare(Args) = %v, %v; want fingerprint %s", tool, again, err, req.Fingerprint)
			}
		}
		if err := v.ValidateResult(json.RawMessage(data)); err != nil {
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("ValidateResult = %T %v", err, err)
			}
		}
	})
}

// oldFingerprint is Fingerprint as it was defined before Canonical wrote
// JSON in one pass: the envelope built as a map, encoding/json, then
// jcs.Transform.
func oldFingerprint(tool string, args map[string]any) ([]byte, error) {
	business := make(map[string]any, len(args))
	for k, v := range args {
		if k != "operation_key" {
			business[k] = v
		}
	}
	return canonicalByMarshal(map[string]any{"tool": tool, "arguments": business})
}

// sameCanonical fails t unless the one-pass canonical form and the
// encoding/json + jcs.Transform one agree: the same bytes, or both an
// error.
func sameCanonical(t *testing.T, what string, got, want []byte, gotErr, wantErr error) {
	t.Helper()
	if (gotErr != nil) != (wantErr != nil) || !bytes.Equal(got, want) {
		t.Fatalf("%s: one pass = %q, %v; by encoding/json and jcs = %q, %v", what, got, gotErr, want, wantErr)
	}
}

// FuzzCanonicalOnePass: Canonical and Fingerprint write exactly the bytes
// of their definition (encoding/json, then jcs.Transform) — or fail where
// it fails — for decoded JSON with exact numbers, with float64 numbers,
// and for Go strings and keys holding invalid UTF-8. A difference would
// change stored fingerprints, and every retry of a stored key would be
// refused.
func FuzzCanonicalOnePass(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	for _, g := range goldenRequests {
		f.Add([]byte(g.args))
	}
	for _, g := range goldenValues {
		f.Add([]byte(g.args))
	}
	f.Add([]byte("{\"\xff\":1,\"\xfe\":2}"))
	f.Add([]byte(`[1e400, 1e-400, -0.0, 0.1e1, 12345678901234567890]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var exact any
		if dec.Decode(&exact) == nil {
			got, gerr := Canonical(exact)
			want, werr := canonicalByMarshal(exact)
			sameCanonical(t, "json.Number", got, want, gerr, werr)
			if m, ok := exact.(map[string]any); ok {
				_, got, gerr := Fingerprint("tool", m)
				want, werr := oldFingerprint("tool", m)
				sameCanonical(t, "Fingerprint", got, want, gerr, werr)
			}
		}
		var floats any
		if json.Unmarshal(data, &floats) == nil {
			got, gerr := Canonical(floats)
			want, werr := canonicalByMarshal(floats)
			sameCanonical(t, "float64", got, want, gerr, werr)
		}
		// The raw bytes as Go strings: keys and values that may hold
		// invalid UTF-8 and any control character.
		m := map[string]any{}
		var list []any
		for _, piece := range bytes.Split(data, []byte{','}) {
			m[string(piece)] = string(piece)
			list = append(list, string(piece), json.Number(piece))
		}
		got, gerr := Canonical(m)
		want, werr := canonicalByMarshal(m)
		sameCanonical(t, "raw strings", got, want, gerr, werr)
		got, gerr = Canonical(list)
		want, werr = canonicalByMarshal(list)
		sameCanonical(t, "raw strings and numbers", got, want, gerr, werr)
		_, got, gerr = Fingerprint(string(data), m)
		want, werr = oldFingerprint(string(data), m)
		sameCanonical(t, "raw Fingerprint", got, want, gerr, werr)
	})
}
