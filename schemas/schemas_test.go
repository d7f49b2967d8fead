package schemas

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
)

// testKey is a random v4 UUID that appears in no documentation.
const testKey = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"

func mustNew(t testing.TB) *Validator {
	t.Helper()
	v, err := New()
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return v
}

// mustPrepare prepares raw JSON arguments and fails the test on error.
func mustPrepare(t testing.TB, v *Validator, tool, args string) *Request {
	t.Helper()
	req, err := v.Prepare(tool, json.RawMessage(args))
	if err != nil {
		t.Fatalf("Prepare(%s, %s): %v", tool, args, err)
	}
	return req
}

const validOrder = `{"operation_key":"` + testKey + `","customer_id":"cust-42",
	"items":[{"sku":"SKU-1","quantity":2,"unit_price_minor":1250},{"sku":"SKU-2","quantity":1,"unit_price_minor":0}],
	"currency":"EUR"}`

const validNotification = `{"operation_key":"` + testKey + `","channel":"email",
	"to":["ada@example.com"],"subject":"Your order","body":"Thanks!","order_id":"ord_1"}`

func TestTools(t *testing.T) {
	v := mustNew(t)
	got := v.Tools()
	want := []string{"cancel_order", "create_order", "decide_approval", "get_operation_status", "get_order", "list_orders", "list_pending_approvals", "new_operation_key", "reconcile_operation", "resolve_operation", "send_notification", "update_order"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Tools() = %v, want %v", got, want)
	}
	for _, tool := range got {
		raw, ok := InputSchema(tool)
		if !ok || !json.Valid(raw) {
			t.Errorf("InputSchema(%q) = valid JSON? %v, ok %v", tool, json.Valid(raw), ok)
		}
	}
	for _, tool := range []string{"", "result", "nope", "../schemas/result", "create_order.json"} {
		if _, ok := InputSchema(tool); ok {
			t.Errorf("InputSchema(%q) ok, want no schema", tool)
		}
	}
	if !json.Valid(OutputSchema()) {
		t.Error("OutputSchema is not valid JSON")
	}
}

// TestSchemaRules checks the house rules of every input schema: closed
// objects, bounded strings, arrays and integers, a description on every
// property, and the operation key contract on side-effecting tools.
func TestSchemaRules(t *testing.T) {
	v := mustNew(t)
	for _, tool := range v.Tools() {
		t.Run(tool, func(t *testing.T) {
			raw, _ := InputSchema(tool)
			var root map[string]any
			if err := json.Unmarshal(raw, &root); err != nil {
				t.Fatal(err)
			}
			if root["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
				t.Errorf("$schema = %v", root["$schema"])
			}
			checkSchema(t, tool, root)
		})
	}
	for _, tool := range []string{"create_order", "send_notification"} {
		raw, _ := InputSchema(tool)
		var root struct {
			Required   []string
			Properties map[string]struct {
				Type, Format, Description string
			}
		}
		if err := json.Unmarshal(raw, &root); err != nil {
			t.Fatal(err)
		}
		key := root.Properties["operation_key"]
		if key.Type != "string" || key.Format != "uuid" {
			t.Errorf("%s: operation_key is %s/%s, want string/uuid", tool, key.Type, key.Format)
		}
		for _, phrase := range []string{"ONE key per", "new_operation_key", "reuse it on every retry", "Never mint a new key because a call failed or timed out"} {
			if !strings.Contains(key.Description, phrase) {
				t.Errorf("%s: operation_key description lacks %q", tool, phrase)
			}
		}
		if !contains(root.Required, "operation_key") {
			t.Errorf("%s: operation_key is not required", tool)
		}
	}
}

func checkSchema(t *testing.T, at string, s map[string]any) {
	t.Helper()
	const maxExact = 1 << 53
	switch s["type"] {
	case "object":
		if s["additionalProperties"] != false {
			t.Errorf("%s: additionalProperties is not false", at)
		}
		props, _ := s["properties"].(map[string]any)
		for name, p := range props {
			ps := p.(map[string]any)
			if d, _ := ps["description"].(string); len(d) < 10 {
				t.Errorf("%s.%s: no description", at, name)
			}
			checkSchema(t, at+"."+name, ps)
		}
		required, _ := s["required"].([]any)
		for _, r := range required {
			if _, ok := props[r.(string)]; !ok {
				t.Errorf("%s: required %q is not a property", at, r)
			}
		}
	case "array":
		if _, ok := s["maxItems"]; !ok {
			t.Errorf("%s: array without maxItems", at)
		}
		checkSchema(t, at+"[]", s["items"].(map[string]any))
	case "string":
		_, bounded := s["maxLength"]
		_, enum := s["enum"] // an enum bounds a string more tightly still
		if !bounded && !enum {
			t.Errorf("%s: string without maxLength", at)
		}
	case "integer":
		lo, okLo := s["minimum"].(float64)
		hi, okHi := s["maximum"].(float64)
		if !okLo || !okHi || math.Abs(lo) > maxExact || math.Abs(hi) > maxExact {
			t.Errorf("%s: integer bounds %v..%v, want both set within ±2^53", at, s["minimum"], s["maximum"])
		}
	case "boolean":
	default:
		t.Errorf("%s: unexpected type %v", at, s["type"])
	}
}

func TestEveryPatternHasAHint(t *testing.T) {
	v := mustNew(t)
	for _, tool := range v.Tools() {
		raw, _ := InputSchema(tool)
		var walk func(x any)
		walk = func(x any) {
			switch x := x.(type) {
			case map[string]any:
				if p, ok := x["pattern"].(string); ok {
					if _, ok := patternHints[p]; !ok {
						t.Errorf("%s: pattern %q has no hint in patternHints", tool, p)
					}
				}
				for _, e := range x {
					walk(e)
				}
			case []any:
				for _, e := range x {
					walk(e)
				}
			}
		}
		var doc any
		_ = json.Unmarshal(raw, &doc)
		walk(doc)
	}
}

func TestPrepareAccepts(t *testing.T) {
	v := mustNew(t)
	tests := []struct {
		name, tool, args string
		wantKey          string
	}{
		{"create_order minimal", "create_order", validOrder, testKey},
		{"create_order full", "create_order", `{"operation_key":"` + testKey + `","customer_id":"acme:eu.7_x-1",
			"items":[{"sku":"A","quantity":10000,"unit_price_minor":100000000000}],"currency":"JPY",
			"ship_to":{"name":"Ada","line1":"1 Main St","line2":"","city":"Springfield","region":"","postal_code":"12345","country":"US"},
			"requested_delivery_date":"2025-03-31","note":"","notify_customer":false}`, testKey},
		{"create_order float forms of integers", "create_order", `{"operation_key":"` + testKey + `","customer_id":"c",
			"items":[{"sku":"A","quantity":1.0,"unit_price_minor":1e2}],"currency":"USD"}`, testKey},
		{"create_order 100 items", "create_order", orderWithItems(100, 1), testKey},
		{"create_order note of 1000 characters", "create_order", withField(validOrder, "note", strings.Repeat("é", 1000)), testKey},
		{"send_notification", "send_notification", validNotification, testKey},
		{"send_notification sms without subject", "send_notification", `{"operation_key":"` + testKey + `","channel":"sms","to":["+15551234567","+15557654321"],"body":"Shipped."}`, testKey},
		{"get_order", "get_order", `{"order_id":"ord_123-A"}`, ""},
		{"list_orders", "list_orders", `{"customer_id":"cust-42","limit":100}`, ""},
		{"new_operation_key empty", "new_operation_key", `{}`, ""},
		{"new_operation_key null", "new_operation_key", `null`, ""},
		{"new_operation_key no bytes", "new_operation_key", ``, ""},
		{"get_operation_status", "get_operation_status", `{"operation_key":"` + testKey + `"}`, testKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := mustPrepare(t, v, tt.tool, tt.args)
			if req.Tool != tt.tool || req.OperationKey != tt.wantKey {
				t.Errorf("got tool %q key %q, want %q %q", req.Tool, req.OperationKey, tt.tool, tt.wantKey)
			}
			if len(req.Fingerprint) != 64 || strings.ToLower(req.Fingerprint) != req.Fingerprint {
				t.Errorf("fingerprint %q is not lowercase hex SHA-256", req.Fingerprint)
			}
			fp, canon, err := Fingerprint(tt.tool, req.Args)
			if err != nil || fp != req.Fingerprint || string(canon) != string(req.Canonical) {
				t.Errorf("Fingerprint(Args) = %s %s %v, want %s %s", fp, canon, err, req.Fingerprint, req.Canonical)
			}
			// Prepared arguments are a fixed point.
			again, err := v.Prepare(tt.tool, req.Args)
			if err != nil || again.Fingerprint != req.Fingerprint {
				t.Errorf("Prepare(Args) = %v, fingerprint changed: %v", err, again)
			}
		})
	}
}

// TestPrepareRejects pins the messages a model sees.
func TestPrepareRejects(t *testing.T) {
	v := mustNew(t)
	mib := strings.Repeat("x", 1<<20)
	tests := []struct {
		name, tool, args string
		want             string // the whole Error()
	}{
		{"missing key", "create_order", without(validOrder, "operation_key"),
			`missing required property "operation_key"`},
		{"missing currency", "create_order", without(validOrder, "currency"),
			`missing required property "currency"`},
		{"several missing", "create_order", `{}`,
			`missing required property "currency"; missing required property "customer_id"; missing required property "items"; missing required property "operation_key"`},
		{"non-UUID key", "create_order", withField(validOrder, "operation_key", "abc"),
			`operation_key: must be a UUID such as the one new_operation_key returns (got "abc")`},
		{"key with braces", "send_notification", withField(validNotification, "operation_key", "{"+testKey+"}"),
			`operation_key: must be a UUID such as the one new_operation_key returns (got "{` + testKey + `}")`},
		{"key is a number", "create_order", withField(validOrder, "operation_key", 42),
			`operation_key: must be a string, got 42`},
		{"nil UUID", "create_order", withField(validOrder, "operation_key", "00000000-0000-0000-0000-000000000000"),
			`operation_key: is the nil UUID (all zeros), a placeholder that names no intent; call new_operation_key to get a fresh key for this intent, and reuse it on retries`},
		{"max UUID", "send_notification", withField(validNotification, "operation_key", "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"),
			`operation_key: is the max UUID (all f), a placeholder that names no intent; call new_operation_key to get a fresh key for this intent, and reuse it on retries`},
		{"example UUID", "create_order", withField(validOrder, "operation_key", "123e4567-e89b-12d3-a456-426614174000"),
			`operation_key: is a well-known documentation example UUID that many callers copy; call new_operation_key to get a fresh key for this intent, and reuse it on retries`},
		{"example UUID looked up", "get_operation_status", `{"operation_key":"3FA85F64-5717-4562-B3FC-2C963F66AFA6"}`,
			`operation_key: is a well-known documentation example UUID that many callers copy; call new_operation_key to get a fresh key for this intent, and reuse it on retries`},
		{"unknown field", "send_notification", withField(validNotification, "colour", "red"),
			`unknown property "colour" (allowed: channel, to, subject, body, order_id, operation_key)`},
		{"unknown nested field", "create_order", strings.Replace(validOrder, `"sku":"SKU-2"`, `"sku":"SKU-2","colour":"red"`, 1),
			`items[1]: unknown property "colour" (allowed: sku, quantity, unit_price_minor)`},
		{"arguments for a tool without any", "new_operation_key", `{"intent":"order"}`,
			`unknown property "intent" (this tool takes no arguments)`},
		{"wrong type", "create_order", strings.Replace(validOrder, `"quantity":2`, `"quantity":"2"`, 1),
			`items[0].quantity: must be an integer, got string`},
		{"fraction for an integer", "create_order", strings.Replace(validOrder, `"unit_price_minor":1250`, `"unit_price_minor":12.5`, 1),
			`items[0].unit_price_minor: must be an integer, got 12.5`},
		{"below minimum", "create_order", strings.Replace(validOrder, `"quantity":2`, `"quantity":0`, 1),
			`items[0].quantity: must be an integer ≥ 1 (got 0)`},
		{"above maximum", "list_orders", `{"customer_id":"c","limit":101}`,
			`limit: must be an integer ≤ 100 (got 101)`},
		{"1 MiB string", "create_order", withField(validOrder, "note", mib),
			`note: must be at most 1000 characters (got 1048576)`},
		{"1 MiB string with a pattern", "get_order", `{"order_id":"` + mib + `"}`,
			`order_id: must be at most 64 characters (got 1048576)`},
		{"enum", "send_notification", withField(validNotification, "channel", "fax"),
			`channel: must be one of email, sms, webhook (got "fax")`},
		{"empty string", "send_notification", withField(validNotification, "body", ""),
			`body: must not be empty`},
		{"empty array", "create_order", withField(validOrder, "items", []any{}),
			`items: must contain at least 1 item (got 0)`},
		{"too many items", "create_order", orderWithItems(101, 1),
			`items: must contain at most 100 items (got 101)`},
		{"duplicate recipients", "send_notification", withField(validNotification, "to", []string{"a@x.io", "b@x.io", "a@x.io"}),
			`to: must not contain duplicates (entries 0 and 2 are equal)`},
		{"currency pattern", "create_order", withField(validOrder, "currency", "eur"),
			`currency: must be a 3-letter ISO 4217 currency code in capitals, such as USD or EUR (got "eur")`},
		{"customer_id pattern", "list_orders", `{"customer_id":"-x"}`,
			`customer_id: must start with a letter or digit and contain only letters, digits and _ . : - (got "-x")`},
		{"date format", "create_order", withField(validOrder, "requested_delivery_date", "31/03/2025"),
			`requested_delivery_date: must be a date in the form YYYY-MM-DD, e.g. 2025-03-31 (got "31/03/2025")`},
		{"not an object", "get_order", `["ord_1"]`,
			`arguments must be an object, got array`},
		{"not JSON", "get_order", `{"order_id":`,
			`arguments are not valid JSON: unexpected EOF`},
		{"trailing data", "get_order", `{"order_id":"a"} {}`,
			`arguments are not valid JSON: invalid character after top-level value`},
		{"huge number", "list_orders", `{"customer_id":"c","limit":1e400}`,
			`limit: number is out of range (got 1e400)`},
		{"tiny number", "list_orders", `{"customer_id":"c","limit":1e-999999}`,
			`limit: number is out of range (got 1e-999999)`},
		{"long number", "list_orders", `{"customer_id":"c","limit":1` + strings.Repeat("0", 100) + `}`,
			`limit: number is too long (at most 64 characters)`},
		{"schema and key problems together", "send_notification",
			`{"operation_key":"00000000-0000-0000-0000-000000000000","channel":"fax","to":["a"],"body":"x"}`,
			`channel: must be one of email, sms, webhook (got "fax"); operation_key: is the nil UUID (all zeros), a placeholder that names no intent; call new_operation_key to get a fresh key for this intent, and reuse it on retries`},
		{"ship_to incomplete", "create_order", withField(validOrder, "ship_to", map[string]any{"name": "Ada", "line1": "1 Main St", "city": "X", "postal_code": "1", "country": "usa"}),
			`ship_to.country: must be a 2-letter ISO 3166-1 country code in capitals, such as US or DE (got "usa"); ship_to.country: must be at most 2 characters (got 3)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := v.Prepare(tt.tool, json.RawMessage(tt.args))
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Prepare = %v, %v; want *ValidationError", req, err)
			}
			if verr.Tool != tt.tool {
				t.Errorf("Tool = %q, want %q", verr.Tool, tt.tool)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestPrepareUnknownTool(t *testing.T) {
	v := mustNew(t)
	for _, tool := range []string{"", "result", "delete_everything"} {
		if _, err := v.Prepare(tool, nil); !errors.Is(err, ErrUnknownTool) {
			t.Errorf("Prepare(%q) = %v, want ErrUnknownTool", tool, err)
		}
	}
}

func TestPrepareProblemsAreBounded(t *testing.T) {
	v := mustNew(t)
	req, err := v.Prepare("create_order", json.RawMessage(orderWithItems(100, 0)))
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Prepare = %v, %v", req, err)
	}
	if len(verr.Problems) != 20 || verr.Omitted != 80 {
		t.Fatalf("got %d problems, %d omitted; want 20 and 80", len(verr.Problems), verr.Omitted)
	}
	// Sorted by position, not as text: items[2] before items[10].
	if verr.Problems[2].Path != "items[2].quantity" || verr.Problems[10].Path != "items[10].quantity" {
		t.Errorf("problems out of order: %v", verr.Problems)
	}
	if !strings.HasSuffix(err.Error(), "; and 80 more problems") {
		t.Errorf("Error() = %s", err)
	}
}

// TestMessagesNeverEchoLongInput sends 1 MiB in every string the schemas
// know and checks no message repeats more than 64 characters of it.
func TestMessagesNeverEchoLongInput(t *testing.T) {
	v := mustNew(t)
	mib := strings.Repeat("y", 1<<20)
	args := map[string]any{
		"operation_key": mib, "customer_id": mib, "currency": mib, "note": mib,
		"requested_delivery_date": mib, mib: mib,
		"items":   []any{map[string]any{"sku": mib, "quantity": mib, "unit_price_minor": 1}},
		"ship_to": map[string]any{"name": mib, "line1": mib, "city": mib, "postal_code": mib, "country": mib},
	}
	_, err := v.Prepare("create_order", args)
	if err == nil {
		t.Fatal("Prepare accepted 1 MiB strings")
	}
	if strings.Contains(err.Error(), strings.Repeat("y", 65)) {
		t.Errorf("message echoes more than 64 characters: %.300s", err)
	}
	if len(err.Error()) > 20*300 {
		t.Errorf("message is %d bytes long", len(err.Error()))
	}
}

func TestPrepareDefaults(t *testing.T) {
	v := mustNew(t)
	req := mustPrepare(t, v, "create_order", validOrder)
	if got := req.Args["notify_customer"]; got != true {
		t.Errorf("notify_customer = %v, want default true", got)
	}
	req = mustPrepare(t, v, "create_order", withField(validOrder, "notify_customer", false))
	if got := req.Args["notify_customer"]; got != false {
		t.Errorf("notify_customer = %v, want explicit false kept", got)
	}
	req = mustPrepare(t, v, "list_orders", `{"customer_id":"c"}`)
	if got := req.Args["limit"]; got != json.Number("20") {
		t.Errorf("limit = %#v, want default 20", got)
	}
	// A default is a copy: changing one request's Args changes no other.
	req.Args["limit"] = json.Number("5")
	if got := mustPrepare(t, v, "list_orders", `{"customer_id":"c"}`).Args["limit"]; got != json.Number("20") {
		t.Errorf("default changed to %v by another request", got)
	}
}

func TestPrepareCanonicalisesKey(t *testing.T) {
	v := mustNew(t)
	upper := mustPrepare(t, v, "create_order", withField(validOrder, "operation_key", strings.ToUpper(testKey)))
	lower := mustPrepare(t, v, "create_order", validOrder)
	if upper.OperationKey != testKey || upper.Args["operation_key"] != testKey {
		t.Errorf("OperationKey %q, Args key %v; want %q in both", upper.OperationKey, upper.Args["operation_key"], testKey)
	}
	if upper.Fingerprint != lower.Fingerprint {
		t.Error("key case changed the fingerprint")
	}
}

func TestPrepareArgumentForms(t *testing.T) {
	v := mustNew(t)
	want := mustPrepare(t, v, "create_order", validOrder)
	var decoded map[string]any // what an MCP library hands over: float64 numbers
	if err := json.Unmarshal([]byte(validOrder), &decoded); err != nil {
		t.Fatal(err)
	}
	type item struct {
		SKU            string  `json:"sku"`
		Quantity       float64 `json:"quantity"`
		UnitPriceMinor int64   `json:"unit_price_minor"`
	}
	typed := struct {
		OperationKey string `json:"operation_key"`
		CustomerID   string `json:"customer_id"`
		Items        []item `json:"items"`
		Currency     string `json:"currency"`
	}{testKey, "cust-42", []item{{"SKU-1", 2, 1250}, {"SKU-2", 1, 0}}, "EUR"}
	for name, args := range map[string]any{
		"map":        decoded,
		"RawMessage": json.RawMessage(validOrder),
		"bytes":      []byte(validOrder),
		"struct":     typed,
	} {
		t.Run(name, func(t *testing.T) {
			req, err := v.Prepare("create_order", args)
			if err != nil {
				t.Fatal(err)
			}
			if req.Fingerprint != want.Fingerprint {
				t.Errorf("fingerprint %s, want %s", req.Fingerprint, want.Fingerprint)
			}
		})
	}
	for _, args := range []any{nil, map[string]any(nil), json.RawMessage(nil), json.RawMessage("null"), map[string]any{}} {
		if _, err := v.Prepare("new_operation_key", args); err != nil {
			t.Errorf("Prepare(new_operation_key, %#v) = %v", args, err)
		}
	}
}

func TestRequestDecode(t *testing.T) {
	v := mustNew(t)
	req := mustPrepare(t, v, "create_order", strings.Replace(validOrder, `"quantity":2`, `"quantity":2.0e0`, 1))
	var got struct {
		OperationKey string `json:"operation_key"`
		Items        []struct {
			SKU            string `json:"sku"`
			Quantity       int    `json:"quantity"`
			UnitPriceMinor int64  `json:"unit_price_minor"`
		} `json:"items"`
		NotifyCustomer bool `json:"notify_customer"`
	}
	if err := req.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.OperationKey != testKey || got.Items[0].Quantity != 2 || got.Items[0].UnitPriceMinor != 1250 || !got.NotifyCustomer {
		t.Errorf("Decode = %+v", got)
	}
}

func TestValidateResult(t *testing.T) {
	v := mustNew(t)
	tests := []struct {
		name    string
		result  string
		wantErr string
	}{
		{"succeeded", `{"operation_key":"` + testKey + `","status":"succeeded","replayed":false,"result":{"order":{"order_id":"o1","version":1}},"next_action":"none","attempts":1,"first_seen_at":"2025-03-31T09:30:00Z","completed_at":"2025-03-31T09:30:01.5+02:00"}`, ""},
		{"error", `{"status":"failed","replayed":true,"error":{"code":"key_reused_with_different_request","message":"…","details":{"x":1}},"next_action":"use_new_key_for_new_intent"}`, ""},
		{"approval", `{"status":"awaiting_approval","replayed":false,"approval":{"approval_id":"a1","status":"pending","expires_at":"2025-04-01T00:00:00Z","diff":[]},"next_action":"await_approval"}`, ""},
		{"future field", `{"status":"unknown","replayed":false,"next_action":"reconcile","downstream_ref":"x"}`, ""},
		{"bad status", `{"status":"done","replayed":false,"next_action":"none"}`,
			"status: must be one of succeeded, failed, awaiting_approval, in_progress, unknown, rejected, retryable (got \"done\")"},
		{"missing fields", `{"status":"failed","error":{"code":"nope"}}`,
			`missing required property "next_action"; missing required property "replayed"; error: missing required property "message"; error.code: must be one of invalid_arguments, key_reused_with_different_request, forbidden, not_found, precondition_failed, operation_in_progress, outcome_unknown, key_expired, approval_required, downstream_error, internal (got "nope")`},
		{"bad time", `{"status":"succeeded","replayed":false,"next_action":"none","completed_at":"yesterday"}`,
			`completed_at: must be a date and time in RFC 3339 form, e.g. 2025-03-31T09:30:00Z (got "yesterday")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := v.ValidateResult(json.RawMessage(tt.result))
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.wantErr {
				t.Errorf("got  %s\nwant %s", got, tt.wantErr)
			}
		})
	}
}

func TestPrepareConcurrent(t *testing.T) {
	v := mustNew(t)
	want := mustPrepare(t, v, "create_order", validOrder).Fingerprint
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 50; j++ {
				req, err := v.Prepare("create_order", json.RawMessage(validOrder))
				if err != nil || req.Fingerprint != want {
					t.Errorf("Prepare = %v, %v", req, err)
					return
				}
				if _, err := v.Prepare("list_orders", json.RawMessage(`{"customer_id":"c","limit":0}`)); err == nil {
					t.Error("limit 0 accepted")
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestCheckOperationKey(t *testing.T) {
	const (
		badForm = "must be a UUID such as the one new_operation_key returns"
		example = "is a well-known documentation example UUID"
	)
	tests := []struct {
		name, key, want string // want: "" or a substring of the message
	}{
		{"random v4", testKey, ""},
		{"uppercase", strings.ToUpper(testKey), ""},
		{"v7", "0190a5b2-7c3e-7d4f-8a1b-2c3d4e5f6a7b", ""},
		{"empty", "", badForm},
		{"no hyphens", strings.ReplaceAll(testKey, "-", ""), badForm},
		{"braces", "{" + testKey + "}", badForm},
		{"urn", "urn:uuid:" + testKey, badForm},
		{"non-hex", "3g2504e0-4f89-41d3-9a0c-0305e82c3301", badForm},
		{"hyphens misplaced", "3f2504e04-f89-41d3-9a0c-0305e82c3301", badForm},
		{"spaces", " " + testKey, badForm},
		{"nil", "00000000-0000-0000-0000-000000000000", "is the nil UUID"},
		{"max", "ffffffff-ffff-ffff-ffff-ffffffffffff", "is the max UUID"},
		{"all ones", "11111111-1111-1111-1111-111111111111", "is a placeholder UUID (every digit is 1)"},
		{"all As", "AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAAA", "is a placeholder UUID (every digit is a)"},
	}
	for key := range placeholderKeys {
		tests = append(tests,
			struct{ name, key, want string }{"example " + key, key, example},
			struct{ name, key, want string }{"example " + strings.ToUpper(key), strings.ToUpper(key), example})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckOperationKey(tt.key)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("CheckOperationKey(%q) = %v, want nil", tt.key, err)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) || len(verr.Problems) != 1 || verr.Problems[0].Path != "operation_key" {
				t.Fatalf("CheckOperationKey(%q) = %#v, want one problem at operation_key", tt.key, err)
			}
			if msg := verr.Problems[0].Message; !strings.Contains(msg, tt.want) {
				t.Errorf("message %q lacks %q", msg, tt.want)
			}
			if tt.want != badForm && !strings.Contains(err.Error(), "call new_operation_key") {
				t.Errorf("message %q does not say what to do", err)
			}
		})
	}
}

func TestPlaceholderKeysAreCanonical(t *testing.T) {
	for key := range placeholderKeys {
		if !isUUID(key) || key != strings.ToLower(key) {
			t.Errorf("placeholder %q is not a lowercase UUID", key)
		}
	}
}

// --- helpers ---

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// withField returns the JSON object args with name set to value.
func withField(args, name string, value any) string {
	var m map[string]any
	if err := json.Unmarshal([]byte(args), &m); err != nil {
		panic(err)
	}
	m[name] = value
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// without returns the JSON object args without name.
func without(args, name string) string {
	var m map[string]any
	if err := json.Unmarshal([]byte(args), &m); err != nil {
		panic(err)
	}
	delete(m, name)
	b, _ := json.Marshal(m)
	return string(b)
}

// orderWithItems returns a create_order request with n lines of quantity q.
func orderWithItems(n, q int) string {
	items := make([]any, n)
	for i := range items {
		items[i] = map[string]any{"sku": fmt.Sprintf("SKU-%d", i), "quantity": q, "unit_price_minor": 100}
	}
	return withField(validOrder, "items", items)
}

// TestMissingIsData: the required top-level arguments that are absent are
// named in ValidationError.Missing, so callers act on them without
// parsing messages.
func TestMissingIsData(t *testing.T) {
	v := mustNew(t)
	_, err := v.Prepare("create_order", json.RawMessage(`{"note":"x"}`))
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Prepare = %v", err)
	}
	want := []string{"currency", "customer_id", "items", "operation_key"}
	got := slices.Sorted(slices.Values(verr.Missing))
	if !slices.Equal(got, want) {
		t.Errorf("Missing = %v, want %v", got, want)
	}
	_, err = v.Prepare("create_order", json.RawMessage(`{"operation_key":"0b8e5f7e-8a55-4b1e-9d52-3c1f2d9a4e61","customer_id":"c","currency":"EUR","items":[{"sku":"a","quantity":1}]}`))
	if !errors.As(err, &verr) {
		t.Fatalf("Prepare = %v", err)
	}
	if len(verr.Missing) != 0 {
		t.Errorf("Missing = %v for a nested missing property; want none (only top-level arguments)", verr.Missing)
	}
}

// TestNewWith: the extra schemas validate their tools like the embedded
// ones, publish nothing (InputSchema), and cannot replace an embedded one.
func TestNewWith(t *testing.T) {
	toy := `{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
		"properties": {"word": {"type": "string", "maxLength": 8}, "operation_key": {"type": "string", "format": "uuid", "maxLength": 36}},
		"required": ["operation_key", "word"], "additionalProperties": false}`
	v, err := NewWith(fstest.MapFS{"toy_word.json": &fstest.MapFile{Data: []byte(toy)}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(v.Tools(), "toy_word") || !slices.Contains(v.Tools(), "create_order") {
		t.Errorf("Tools() = %v, want the embedded tools and toy_word", v.Tools())
	}
	if req := mustPrepare(t, v, "toy_word", `{"operation_key":"`+testKey+`","word":"hi"}`); req.OperationKey != testKey || req.Fingerprint == "" {
		t.Errorf("Prepare(toy_word) = %+v", req)
	}
	var ve *ValidationError
	if _, err := v.Prepare("toy_word", json.RawMessage(`{"operation_key":"`+testKey+`","word":"far too long"}`)); !errors.As(err, &ve) {
		t.Errorf("Prepare(toy_word, long word) = %v, want a ValidationError", err)
	}
	if _, ok := InputSchema("toy_word"); ok {
		t.Error("InputSchema(toy_word) ok: an extra schema was published")
	}
	for _, name := range []string{"create_order.json", "result.json"} {
		if _, err := NewWith(fstest.MapFS{name: &fstest.MapFile{Data: []byte(toy)}}); err == nil {
			t.Errorf("NewWith(%s) succeeded, want an error: it would replace an embedded schema", name)
		}
	}
}
