package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// screenOf screens raw arguments read by a json.Decoder.
func screenOf(v *Validator, tool, raw string) *Screened {
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.UseNumber()
	return v.Screen(tool, dec)
}

// TestScreenRefusesWhatPrepareRefuses: every problem Screen reports is one
// Prepare reports for the same arguments, in the same words, and Screen
// lets through what Prepare accepts.
func TestScreenRefusesWhatPrepareRefuses(t *testing.T) {
	v := mustNew(t)
	order := func(extra string) string {
		return `{"operation_key":"` + testKey + `","customer_id":"c1","items":[{"sku":"a","quantity":1,"unit_price_minor":1}],"currency":"USD"` + extra + `}`
	}
	notify := `{"operation_key":"` + testKey + `","channel":"pager","to":["a@example.com"],"body":"hi"}`
	cases := []struct {
		name, tool, args string
		want             []string // Screen's problems; none: nil
	}{
		{"valid", "create_order", order(""), nil},
		{"null", "create_order", `null`, nil},
		{"note an array", "create_order", order(`,"note":[1,2,3]`), []string{"note: must be a string, got array"}},
		{"note a number", "create_order", order(`,"note":1.5`), []string{"note: must be a string, got 1.5"}},
		{"note too long", "create_order", order(`,"note":"` + strings.Repeat("é", 1001) + `"`), []string{"note: must be at most 1000 characters (got 1001)"}},
		{"unknown member", "create_order", order(`,"notes":{"x":[1]}`), []string{`unknown property "notes" (allowed: customer_id, items, currency, ship_to, requested_delivery_date, note, notify_customer, operation_key)`}},
		{"too many items", "create_order", `{"items":[` + strings.Repeat(`{"sku":"a","quantity":1,"unit_price_minor":1},`, 100) + `{"x":1}]}`, []string{"items: must contain at most 100 items (got 101)"}},
		{"nested", "create_order", order(`,"ship_to":{"name":["n"],"city":{}}`), []string{"ship_to.city: must be a string, got object", "ship_to.name: must be a string, got array"}},
		{"not an object", "create_order", `[1,2]`, []string{"arguments must be an object, got array"}},
		{"quantity a string", "create_order", `{"items":[{"quantity":"2"}]}`, []string{"items[0].quantity: must be an integer, got string"}},
		{"enum", "send_notification", notify, []string{`channel: must be one of email, sms, webhook (got "pager")`}},
		{"left to Prepare", "create_order", `{"currency":"usd","items":[]}`, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sc := screenOf(v, c.tool, c.args)
			var got []string
			if sc != nil {
				for _, p := range sc.Err.Problems {
					got = append(got, p.String())
				}
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("Screen problems = %q, want %q", got, c.want)
			}
			_, err := v.Prepare(c.tool, json.RawMessage(c.args))
			var all []string
			if ve, ok := err.(*ValidationError); ok {
				for _, p := range ve.Problems {
					all = append(all, p.String())
				}
			}
			for _, p := range got {
				if !slices.Contains(all, p) {
					t.Errorf("Screen reports %q, Prepare does not (Prepare: %q)", p, all)
				}
			}
			if c.want == nil && c.name == "valid" && err != nil {
				t.Errorf("Prepare refuses the valid arguments: %v", err)
			}
		})
	}
}

// TestScreenPrepare: Prepare given what Screen refused returns its
// problems, and Screen notes the operation key for the refusal.
func TestScreenPrepare(t *testing.T) {
	v := mustNew(t)
	sc := screenOf(v, "create_order", `{"operation_key":"`+testKey+`","note":[1]}`)
	if sc == nil || sc.OperationKey != testKey {
		t.Fatalf("Screen = %+v, want a refusal under %s", sc, testKey)
	}
	_, err := v.Prepare("create_order", sc)
	if err != sc.Err {
		t.Fatalf("Prepare(Screened) = %v, want its own error %v", err, sc.Err)
	}
}

// TestScreenLarge: a wide array is refused at its type, without reading
// it into memory, and an array over maxItems reports its whole count;
// the problems kept are bounded.
func TestScreenLarge(t *testing.T) {
	v := mustNew(t)
	var b bytes.Buffer
	b.WriteString(`{"note":[`)
	for i := range 1_000_000 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('1')
	}
	b.WriteString(`]}`)
	sc := screenOf(v, "create_order", b.String())
	if sc == nil || sc.Err.Error() != "note: must be a string, got array" {
		t.Fatalf("Screen = %+v", sc)
	}
	var many strings.Builder
	many.WriteString(`{`)
	for i := range 500 {
		if i > 0 {
			many.WriteByte(',')
		}
		many.WriteString(`"x` + strconv.Itoa(i) + `":1`)
	}
	many.WriteString(`}`)
	sc = screenOf(v, "create_order", many.String())
	if sc == nil || len(sc.Err.Problems) != maxProblems || sc.Err.Omitted != 480 {
		t.Fatalf("500 unknown members: %d problems, %d omitted; want %d and 480", len(sc.Err.Problems), sc.Err.Omitted, maxProblems)
	}
}

// FuzzScreenAgreesWithPrepare: for any arguments of any tool, what
// Screen refuses Prepare refuses too — the screen never refuses a valid
// call, it only says sooner what validation would say. (That it says it in
// Prepare's words is TestScreenRefusesWhatPrepareRefuses's: Prepare stops
// at a number it cannot read, say, before the schema's problems.)
func FuzzScreenAgreesWithPrepare(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"note":[1,2,3],"items":[{"quantity":"2"}],"ship_to":{"name":["n"]},"notes":{}}`))
	f.Add([]byte(`{"channel":"pager","to":"x","operation_key":7}`))
	v := mustNew(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		if !json.Valid(data) || repeatsMember(data) {
			return // the envelope walk refuses such a message before any screen
		}
		for _, tool := range v.Tools() {
			sc := screenOf(v, tool, string(data))
			if sc == nil {
				continue
			}
			_, err := v.Prepare(tool, json.RawMessage(data))
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("%s: Screen refuses %.200q (%v), Prepare = %v", tool, data, sc.Err, err)
			}
		}
	})
}

// repeatsMember reports whether an object of data (valid JSON) has two
// members whose names are equal ignoring case: the envelope walk refuses
// those messages, tool arguments included, before any screen reads them.
func repeatsMember(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		object  bool
		wantKey bool
		names   map[string]bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.wantKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].object {
					stack[len(stack)-1].wantKey = true
				}
				continue
			}
			name := strings.ToLower(tok.(string))
			if top.names[name] {
				return true
			}
			top.names[name] = true
			top.wantKey = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, wantKey: true, names: map[string]bool{}})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].wantKey = true
		}
	}
}
