package schemas

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// goldenRequests are requests whose fingerprints are pinned below, as the
// encoding/json + jcs.Transform canonicalizer (the one before Canonical
// wrote JSON in one pass) computed them: every stored operation key
// carries such a fingerprint, and a retry whose fingerprint changed would
// be refused as a reuse of the key.
var goldenRequests = []struct {
	tool, args string
	want       string
}{
	{"create_order", validOrder, "ca37f9cc6092b03f1fb33e354ae50276fddd4dacbeb3e66f69f67a85cddb8406"},
	{"create_order", withField(validOrder, "notify_customer", false), "571d66ec031733234101af7a6c02ce391b2d373b58b3a001093fe59527118bc6"},
	{"create_order", strings.Replace(validOrder, `"quantity":2`, `"quantity":2.0e0`, 1), "ca37f9cc6092b03f1fb33e354ae50276fddd4dacbeb3e66f69f67a85cddb8406"},
	{"create_order", withField(validOrder, "note", "é e\u0301 😀 ﬁ <a&b> \"q\" \\ \t\n\u0001\u001f\u007f \u2028\u2029 \ufffd"), "e2f22a33ccb0fb6037b89e3b0c2b9472f851eb780fb61fc2cf5bb6b83f4f4d4a"},
	{"create_order", withField(withField(validOrder, "requested_delivery_date", "2027-01-31"),
		"ship_to", map[string]any{"name": "Zoë", "line1": "1 Rue d'Été", "city": "Paris", "postal_code": "75001", "country": "FR"}), "af6611f3a6cd7f303c707f8364b22f590f9c8bfcacf0c15b8e2db131226355d5"},
	{"create_order", strings.Replace(validOrder, `1250`, `99999999999`, 1), "8ff48ecaf71fef9e85808c0a14ac73d90cd680443341904c7008a38d2fd7d9e3"},
	{"send_notification", validNotification, "92496910483e6199265380ab8b0d4c0e5fa9ea0d742d8bece6cfed119021d38e"},
	{"send_notification", `{"operation_key":"` + testKey + `","channel":"sms","to":["+33600000000"],"body":"Ça va? 👍"}`, "d084b8da7a71e2221a772ded29511a665876e9ceb04cbf98a051efeca103aee7"},
	{"update_order", `{"operation_key":"` + testKey + `","order_id":"ord_1","expected_version":3,"changes":{"note":"x","items":[{"sku":"A","quantity":1,"unit_price_minor":5}]}}`, "ff4c69adba3fad6855ddcd574a9d1c475a794b7f4e1651ded7affa517d052ded"},
	{"cancel_order", `{"operation_key":"` + testKey + `","order_id":"ord_1","expected_version":1,"reason":"customer asked"}`, "ff1c6ded6f0feb46bfd4a53a9b09fe10e21bc521bc999f9121e41787ab9a32a5"},
	{"get_order", `{"order_id":"ord_1"}`, "d931ffe6b82aff1ae9393f58e73e28f1c53c621475348442c589c94936f67aed"},
	{"list_orders", `{"customer_id":"c"}`, "6529c1a80c42630e82c3e5c079d29043d785ba0b083bd16e0fb3146df9316444"},
	{"list_orders", `{"customer_id":"c","limit":1e2,"cursor":"abc"}`, "2e3912ea8ad27d057bfd88ba167db72f9c7ce73bf1a10f1caad5db5017e59104"},
	{"new_operation_key", `{}`, "23ff6212cef9c0dc75101bba164396bfb74c45435b46960b1c9ac8dc503457d2"},
	{"resolve_operation", `{"operation_key":"` + testKey + `","outcome":"succeeded","evidence":"seen in ERP","downstream_ref":"ord_9"}`, "90409fb7759d5ac1426b9a58795275ed533aedea0573445034f217609fb3cd9e"},
	{"decide_approval", `{"approval_id":"apr_0190a5b2-7c3e","decision":"approve","comment":"ok"}`, "02e30abbb518b5e555bb1e6c3b36641b3c9aefd6e95824b339d13310888bdbf4"},
}

// goldenValues are argument objects outside any schema, fingerprinted
// directly: the canonicalizer's corners (number spellings, escapes, key
// order by UTF-16 code units, nesting).
var goldenValues = []struct {
	args string
	want string
}{
	{`{"a":[1,2.5,-0,1e21,1e-7,0.000001,123456789012345678,{"b":null,"c":true}],"d":"\u00e9\ud83d\ude00<&>","":0}`, "e7886790a9b6edfd36c326e7e9ee82f5fb61d8c71b315e6421b759ff54ea4f33"},
	{`{"\ud83d\ude00":1,"\ufb01":2,"a":3,"A":4,"é":5,"operation_key":"x"}`, "83faf2f6a937bf83d0d98f79702532ec7c32b03b1998d00f098af197030fd7e4"},
	{`{"n":[0.1,1.5e300,-1.5e-300,5e-324,1.7976931348623157e308,9007199254740993,100000000000000000000000]}`, "3de903a231e5d0ee9532c4a899b720bf27ea888205023d7c679329405b06f81c"},
	{`{"s":"\b\f\n\r\t\u0000\u001e\"\\/\u00ff\u0800\uffff"}`, "107aa9844815e2294d8d16b04476efcae9da8bbe2e8afcad5b47b4b50edc5766"},
	{`{"x":{"y":{"z":[[[]],{}]}}}`, "55e24024113abc1e59d48bc2b23bbc0a4b381b2ed6c6f66f74e9d2fabca0b1e7"},
}

func TestFingerprintsUnchanged(t *testing.T) {
	v := mustNew(t)
	print := os.Getenv("IDEMGATE_PRINT_GOLDEN") != ""
	for i, g := range goldenRequests {
		req, err := v.Prepare(g.tool, []byte(g.args))
		if err != nil {
			t.Fatalf("request %d (%s): %v", i, g.tool, err)
		}
		if print {
			fmt.Printf("request %d %s\n", i, req.Fingerprint)
			continue
		}
		if req.Fingerprint != g.want {
			t.Errorf("request %d (%s): fingerprint %s, want %s\ncanonical: %s", i, g.tool, req.Fingerprint, g.want, req.Canonical)
		}
	}
	for i, g := range goldenValues {
		m, ok := decodeObject([]byte(g.args))
		if !ok {
			t.Fatalf("value %d does not decode", i)
		}
		fp, canon, err := Fingerprint("golden", m)
		if err != nil {
			t.Fatalf("value %d: %v", i, err)
		}
		if print {
			fmt.Printf("value %d %s %s\n", i, fp, canon)
			continue
		}
		if fp != g.want {
			t.Errorf("value %d: fingerprint %s, want %s\ncanonical: %s", i, fp, g.want, canon)
		}
	}
}
