package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
)

func TestNestingDepth(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{``, 0},
		{`1`, 0},
		{`{}`, 1},
		{`[[],[[]]]`, 3},
		{`{"a":{"b":[1,{"c":2}]}}`, 4},
		{`"[[[[["`, 0},
		{`["\"[[[", "\\", [1]]`, 2},
		{`]]]][`, 1},
	}
	for _, tt := range tests {
		if got := NestingDepth([]byte(tt.in), 100); got != tt.want {
			t.Errorf("NestingDepth(%s) = %d, want %d", tt.in, got, tt.want)
		}
	}
	if got := NestingDepth([]byte(strings.Repeat("[", 1000)), 5); got != 6 {
		t.Errorf("NestingDepth stops at max+1: got %d, want 6", got)
	}
}

// deepOrder is create_order arguments whose "items" is an array nested
// depth levels deep (the arguments object adds one more).
func deepOrder(depth int) string {
	return `{"operation_key":"` + testKey + `","customer_id":"c","currency":"EUR","items":` +
		strings.Repeat("[", depth) + "1" + strings.Repeat("]", depth) + `}`
}

func TestPrepareRefusesDeepArguments(t *testing.T) {
	v := mustNew(t)
	for _, depth := range []int{MaxDepth, MaxDepth + 1, 9000} {
		raw := deepOrder(depth) // the arguments object is one more level
		var doc any
		if err := json.Unmarshal([]byte(raw), &doc); err != nil {
			t.Fatal(err)
		}
		for name, args := range map[string]any{"raw": json.RawMessage(raw), "decoded": doc} {
			_, err := v.Prepare("create_order", args)
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("depth %d %s: %v, want a ValidationError", depth, name, err)
			}
			if !strings.Contains(err.Error(), "more than 32 levels deep") {
				t.Errorf("depth %d %s: %v, want the depth limit named", depth, name, err)
			}
		}
	}
	// At the limit the arguments are validated as usual.
	_, err := v.Prepare("create_order", json.RawMessage(deepOrder(MaxDepth-1)))
	if err == nil || strings.Contains(err.Error(), "levels deep") {
		t.Errorf("depth %d: %v, want a schema error, not the depth limit", MaxDepth-1, err)
	}
}

// allocated returns the bytes allocated by fn (best of 3 runs, so a
// concurrent goroutine of the test binary does not inflate it).
func allocated(fn func()) uint64 {
	best := ^uint64(0)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		fn()
		runtime.ReadMemStats(&after)
		best = min(best, after.TotalAlloc-before.TotalAlloc)
	}
	return best
}

// TestPrepareMemoryLinear: a request of N bytes costs O(N) memory,
// however deep it nests. Before the path stack was shared, checkNumbers
// copied the path at every level: 9 000 levels took over 500 MB.
func TestPrepareMemoryLinear(t *testing.T) {
	v := mustNew(t)
	// fixed covers the per-call overhead of schema validation and error
	// rendering; perByte what each further byte of the request may cost.
	const fixed, perByte = 256 << 10, 64
	for _, depth := range []int{10, 100, 1000, 9000} {
		raw := deepOrder(depth)
		var doc any
		if err := json.Unmarshal([]byte(raw), &doc); err != nil {
			t.Fatal(err)
		}
		for name, args := range map[string]any{"raw": json.RawMessage(raw), "decoded": doc} {
			got := allocated(func() { v.Prepare("create_order", args) })
			if limit := uint64(fixed + perByte*len(raw)); got > limit {
				t.Errorf("depth %d (%d bytes) %s: allocated %d bytes, want at most %d", depth, len(raw), name, got, limit)
			}
			t.Logf("depth %5d, %6d bytes, %s: %8d bytes allocated", depth, len(raw), name, got)
		}
	}
}

// TestCheckNumbersLinear: the number walk itself is linear in the size of
// the value, whatever its depth (Prepare never gives it more than
// MaxDepth levels, but the walk must not rely on that).
func TestCheckNumbersLinear(t *testing.T) {
	for _, depth := range []int{10, 100, 1000, 9000} {
		var doc any = json.Number(strings.Repeat("9", 400)) // too long: one problem at the bottom
		for range depth {
			doc = []any{doc}
		}
		var ps []problem
		got := allocated(func() {
			var loc []pathElem
			ps = checkNumbers(doc, &loc, nil)
		})
		if len(ps) != 1 || len(ps[0].loc) != depth {
			t.Fatalf("depth %d: problems %d, want 1 at depth %d", depth, len(ps), depth)
		}
		// The path stack, the one problem's copy of it, and append's
		// doubling: a few pathElems per level.
		if limit := uint64(4096 + 512*depth); got > limit {
			t.Errorf("depth %d: allocated %d bytes, want at most %d", depth, got, limit)
		}
		t.Logf("depth %5d: %8d bytes allocated", depth, got)
	}
	// Wide values too: one problem per number.
	wide := make([]any, 10000)
	for i := range wide {
		wide[i] = json.Number("1e999")
	}
	var loc []pathElem
	if ps := checkNumbers(map[string]any{"a": wide}, &loc, nil); len(ps) != len(wide) || renderPath(ps[9999].loc) != "a[9999]" {
		t.Errorf("wide: %d problems", len(ps))
	}
}

// FuzzNestingDepthAgreesWithDecoder: the byte scan measures the same depth
// as a real JSON decoder on valid JSON.
func FuzzNestingDepthAgreesWithDecoder(f *testing.F) {
	for _, s := range []string{`[]`, `{"a":[{"b":"]]"}]}`, `"[\"["`, `[[1],[[2]]]`, `{"\\":{}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		if !json.Valid(msg) {
			return
		}
		dec := json.NewDecoder(bytes.NewReader(msg))
		dec.UseNumber() // valid JSON may hold numbers beyond float64
		depth, deepest := 0, 0
		for {
			tok, err := dec.Token()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("valid JSON: %v", err)
			}
			switch tok {
			case json.Delim('['), json.Delim('{'):
				depth++
				deepest = max(deepest, depth)
			case json.Delim(']'), json.Delim('}'):
				depth--
			}
		}
		if got := NestingDepth(msg, 1<<30); got != deepest {
			t.Fatalf("NestingDepth(%s) = %d, decoder says %d", msg, got, deepest)
		}
	})
}

// TestPrepareRefusesCaseVariantNames: our own decoding cannot be fooled by
// a name differing only in case (encoding/json would match "Customer_ID"
// to the customer_id field): every schema refuses properties it does not
// declare, so the arguments handed to Request.Decode only ever hold the
// exact names. The transport refuses such duplicates earlier; this is the
// second line.
func TestPrepareRefusesCaseVariantNames(t *testing.T) {
	v := mustNew(t)
	checked := 0
	for _, tool := range v.Tools() {
		for _, prop := range v.info[v.tools[tool].Location].props {
			checked++
			variant := strings.ToUpper(prop[:1]) + prop[1:]
			args := `{"` + variant + `":"x"}`
			_, err := v.Prepare(tool, json.RawMessage(args))
			if err == nil || !strings.Contains(err.Error(), variant) {
				t.Errorf("%s %s: %v, want %q refused", tool, args, err, variant)
			}
		}
	}
	if checked < len(v.Tools()) {
		t.Fatalf("only %d properties checked", checked)
	}
	bad := strings.Replace(validOrder, `"sku":"SKU-1"`, `"sku":"SKU-1","SKU":"SKU-9"`, 1)
	if _, err := v.Prepare("create_order", json.RawMessage(bad)); err == nil || !strings.Contains(err.Error(), "SKU") {
		t.Errorf("item with sku and SKU: %v, want SKU refused", err)
	}
}
