package tools

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"idemgate/ledger"
)

func benchService(b *testing.B) *Service {
	b.Helper()
	svc, _ := costService(b)
	return svc
}

var benchActor = ledger.Actor{Tenant: "t1", Principal: "p1", Role: "agent"}

func benchOrder(key, customer string) map[string]any {
	return map[string]any{"operation_key": key, "customer_id": customer, "currency": "EUR",
		"items": []any{map[string]any{"sku": "coffee-1kg", "quantity": float64(2), "unit_price_minor": float64(1850)}}}
}

// BenchmarkCallReplay is a replay through Service.Call: validation,
// fingerprint, a read-only ledger lookup, the answer.
func BenchmarkCallReplay(b *testing.B) {
	svc := benchService(b)
	args := benchOrder(uuid.NewString(), "c1")
	ctx := context.Background()
	if r := svc.Call(ctx, benchActor, "create_order", args, nil); r.IsError {
		b.Fatal(r.Error)
	}
	b.ResetTimer()
	for b.Loop() {
		if r := svc.Call(ctx, benchActor, "create_order", args, nil); !r.Replayed {
			b.Fatal("not a replay")
		}
	}
}

// BenchmarkCallReplayRaw is BenchmarkCallReplay with the arguments as
// the server passes them: the JSON the client sent.
func BenchmarkCallReplayRaw(b *testing.B) {
	svc := benchService(b)
	args, err := json.Marshal(benchOrder(uuid.NewString(), "c1"))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if r := svc.Call(ctx, benchActor, "create_order", json.RawMessage(args), nil); r.IsError {
		b.Fatal(r.Error)
	}
	for b.Loop() {
		r := svc.Call(ctx, benchActor, "create_order", json.RawMessage(args), nil)
		if !r.Replayed {
			b.Fatal("not a replay")
		}
		if _, err := r.Encoded(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCallCreate is a new create_order through Service.Call (the
// deliverer is not running).
func BenchmarkCallCreate(b *testing.B) {
	svc := benchService(b)
	ctx := context.Background()
	i := 0
	for b.Loop() {
		i++
		if r := svc.Call(ctx, benchActor, "create_order", benchOrder(uuid.NewString(), "c"+uuid.NewString()[:8]), nil); r.IsError {
			b.Fatal(r.Error)
		}
	}
}

// BenchmarkCallCreateDelivered is BenchmarkCallCreate with the outbox
// deliverer running, as in a server: every create queues a confirmation,
// and the benchmark ends when all are delivered (written and synced to
// the directory sink). Run it under strace -c -f to count the syncs per
// create.
func BenchmarkCallCreateDelivered(b *testing.B) {
	svc := benchService(b)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { svc.Deliverer().Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	n := 0
	for b.Loop() {
		n++
		if r := svc.Call(ctx, benchActor, "create_order", benchOrder(uuid.NewString(), "c"+uuid.NewString()[:8]), nil); r.IsError {
			b.Fatal(r.Error)
		}
		svc.Deliverer().Kick()
	}
	for {
		pending := 0
		if err := svc.ledger.View(ctx, func(tx ledger.Tx) error {
			return tx.Scan("outbox_pending", "", false, func(string, []byte) (bool, error) { pending++; return true, nil })
		}); err != nil {
			b.Fatal(err)
		}
		if pending == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchmarkCallGetOrder is a get_order through Service.Call of the order
// a create made, with the arguments as the server passes them: the read
// a replay of that create is compared with (issue 12: a replay costs at
// most 1.2 × a get_order with the same answer).
func BenchmarkCallGetOrder(b *testing.B) {
	svc := benchService(b)
	ctx := context.Background()
	created := svc.Call(ctx, benchActor, "create_order", benchOrder(uuid.NewString(), "c1"), nil)
	if created.IsError {
		b.Fatal(created.Error)
	}
	var o struct {
		Order struct {
			OrderID string `json:"order_id"`
		} `json:"order"`
	}
	if err := json.Unmarshal(created.Result, &o); err != nil {
		b.Fatal(err)
	}
	args, err := json.Marshal(map[string]any{"order_id": o.Order.OrderID})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		r := svc.Call(ctx, benchActor, "get_order", json.RawMessage(args), nil)
		if r.IsError {
			b.Fatal(r.Error)
		}
		if _, err := r.Encoded(); err != nil {
			b.Fatal(err)
		}
	}
}
