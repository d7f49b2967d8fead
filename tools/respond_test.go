package tools

import (
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/schemas"
)

var (
	allKinds = []ledger.DecisionKind{
		ledger.DecisionExecuted, ledger.DecisionClaimed, ledger.DecisionReplay, ledger.DecisionMismatch,
		ledger.DecisionBusy, ledger.DecisionHeld, ledger.DecisionApprovalRequested,
		ledger.DecisionSuspectedDuplicate, ledger.DecisionExpired, "a_kind_from_a_newer_build",
	}
	allStates = []ledger.State{
		ledger.StateInProgress, ledger.StateSucceeded, ledger.StateFailed, ledger.StateAwaitingApproval,
		ledger.StateUnknown, ledger.StateRejected, ledger.StateRetryable, "a_state_from_a_newer_build",
	}
)

// schemaEnum is an enum of the published output schema, by JSON pointer-ish path.
func schemaEnum(t *testing.T, path ...string) []string {
	t.Helper()
	var node any
	if err := json.Unmarshal(schemas.OutputSchema(), &node); err != nil {
		t.Fatal(err)
	}
	for _, p := range path {
		m, ok := node.(map[string]any)
		if !ok {
			t.Fatalf("result.json has no %v", path)
		}
		node = m[p]
	}
	var out []string
	for _, v := range node.([]any) {
		out = append(out, v.(string))
	}
	return out
}

// recordVariants are records in state st as the ledger may hand them
// over: with and without a saved error (documented or not), approval,
// result, tombstone.
func recordVariants(st ledger.State) map[string]*ledger.Record {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	base := func() *ledger.Record {
		return &ledger.Record{Tenant: "t1", Key: "k1", Tool: "create_order", State: st, Attempts: 1, FirstSeenAt: now}
	}
	bare := base()
	withErr := base()
	withErr.Error = &ledger.OpError{Code: "downstream_error", Message: "saved"}
	oddErr := base()
	oddErr.Error = &ledger.OpError{Code: "a_code_no_one_documented", Message: "saved"}
	full := base()
	full.Approval = &ledger.Approval{ID: "ap1", Status: "pending", Reason: "policy"}
	full.Result = json.RawMessage(`{"order":{"order_id":"o1"}}`)
	full.CompletedAt = now
	tomb := base()
	tomb.Tombstone = true
	tomb.CompletedAt = now
	tomb.Error = &ledger.OpError{Code: "forbidden"}
	return map[string]*ledger.Record{"bare": bare, "saved error": withErr, "undocumented code": oddErr, "approval and result": full, "tombstone": tomb}
}

// TestRespondIsTotal drives respond (and fromRecord) over every decision
// kind × record state and checks the rule every answer obeys: isError
// holds exactly when error is present, its code is a documented one, and
// next_action is in the published enum. Nothing panics.
func TestRespondIsTotal(t *testing.T) {
	codes := schemaEnum(t, "properties", "error", "properties", "code", "enum")
	if !slices.Equal(codes, errorCodes()) {
		t.Fatalf("errorCodes() = %v, want the schema's %v", errorCodes(), codes)
	}
	nexts := schemaEnum(t, "properties", "next_action", "enum")
	svc := &Service{log: slog.New(slog.DiscardHandler)}
	check := func(t *testing.T, what string, r *Response) {
		t.Helper()
		if r == nil {
			t.Fatalf("%s: nil answer", what)
		}
		if r.IsError != (r.Error != nil) {
			t.Errorf("%s: isError=%v but error=%+v", what, r.IsError, r.Error)
		}
		if r.Error != nil && (!slices.Contains(codes, r.Error.Code) || r.Error.Message == "") {
			t.Errorf("%s: error %+v has no documented code and message", what, r.Error)
		}
		if !slices.Contains(nexts, string(r.NextAction)) {
			t.Errorf("%s: next_action %q is not in the schema's enum", what, r.NextAction)
		}
		if r.Status == ledger.StateSucceeded && r.IsError && r.Error.Code != "key_expired" {
			t.Errorf("%s: a succeeded answer is an error: %+v", what, r.Error)
		}
	}
	for _, st := range allStates {
		for name, rec := range recordVariants(st) {
			t.Run(string(st)+"/"+name, func(t *testing.T) {
				check(t, "fromRecord", fromRecord(rec))
				for _, kind := range allKinds {
					d := ledger.Decision{Kind: kind, Record: rec}
					if kind == ledger.DecisionSuspectedDuplicate && name != "bare" {
						d.Earlier = &ledger.Record{Key: "k0", State: ledger.StateSucceeded, FirstSeenAt: rec.FirstSeenAt}
					}
					check(t, string(kind), svc.respond(d))
				}
			})
		}
	}
	t.Run("no record", func(t *testing.T) {
		for _, kind := range allKinds {
			check(t, string(kind), svc.respond(ledger.Decision{Kind: kind}))
		}
	})
}

// TestHeldInProgressIsOperationInProgress: a held record that another
// call has meanwhile claimed answers operation_in_progress with advice to
// poll — never isError without an error.
func TestHeldInProgressIsOperationInProgress(t *testing.T) {
	svc := &Service{log: slog.New(slog.DiscardHandler)}
	r := svc.respond(ledger.Decision{Kind: ledger.DecisionHeld, Record: &ledger.Record{Key: "k1", State: ledger.StateInProgress, Attempts: 2}})
	if !r.IsError || r.Error == nil || r.Error.Code != "operation_in_progress" || r.NextAction != NextWaitPoll {
		t.Fatalf("held in_progress = %+v %+v, want operation_in_progress / wait_and_poll_status", r, r.Error)
	}
}

// TestCheckedMends: an answer breaking the rule is mended, and says so.
func TestCheckedMends(t *testing.T) {
	tests := []struct {
		name string
		in   Response
		code string // "" means no error after mending
	}{
		{"isError without error", Response{Status: ledger.StateInProgress, IsError: true}, "operation_in_progress"},
		{"undocumented code", Response{Status: ledger.StateUnknown, IsError: true, Error: &ledger.OpError{Code: "weird", Message: "m"}}, "outcome_unknown"},
		{"error on a success", Response{Status: ledger.StateSucceeded, Error: &ledger.OpError{Code: "internal", Message: "m"}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			r, mended := checked(&in)
			if !mended {
				t.Errorf("not reported as mended")
			}
			if got := ""; r.Error != nil {
				got = r.Error.Code
				if got != tt.code {
					t.Errorf("code %q, want %q", got, tt.code)
				}
			} else if tt.code != "" {
				t.Errorf("no error, want %q", tt.code)
			}
		})
	}
	ok := Response{Status: ledger.StateSucceeded, NextAction: NextNone}
	if _, mended := checked(&ok); mended {
		t.Errorf("a good answer was mended")
	}
}

// TestEncodedIsMarshal: Encoded is json.Marshal of the response, also
// when it puts a record's result in as it is — a result with characters
// json.Marshal escapes, an empty object, a result replaced after the
// response was made from the record.
func TestEncodedIsMarshal(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	for _, result := range []string{`{"order":{"note":"<b>&amp;</b> \u2028 é","items":[1,2.5,-3e10]}}`, `{}`, `[]`, `"x"`} {
		b, err := json.Marshal(json.RawMessage(result)) // as the ledger stores it
		if err != nil {
			t.Fatal(err)
		}
		recs := []*ledger.Record{
			{Key: "k1", State: ledger.StateSucceeded, Result: b, Attempts: 1, FirstSeenAt: at, CompletedAt: at},
			{Key: "k2", State: ledger.StateFailed, Result: b, Error: &ledger.OpError{Code: "downstream_error", Message: "<no>"}, Attempts: 2,
				Approval: &ledger.Approval{ID: "apr_1", Status: ledger.ApprovalApproved, Resource: json.RawMessage(`{"a":1}`)}},
		}
		for _, rec := range recs {
			for _, replayed := range []bool{false, true} {
				r := fromRecord(rec)
				r.Replayed = replayed
				want, err := json.Marshal(r)
				if err != nil {
					t.Fatal(err)
				}
				got, err := r.Encoded()
				if err != nil || string(got) != string(want) {
					t.Errorf("Encoded = %s, %v; want %s", got, err, want)
				}
			}
		}
		r := fromRecord(recs[0])
		r.Result = json.RawMessage(" {\"changed\" : true} ") // not the record's bytes: encoded afresh
		if got, err := r.Encoded(); err != nil || !strings.Contains(string(got), `"result":{"changed":true}`) {
			t.Errorf("a replaced result encoded as %s, %v", got, err)
		}
	}
}
