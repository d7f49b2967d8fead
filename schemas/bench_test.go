package schemas

import (
	"encoding/json"
	"testing"
)

// benchOrder is a create_order's arguments as a client sends them.
var benchOrder = []byte(`{"operation_key":"` + testKey + `","customer_id":"cust-42","currency":"EUR",` +
	`"items":[{"sku":"coffee-1kg","quantity":2,"unit_price_minor":1850},{"sku":"filter-100","quantity":1,"unit_price_minor":450}],` +
	`"ship_to":{"name":"Ada Lovelace","line1":"12 St James's Square","city":"London","postal_code":"SW1Y 4JH","country":"GB"},` +
	`"note":"Leave at the door, please."}`)

// BenchmarkPrepare is what every create_order pays before the ledger is
// asked: decode, validate, defaults, fingerprint.
func BenchmarkPrepare(b *testing.B) {
	v := mustNew(b)
	for b.Loop() {
		if _, err := v.Prepare("create_order", json.RawMessage(benchOrder)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFingerprint compares the one-pass canonicalizer with its
// definition (encoding/json, then jcs.Transform), over the arguments
// Prepare hashes.
func BenchmarkFingerprint(b *testing.B) {
	v := mustNew(b)
	req, err := v.Prepare("create_order", json.RawMessage(benchOrder))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("one-pass", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := Fingerprint("create_order", req.Args); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("marshal+jcs", func(b *testing.B) {
		for b.Loop() {
			if _, err := oldFingerprint("create_order", req.Args); err != nil {
				b.Fatal(err)
			}
		}
	})
}
