package tools

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"testing/fstest"

	"github.com/google/uuid"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/schemas"
)

// toyCollection is where the toy tools write, in the ledger's transaction.
const toyCollection = "toy_stamps"

// toyArgs are the toy tools' typed arguments.
type toyArgs struct {
	Word string `json:"word"`
}

// toySchema is the input schema of a toy tool (a test's stand-in for
// schemas/<name>.json).
const toySchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "word": {"type": "string", "minLength": 1, "maxLength": 40},
    "operation_key": {"type": "string", "format": "uuid", "maxLength": 36}
  },
  "required": ["operation_key", "word"],
  "additionalProperties": false
}`

// toyTool is a side-effecting tool defined the way a tool's own file
// defines one: it writes its word into toyCollection inside the ledger's
// transaction, counting each time its effect runs in applied. always says
// its descriptor holds every call for an approver.
func toyTool(name string, always bool, applied *atomic.Int64) descriptor {
	spec := Spec{Name: name, Title: "Stamp a word (toy)", Description: "Stamps one word, once per operation_key.", Idempotent: true}
	return define(spec, func(s *Service, ctx context.Context, c *call, a toyArgs) *Response {
		return s.execute(ctx, c, func() proposal {
			return proposal{diff: approvals.CreateDiff("stamp", approvals.ToMap(a))}
		})
	}, &sideEffect[toyArgs]{
		noun:          "stamp",
		downstream:    "toy",
		alwaysApprove: always,
		apply: func(s *Service, tenant string, a toyArgs) (ledger.ApplyFunc, error) {
			return func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
				applied.Add(1)
				if err := tx.Put(toyCollection, tenant+"\x00"+opRef(rec), []byte(a.Word)); err != nil {
					return ledger.Outcome{}, err
				}
				return ledger.Outcome{State: ledger.StateSucceeded, Result: mustJSON(map[string]any{"stamp": a}),
					Summary: "stamped " + a.Word, DownstreamRef: opRef(rec)}, nil
			}, nil
		},
	})
}

// toyService is a service whose tools are the registry's and ts: the
// registry plus one line per toy, and the toys' schemas beside the
// embedded ones. Nothing else is told about them.
func toyService(t *testing.T, ts ...descriptor) *Service {
	t.Helper()
	store, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	extra := fstest.MapFS{}
	for _, d := range ts {
		extra[d.Name+".json"] = &fstest.MapFile{Data: []byte(toySchema)}
	}
	v, err := schemas.NewWith(extra)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := newWith(store, v, Options{OutboxDir: t.TempDir()}, append(registry(), ts...))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// stamps are the words the toy tools wrote, in key order.
func stamps(t *testing.T, svc *Service) []string {
	t.Helper()
	var out []string
	err := svc.ledger.View(context.Background(), func(tx ledger.Tx) error {
		return tx.Scan(toyCollection, "", false, func(_ string, v []byte) (bool, error) {
			out = append(out, string(v))
			return true, nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// TestToyToolNeedsNoOtherList: a side-effecting tool defined in a test —
// its descriptor, its schema, and one more entry after the registry's —
// is claimed and run once, replayed, refused under a changed request,
// held as a suspected duplicate under a new key, recorded with the
// downstream its descriptor names, and, when its descriptor says it always
// needs approval, held for an approver and run once on approval. The
// ledger, the policy and the approval flow find all of it through the
// descriptor: no other list in the code names the tool.
func TestToyToolNeedsNoOtherList(t *testing.T) {
	ctx := context.Background()
	var applied atomic.Int64
	svc := toyService(t, toyTool("stamp_word", false, &applied), toyTool("seal_word", true, &applied))

	key := uuid.NewString()
	args := map[string]any{"operation_key": key, "word": "hello"}
	first := svc.Call(ctx, agent, "stamp_word", args, nil)
	if first.IsError || first.Status != ledger.StateSucceeded || first.Replayed || first.NextAction != NextNone {
		t.Fatalf("first call = %+v, want succeeded", first)
	}
	again := svc.Call(ctx, agent, "stamp_word", args, nil)
	if again.Status != ledger.StateSucceeded || !again.Replayed || string(again.Result) != string(first.Result) {
		t.Fatalf("same key, same request = %+v, want the first answer replayed", again)
	}
	changed := svc.Call(ctx, agent, "stamp_word", map[string]any{"operation_key": key, "word": "bye"}, nil)
	if !CodeKeyReused.Is(changed.Error) || changed.NextAction != NextNewKey {
		t.Fatalf("same key, changed request = %+v, want key_reused_with_different_request", changed)
	}
	dup := svc.Call(ctx, agent, "stamp_word", map[string]any{"operation_key": uuid.NewString(), "word": "hello"}, nil)
	if dup.Status != ledger.StateAwaitingApproval || dup.Approval == nil || dup.Approval.Rule != "suspected_duplicate" || dup.Approval.EarlierKey != key {
		t.Fatalf("new key, same request = %+v, want held as a suspected duplicate of %s", dup, key)
	}
	if n := applied.Load(); n != 1 {
		t.Fatalf("the effect ran %d times, want once", n)
	}
	if got := stamps(t, svc); !slices.Equal(got, []string{"hello"}) {
		t.Fatalf("stamps = %q, want [hello]", got)
	}

	rec, err := svc.ledger.Get(ctx, agent.Tenant, key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Tool != "stamp_word" || rec.Downstream != "toy" || rec.State != ledger.StateSucceeded || rec.Attempts != 1 {
		t.Errorf("record = tool %q, downstream %q, %s after %d attempts; want stamp_word on toy, succeeded after 1", rec.Tool, rec.Downstream, rec.State, rec.Attempts)
	}
	h := history(t, svc, key)
	if ex := find(h, ledger.EventTransition, ledger.AuditExecuted); len(ex) != 1 || ex[0].Call == nil || ex[0].Call.System != "toy" || ex[0].PolicyRule != "default_allow" {
		t.Errorf("executed entries = %+v, want one, its downstream call on toy, allowed by default", ex)
	}
	if n := len(find(h, ledger.EventCall, ledger.AuditDecision(ledger.DecisionReplay))); n != 1 {
		t.Errorf("%d replay entries, want 1", n)
	}
	if n := len(find(h, ledger.EventCall, ledger.AuditDecision(ledger.DecisionMismatch))); n != 1 {
		t.Errorf("%d mismatch entries, want 1", n)
	}
	st := svc.Call(ctx, agent, "get_operation_status", map[string]any{"operation_key": key}, nil)
	var status struct {
		Tool   string          `json:"tool"`
		Result json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(st.Result, &status); err != nil || st.IsError || status.Tool != "stamp_word" || string(status.Result) != string(first.Result) {
		t.Errorf("get_operation_status = %+v (%s), want the stamp's record and outcome", st, st.Result)
	}

	// The descriptor says every seal needs an approver.
	sealArgs := map[string]any{"operation_key": uuid.NewString(), "word": "wax"}
	held := svc.Call(ctx, agent, "seal_word", sealArgs, nil)
	if held.Status != ledger.StateAwaitingApproval || !CodeApprovalRequired.Is(held.Error) || held.Approval == nil || held.Approval.Rule != "always_approve" {
		t.Fatalf("seal_word = %+v, want held by always_approve", held)
	}
	if n := applied.Load(); n != 1 {
		t.Fatalf("a held seal ran the effect: %d runs, want still 1", n)
	}
	done := svc.Decide(ctx, approver, DecideRequest{ApprovalID: held.Approval.ID, Decision: Approve})
	if done.IsError || done.Status != ledger.StateSucceeded {
		t.Fatalf("approve = %+v, want the seal run", done)
	}
	if r := svc.Call(ctx, agent, "seal_word", sealArgs, nil); !r.Replayed || r.Status != ledger.StateSucceeded || string(r.Result) != string(done.Result) {
		t.Errorf("the agent's retry after approval = %+v, want the outcome replayed", r)
	}
	if n := applied.Load(); n != 2 {
		t.Errorf("the effect ran %d times, want twice (the stamp, the approved seal)", n)
	}
	if got := stamps(t, svc); !slices.Equal(got, []string{"hello", "wax"}) {
		t.Errorf("stamps = %q, want [hello wax]", got)
	}
}

// TestToolRegistrationChecks: a tool without a schema, a name registered
// twice, and a side effect that names no downstream are refused when the
// service is built.
func TestToolRegistrationChecks(t *testing.T) {
	var applied atomic.Int64
	v, err := schemas.NewWith(fstest.MapFS{"stamp_word.json": &fstest.MapFile{Data: []byte(toySchema)}})
	if err != nil {
		t.Fatal(err)
	}
	nameless := toyTool("stamp_word", false, &applied)
	nameless.effect.(*sideEffect[toyArgs]).downstream = ""
	for name, ts := range map[string][]descriptor{
		"no schema":     {toyTool("unknown_word", false, &applied)},
		"twice":         {toyTool("stamp_word", false, &applied), toyTool("stamp_word", true, &applied)},
		"no downstream": {nameless},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := newWith(nil, v, Options{OutboxDir: t.TempDir()}, ts); err == nil {
				t.Errorf("newWith(%s) succeeded, want an error", name)
			}
		})
	}
}
