package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
)

func TestCanonical(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"sorted keys, no whitespace", `{ "b": 1, "a": [ true, null ] }`, `{"a":[true,null],"b":1}`},
		{"number spellings", `[1, 1.0, 1e0, 10E-1, -0, 1e21, 0.000001, 1.5e-7]`, `[1,1,1,1,0,1e+21,0.000001,1.5e-7]`},
		{"keys sorted by UTF-16 code units", `{"\ud83d\ude00":1,"\ufb01":2,"a":3}`, `{"a":3,"😀":1,"ﬁ":2}`},
		{"no HTML escaping", `{"s":"<a&b>"}`, `{"s":"<a&b>"}`},
		{"escapes decoded, control characters escaped", `{"s":"\u00e9\t\u0001\/"}`, `{"s":"é\t\u0001/"}`},
		{"no Unicode normalization", `["é","e\u0301"]`, "[\"é\",\"e\u0301\"]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v any
			if err := json.Unmarshal([]byte(tt.in), &v); err != nil {
				t.Fatal(err)
			}
			got, err := Canonical(v)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("Canonical(%s) = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}

// TestFingerprintDefinition pins the definition: SHA-256 of the canonical
// {"arguments":…, "tool":…}. A change here invalidates every stored
// fingerprint, so it must be deliberate.
func TestFingerprintDefinition(t *testing.T) {
	fp, canon, err := Fingerprint("get_order", map[string]any{"order_id": "ord_1", "operation_key": testKey})
	if err != nil {
		t.Fatal(err)
	}
	const wantCanon = `{"arguments":{"order_id":"ord_1"},"tool":"get_order"}`
	if string(canon) != wantCanon {
		t.Errorf("canonical = %s, want %s", canon, wantCanon)
	}
	sum := sha256.Sum256([]byte(wantCanon))
	if fp != hex.EncodeToString(sum[:]) {
		t.Errorf("fingerprint = %s, want sha256 of the canonical form", fp)
	}
	const golden = "d931ffe6b82aff1ae9393f58e73e28f1c53c621475348442c589c94936f67aed"
	if fp != golden {
		t.Errorf("fingerprint = %s, want %s", fp, golden)
	}
	nilFP, _, _ := Fingerprint("new_operation_key", nil)
	emptyFP, _, _ := Fingerprint("new_operation_key", map[string]any{})
	if nilFP != emptyFP {
		t.Error("nil and empty arguments differ")
	}
}

func TestFingerprintEqual(t *testing.T) {
	v := mustNew(t)
	tests := []struct {
		name, tool, a, b string
	}{
		{"reordered keys", "create_order", validOrder,
			`{"currency":"EUR","items":[{"unit_price_minor":1250,"quantity":2,"sku":"SKU-1"},{"unit_price_minor":0,"sku":"SKU-2","quantity":1}],"customer_id":"cust-42","operation_key":"` + testKey + `"}`},
		{"whitespace", "create_order", validOrder, strings.NewReplacer(",", " ,\n\t", ":", " : ", "{", "{ ").Replace(validOrder)},
		{"1 vs 1.0 vs 1e0", "create_order",
			strings.Replace(validOrder, `"quantity":1,`, `"quantity":1.0,`, 1),
			strings.Replace(validOrder, `"quantity":1,`, `"quantity":1e0,`, 1)},
		{"1 vs 1.0", "create_order", validOrder, strings.Replace(validOrder, `"quantity":1,`, `"quantity":1.0,`, 1)},
		{"price 1250 vs 1.25e3", "create_order", validOrder, strings.Replace(validOrder, `1250`, `1.25e3`, 1)},
		{"omitted default vs explicit default", "create_order", validOrder, withField(validOrder, "notify_customer", true)},
		{"omitted limit vs limit 20", "list_orders", `{"customer_id":"c"}`, `{"customer_id":"c","limit":20}`},
		{"operation_key ignored", "create_order", validOrder, withField(validOrder, "operation_key", "0190a5b2-7c3e-7d4f-8a1b-2c3d4e5f6a7b")},
		{"string escapes", "get_order", `{"order_id":"ord_1"}`, `{"order_id":"\u006frd\u005f1"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := mustPrepare(t, v, tt.tool, tt.a)
			b := mustPrepare(t, v, tt.tool, tt.b)
			if a.Fingerprint != b.Fingerprint {
				t.Errorf("fingerprints differ:\n%s\n%s", a.Canonical, b.Canonical)
			}
		})
	}
}

func TestFingerprintDiffers(t *testing.T) {
	v := mustNew(t)
	base := mustPrepare(t, v, "create_order", validOrder)
	tests := []struct {
		name, args string
	}{
		{"customer", withField(validOrder, "customer_id", "cust-43")},
		{"currency", withField(validOrder, "currency", "USD")},
		{"quantity", strings.Replace(validOrder, `"quantity":2`, `"quantity":3`, 1)},
		{"price", strings.Replace(validOrder, `1250`, `1251`, 1)},
		{"sku case", strings.Replace(validOrder, `SKU-1`, `sku-1`, 1)},
		{"item order", strings.Replace(strings.Replace(strings.Replace(validOrder, `SKU-1`, `TMP`, 1), `SKU-2`, `SKU-1`, 1), `TMP`, `SKU-2`, 1)},
		{"notify false", withField(validOrder, "notify_customer", false)},
		{"empty note", withField(validOrder, "note", "")},
		{"note", withField(validOrder, "note", "ring twice")},
		{"NFD note vs NFC note", withField(validOrder, "note", "e\u0301")},
	}
	seen := map[string]string{base.Fingerprint: "base"}
	nfc := mustPrepare(t, v, "create_order", withField(validOrder, "note", "é"))
	seen[nfc.Fingerprint] = "NFC note"
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := mustPrepare(t, v, "create_order", tt.args)
			if other, dup := seen[req.Fingerprint]; dup {
				t.Errorf("fingerprint equals that of %s: %s", other, req.Canonical)
			}
			seen[req.Fingerprint] = tt.name
		})
	}
	t.Run("different tool", func(t *testing.T) {
		args := map[string]any{"customer_id": "c"}
		a, _, _ := Fingerprint("list_orders", args)
		b, _, _ := Fingerprint("get_order", args)
		if a == b {
			t.Error("tool name does not change the fingerprint")
		}
	})
}
