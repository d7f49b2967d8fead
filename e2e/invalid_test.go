package e2e

import (
	"fmt"
	"strings"
	"testing"
)

// TestInvalidArguments, for every client library and era: arguments that
// fail validation are answered isError/invalid_arguments with a message
// naming the offending argument, leave no record (get_operation_status says
// not_found), keep the server serving, and do not burn the key: the same
// key with corrected arguments then succeeds.
func TestInvalidArguments(t *testing.T) {
	type tc struct {
		name string
		// args builds the bad arguments for key (and a customer of its own).
		args func(key, customer string) any
		// field must appear in the error message.
		field string
		// keyUsable: the call carried a well-formed key whose record can be
		// looked up and which may be reused once the arguments are fixed.
		keyUsable bool
	}
	cases := []tc{
		{"missing key", func(_, c string) any { return orderArgs("", c, coffee, nil) }, "operation_key", false},
		{"non-UUID key", func(_, c string) any { return orderArgs("order-42-retry", c, coffee, nil) }, "operation_key", false},
		{"nil UUID key", func(_, c string) any { return orderArgs("00000000-0000-0000-0000-000000000000", c, coffee, nil) }, "operation_key", false},
		{"documentation example key", func(_, c string) any {
			return orderArgs("123e4567-e89b-12d3-a456-426614174000", c, coffee, nil)
		}, "operation_key", false},
		{"unknown field", func(k, c string) any { return orderArgs(k, c, coffee, map[string]any{"colour": "blue"}) }, "colour", true},
		{"wrong type", func(k, c string) any {
			a := orderArgs(k, c, coffee, nil)
			a["items"] = []any{map[string]any{"sku": "coffee-1kg", "quantity": "two", "unit_price_minor": 1850}}
			return a
		}, "quantity", true},
		{"1 MiB note", func(k, c string) any {
			return orderArgs(k, c, coffee, map[string]any{"note": strings.Repeat("x", 1<<20)})
		}, "note", true},
	}
	forEachFlavor(t, allFlavors, func(t *testing.T, f flavor) {
		s := startServer(t, f, serverConfig{})
		for i, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				key := newKey()
				customer := fmt.Sprintf("cust-invalid-%d", i)
				e := s.mustFail(t, "create_order", c.args(key, customer), "invalid_arguments")
				if msg := e.Error.Message; len(msg) < 400 {
					t.Logf("message: %s", msg)
				}
				if !strings.Contains(e.Error.Message, c.field) {
					t.Errorf("message does not name %q: %s", c.field, e.Error.Message)
				}
				wantNext := "fix_arguments_and_retry_same_key"
				if !c.keyUsable {
					wantNext = "use_new_key_for_new_intent"
				}
				if e.Replayed || len(e.Result) != 0 || e.NextAction != wantNext {
					t.Errorf("invalid_arguments answer: %s", e)
				}
				if len(e.Text) > 64<<10 {
					t.Errorf("answer is %d bytes: the refused input is echoed back", len(e.Text))
				}
				// No record under the key, and the server still answers.
				if c.keyUsable {
					if _, status, found := s.status(t, key); found {
						t.Errorf("get_operation_status after a refused call: a record exists: %s", status)
					}
				} else if bad, ok := c.args(key, customer).(map[string]any)["operation_key"].(string); ok {
					// The refused key is not a lookup key either.
					s.mustFail(t, "get_operation_status", map[string]any{"operation_key": bad}, "invalid_arguments")
				}
				if n := s.orderCount(t, customer); n != 0 {
					t.Errorf("list_orders count %d after a refused call, want 0", n)
				}
				// The same (or, for a refused key, a proper) key with corrected
				// arguments runs.
				good := s.mustSucceed(t, "create_order", orderArgs(key, customer, coffee, nil))
				if good.Replayed || good.OperationKey != key {
					t.Errorf("corrected call: %s", good)
				}
				if n := s.orderCount(t, customer); n != 1 {
					t.Errorf("list_orders count %d after the corrected call, want 1", n)
				}
			})
		}
	})
}

// TestRefusedKeyAdvice: when the operation key itself is what was refused
// (missing, not a UUID, the nil UUID, a copied documentation example), the
// answer must not tell the model to "call again with the same
// operation_key" or advise fix_arguments_and_retry_same_key: reusing that
// key can never work, and the per-problem text already says to get a fresh
// one from new_operation_key. Contradictory advice is how a model ends up
// looping on a placeholder key.
func TestRefusedKeyAdvice(t *testing.T) {
	s := startServer(t, mcpGoModern, serverConfig{})
	for _, key := range []string{"", "order-42-retry", "00000000-0000-0000-0000-000000000000", "123e4567-e89b-12d3-a456-426614174000"} {
		name := key
		if name == "" {
			name = "missing"
		}
		t.Run(name, func(t *testing.T) {
			e := s.mustFail(t, "create_order", orderArgs(key, "cust-advice", coffee, nil), "invalid_arguments")
			if strings.Contains(e.Error.Message, "same operation_key") {
				t.Errorf("the refused key is the problem, yet the message says to call again with the same operation_key:\n%s", e.Error.Message)
			}
			if e.NextAction == "fix_arguments_and_retry_same_key" {
				t.Errorf("next_action %q for a refused key: retrying with the same key cannot succeed", e.NextAction)
			}
		})
	}
}
