package ledger

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// TestSealIsMarshal: the bytes seal stores are json.Marshal of the sealed
// entry, byte for byte, and verify — for entries of every shape, text that
// is not valid UTF-8 and characters JSON escapes included.
func TestSealIsMarshal(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 123, time.UTC)
	entries := []AuditEntry{
		{Seq: 1, At: at, Event: EventCall},
		{Seq: 2, At: at, Event: EventCall, Actor: Actor{Tenant: "t", Principal: "p<&>\u2028"}, Tool: "create_order", Key: "k",
			Decision: AuditDecision(DecisionReplay), StateAfter: StateSucceeded, Attempt: 1, Replayed: true,
			ResponseSHA256: "ab", DurationMS: 0.25, PolicyRule: "r", PolicyAction: "allow"},
		{Seq: 3, At: at, Event: EventTransition, Key: "k", Decision: AuditExecuted, StateAfter: StateSucceeded,
			Call: &DownstreamCall{System: "embedded", OrderID: "ord_1", Version: 1, MessageIDs: []string{"m1"}}},
		{Seq: 4, At: at, Event: EventCall, Actor: Actor{ClientName: "bad \xff\xfe utf-8"}, Detail: "x\xc3"},
		{Seq: 5, At: at, Event: EventAuditPruned, PrunedThrough: &AuditAnchor{Seq: 3, Hash: "h"}},
	}
	prev := ""
	for _, e := range entries {
		stored, err := e.seal(prev)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(stored, want) {
			t.Errorf("entry %d: sealed\n%s\nwant\n%s", e.Seq, stored, want)
		}
		var back AuditEntry
		if err := json.Unmarshal(stored, &back); err != nil {
			t.Fatal(err)
		}
		if err := back.verifyChain(prev); err != nil {
			t.Errorf("entry %d as stored: %v", e.Seq, err)
		}
		prev = e.Hash
	}
}

// oldPairLog is a create (its executed transition, then its answer
// entry) and a replay (a call entry, then an answer entry) exactly as the
// build before one entry per call wrote them.
var oldPairLog = []string{
	`{"seq":1,"at":"2026-12-01T12:00:00Z","event":"transition","actor":{"tenant":"t1","principal":"alice","request_id":"7","session_id":"stdio-1"},"tool":"create_order","key":"k1","fingerprint":"fp","decision":"executed","state_after":"succeeded","attempt":1,"downstream":"embedded","policy_rule":"default_allow","policy_action":"allow","downstream_call":{"system":"embedded","attempt":1,"duration_ms":0.2,"order_id":"ord_1","version":1},"prev_hash":"","hash":"09ecb10e5bed5b1debc409f415683c1999a4ecadb7be264b27bdff6066559a66"}`,
	`{"seq":2,"at":"2026-12-01T12:00:00Z","event":"answer","actor":{"tenant":"t1","principal":"alice","request_id":"7","session_id":"stdio-1"},"tool":"create_order","key":"k1","state_after":"succeeded","attempt":1,"duration_ms":1.5,"policy_rule":"default_allow","policy_action":"allow","response_sha256":"aa","prev_hash":"09ecb10e5bed5b1debc409f415683c1999a4ecadb7be264b27bdff6066559a66","hash":"76db84a207eb99c8a228247f75aff8206aa66b7bc72bc759d602f3ec8af73435"}`,
	`{"seq":3,"at":"2026-12-01T12:00:00Z","event":"call","actor":{"tenant":"t1","principal":"alice","request_id":"7","session_id":"stdio-1"},"tool":"create_order","key":"k1","decision":"replay","state_after":"succeeded","attempt":1,"policy_rule":"default_allow","policy_action":"allow","prev_hash":"76db84a207eb99c8a228247f75aff8206aa66b7bc72bc759d602f3ec8af73435","hash":"6cf3a56967908439e09930e8bba917df6d0e3500aeb6cdf6330131c888eeb6e7"}`,
	`{"seq":4,"at":"2026-12-01T12:00:00Z","event":"answer","actor":{"tenant":"t1","principal":"alice","request_id":"7","session_id":"stdio-1"},"tool":"create_order","key":"k1","state_after":"succeeded","attempt":1,"duration_ms":0.3,"policy_rule":"default_allow","policy_action":"allow","replayed":true,"response_sha256":"bb","prev_hash":"6cf3a56967908439e09930e8bba917df6d0e3500aeb6cdf6330131c888eeb6e7","hash":"91d8650316d27882b0e70338e6841c1d4db8b369b5d168908a910e1db9d552eb"}`,
}

// TestOldPairLogVerifies: entries written in the earlier form (a call or
// transition and an answer entry per call) still verify byte for byte,
// and sealing them again gives the same bytes.
func TestOldPairLogVerifies(t *testing.T) {
	prev := ""
	for i, line := range oldPairLog {
		var e AuditEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatal(err)
		}
		if err := e.verifyChain(prev); err != nil {
			t.Errorf("entry %d: %v", i+1, err)
		}
		again := e
		stored, err := again.seal(prev)
		if err != nil || string(stored) != line {
			t.Errorf("entry %d sealed again = %s, %v; want the bytes written", i+1, stored, err)
		}
		prev = e.Hash
	}
}
