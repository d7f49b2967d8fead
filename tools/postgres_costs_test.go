package tools

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/ledger/postgres"
	"idemgate/ledger/postgres/pgtest"
	"idemgate/schemas"
)

// TestMain stops the PostgreSQL cluster a test of this package started
// (without it the cluster outlived the test binary).
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestRoundTripsOnPostgres pins what a call costs in exchanges with
// PostgreSQL (SCALING.md counts them): a new create_order with its
// confirmation, and a new send_notification, take 3 round trips (the
// replay look, the claim's locked reads, the writes with COMMIT — the
// order's and the message's ids are derived from the fresh incarnation,
// so they are not read first); a replay takes 1.
func TestRoundTripsOnPostgres(t *testing.T) {
	db, err := postgres.Open(pgtest.NewDatabase(t), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	v, err := schemas.New()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(db, v, Options{OutboxDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	call := func(tool string, args map[string]any) string {
		t.Helper()
		r := svc.Call(ctx, benchActor, tool, args, nil)
		if r.IsError {
			t.Fatalf("%s: %+v", tool, r.Error)
		}
		return string(r.Result)
	}
	// least is the fewest round trips of five runs of fn (a background
	// pass of the service may fall inside one).
	least := func(fn func()) int64 {
		n := int64(1 << 62)
		for range 5 {
			before, _ := db.Stats()
			fn()
			after, _ := db.Stats()
			n = min(n, after-before)
		}
		return n
	}
	order := func() map[string]any {
		a := benchOrder(uuid.NewString(), "c"+uuid.NewString()[:8])
		a["notify_customer"] = true
		return a
	}
	call("create_order", order()) // the statements are prepared
	if n := least(func() {
		if res := call("create_order", order()); !strings.Contains(res, `"confirmation"`) || !strings.Contains(res, `"order_id"`) {
			t.Fatalf("a create_order with notify_customer: %s, want its order and its confirmation", res)
		}
	}); n != 3 {
		t.Errorf("a new create_order with its confirmation took %d round trips, want 3", n)
	}
	if n := least(func() {
		call("send_notification", map[string]any{"operation_key": uuid.NewString(), "channel": "email", "to": []any{"customer:c1"}, "subject": "s", "body": "b " + uuid.NewString()})
	}); n != 3 {
		t.Errorf("a new send_notification took %d round trips, want 3", n)
	}
	replay := order()
	first := call("create_order", replay)
	if n := least(func() {
		if again := call("create_order", replay); again != first {
			t.Fatalf("the replay answered %s, want the saved %s", again, first)
		}
	}); n != 1 {
		t.Errorf("a replay took %d round trips, want 1", n)
	}
}
