package tools

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/schemas"
)

// TestPreparedIsPrepare: arguments prepared from the kept work of an
// earlier call with the same bytes are what Prepare gives, in a Request
// of the caller's own; arguments Prepare refuses are never kept.
func TestPreparedIsPrepare(t *testing.T) {
	v, err := schemas.New()
	if err != nil {
		t.Fatal(err)
	}
	var p preparedCalls
	raw, err := json.Marshal(benchOrder(strings.ToUpper(uuid.NewString()), "c1"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := v.Prepare("create_order", json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	wantArgs, _ := json.Marshal(want.Args)
	for i := range 3 {
		req, args, err := p.prepare(v, "create_order", json.RawMessage(raw))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(req, want) || string(args) != string(wantArgs) {
			t.Fatalf("call %d prepared %+v with %s, want %+v with %s", i, req, args, want, wantArgs)
		}
		req.OperationKey, req.Fingerprint = "changed", "changed" // the caller's own
	}
	if len(p.m) != 1 {
		t.Errorf("%d calls kept, want 1", len(p.m))
	}
	// The same arguments for another tool are that tool's to judge.
	if _, _, err := p.prepare(v, "send_notification", json.RawMessage(raw)); err == nil {
		t.Errorf("create_order's arguments prepared for send_notification")
	}
	bad := json.RawMessage(strings.Replace(string(raw), `"quantity":2`, `"quantity":0`, 1))
	for range 2 {
		if _, _, err := p.prepare(v, "create_order", bad); err == nil {
			t.Fatalf("quantity 0 prepared")
		}
	}
	if len(p.m) != 1 {
		t.Errorf("%d calls kept after refusals, want 1", len(p.m))
	}
}

// TestReplayFromRawArguments: a call with the arguments as the server
// passes them (the client's JSON) and its retries are answered and
// recorded as with decoded arguments — the same fingerprint, the same
// replayed bytes — and a refused retry is refused every time.
func TestReplayFromRawArguments(t *testing.T) {
	svc, _ := costService(t)
	ctx := context.Background()
	key := uuid.NewString()
	args := benchOrder(key, "c1")
	raw, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	first := svc.Call(ctx, benchActor, "create_order", json.RawMessage(raw), nil)
	if first.IsError {
		t.Fatal(first.Error)
	}
	want := svc.Call(ctx, benchActor, "create_order", args, nil)
	wantText, err := want.Encoded()
	if err != nil || !want.Replayed {
		t.Fatalf("replay with decoded arguments = %+v, %v", want, err)
	}
	for range 3 {
		r := svc.Call(ctx, benchActor, "create_order", json.RawMessage(raw), nil)
		text, err := r.Encoded()
		if err != nil || !r.Replayed || string(text) != string(wantText) {
			t.Fatalf("replay with raw arguments = %s, %v; want %s", text, err, wantText)
		}
	}
	prepared, err := svc.schemas.Prepare("create_order", args)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := svc.ledger.Get(ctx, benchActor.Tenant, key)
	if err != nil || rec.Fingerprint != prepared.Fingerprint {
		t.Errorf("record fingerprint %q, %v; want %q", rec.Fingerprint, err, prepared.Fingerprint)
	}
	bad := json.RawMessage(strings.Replace(string(raw), `"currency":"EUR"`, `"currency":"euro"`, 1))
	for i := range 2 {
		r := svc.Call(ctx, benchActor, "create_order", bad, nil)
		if r.Error == nil || r.Error.Code != string(CodeInvalidArguments) || r.Status != ledger.StateRejected {
			t.Fatalf("refused retry %d = %+v, want invalid_arguments", i, r)
		}
	}
}
