package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// AuditEntry is one line of the audit log: a tool call (accepted, replayed
// or refused), a state transition, or the answer a side-effecting call was
// sent. Seq, PrevHash and Hash are set by the store when the entry is
// appended.
//
// Its Event is one of the AuditEvent constants (EventCall, EventTransition,
// EventAnswer, and the sweep's, the operator's and the prune's own), its
// Decision an AuditDecision; code that classifies entries compares them
// with those constants (and AuditEntry.Is), never with other text.
//
// Every field added after the first release is omitted when empty, so the
// JSON of an entry written before — and with it the hash chain — is
// unchanged.
type AuditEntry struct {
	Seq         uint64        `json:"seq"`
	At          time.Time     `json:"at"`
	Event       AuditEvent    `json:"event"`
	Actor       Actor         `json:"actor"`
	Tool        string        `json:"tool,omitempty"`
	Key         string        `json:"key,omitempty"`
	Fingerprint string        `json:"fingerprint,omitempty"`
	Decision    AuditDecision `json:"decision,omitempty"` // what the ledger or policy decided
	StateBefore State         `json:"state_before,omitempty"`
	StateAfter  State         `json:"state_after,omitempty"`
	Attempt     int           `json:"attempt,omitempty"`
	Downstream  string        `json:"downstream,omitempty"`
	DurationMS  float64       `json:"duration_ms,omitempty"`
	ErrorCode   string        `json:"error_code,omitempty"`
	Detail      string        `json:"detail,omitempty"`
	// PolicyRule and PolicyAction are the policy check of the call: the
	// rule that decided and its action (allow, approve, deny).
	PolicyRule   string `json:"policy_rule,omitempty"`
	PolicyAction string `json:"policy_action,omitempty"`
	// ApprovalID, ApprovalStatus and Approver describe the operation's
	// approval when it has one: on the entries after an approval, the
	// approval that authorised the execution and who decided it.
	ApprovalID     string `json:"approval_id,omitempty"`
	ApprovalStatus string `json:"approval_status,omitempty"`
	Approver       string `json:"approver,omitempty"`
	// Call is what the operation did at its downstream, on the transition
	// that recorded its outcome.
	Call *DownstreamCall `json:"downstream_call,omitempty"`
	// Replayed and ResponseSHA256 are on answer entries (ResponseSHA256
	// also on refusals): whether the answer was a replay, and the SHA-256
	// (hex) of the tool result's JSON text as sent to the client.
	Replayed       bool   `json:"replayed,omitempty"`
	ResponseSHA256 string `json:"response_sha256,omitempty"`
	// Settled is how a transition out of unknown settled the operation
	// (see SettledHow).
	Settled Settlement `json:"settled,omitempty"`
	// PrunedThrough is on EventAuditPruned entries: the anchor that prune
	// set (the last entry it removed), which verification compares with
	// the stored anchor.
	PrunedThrough *AuditAnchor `json:"pruned_through,omitempty"`
	PrevHash      string       `json:"prev_hash"`
	Hash          string       `json:"hash"`

	// recordSeq, when set, is the number this entry's record holds for it
	// (Record.AuditSeqs): appendAudit then writes no per-key index entry.
	recordSeq uint64
}

// DownstreamCall is what one execution of an operation did at its
// downstream, for the audit: the HTTP request to the order API, or the
// writes to the embedded store and the outbox.
type DownstreamCall struct {
	// System is "embedded" (the order store in the ledger's file),
	// "outbox" (a notification queued) or "orders_api".
	System string `json:"system"`
	// Method, Path and Status are the order API's HTTP request and answer
	// (Status 0: no answer was received).
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	Status int    `json:"status,omitempty"`
	// Attempt is the operation's attempt this call was (1 for the first).
	Attempt    int     `json:"attempt,omitempty"`
	DurationMS float64 `json:"duration_ms,omitempty"`
	// Failure is the class of a failed order API call: not_sent,
	// definitive or indeterminate.
	Failure string `json:"failure,omitempty"`
	// OrderID and Version are the order written (embedded store) or
	// returned (order API); MessageIDs the outbox messages queued in the
	// same transaction.
	OrderID    string   `json:"order_id,omitempty"`
	Version    int      `json:"version,omitempty"`
	MessageIDs []string `json:"message_ids,omitempty"`
}

// chain fills e's PrevHash and Hash from the previous entry's hash. The
// hash covers the entry's JSON with Hash empty; JSON of a Go struct has a
// fixed field order, so the encoding is stable.
func (e *AuditEntry) chain(prevHash string) error {
	_, err := e.seal(prevHash)
	return err
}

// seal is chain, and returns the entry's JSON as it is stored — the
// bytes json.Marshal gives for it — made from the bytes it hashed, with
// the hash put in place of the empty "hash" (the last field), so an entry
// is encoded once, not twice.
func (e *AuditEntry) seal(prevHash string) ([]byte, error) {
	e.PrevHash = prevHash
	e.Hash = ""
	b, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	if bytes.Contains(b, []byte(`\ufffd`)) {
		// Text that is not valid UTF-8 is written as \ufffd but read back
		// as U+FFFD, which encodes differently: hash (and store) the entry
		// as a reader will decode it, or it would never verify.
		var n AuditEntry
		if err := json.Unmarshal(b, &n); err != nil {
			return nil, err
		}
		*e = n
		if b, err = json.Marshal(e); err != nil {
			return nil, err
		}
	}
	sum := sha256.Sum256(b)
	e.Hash = hex.EncodeToString(sum[:])
	const emptyHash = `"hash":""}`
	if !bytes.HasSuffix(b, []byte(emptyHash)) {
		return json.Marshal(e) // not the layout above: encode it again
	}
	out := make([]byte, 0, len(b)+len(e.Hash))
	out = append(out, b[:len(b)-2]...) // up to and with the opening quote of the hash
	out = append(out, e.Hash...)
	return append(out, `"}`...), nil
}

// verifyChain checks that e links to prevHash and that its hash is its own.
func (e AuditEntry) verifyChain(prevHash string) error {
	if e.PrevHash != prevHash {
		return fmt.Errorf("audit entry %d: prev_hash %.12s… does not match the previous entry's hash %.12s…", e.Seq, e.PrevHash, prevHash)
	}
	want := e.Hash
	if err := e.chain(prevHash); err != nil {
		return err
	}
	if e.Hash != want {
		return fmt.Errorf("audit entry %d: content does not match its hash (edited after it was written)", e.Seq)
	}
	return nil
}

// transitionEntry is the audit entry of a state change of rec.
func transitionEntry(now time.Time, a Actor, rec *Record, before State, decision AuditDecision) AuditEntry {
	e := AuditEntry{
		At: now, Event: EventTransition, Actor: a, Tool: rec.Tool, Key: rec.Key,
		Fingerprint: rec.Fingerprint, Decision: decision, StateBefore: before,
		StateAfter: rec.State, Attempt: rec.Attempts,
	}
	e.Actor.Tenant = rec.Tenant
	e.Downstream = rec.Downstream
	if rec.Error != nil {
		e.ErrorCode = rec.Error.Code
	}
	e.noteApproval(rec)
	return e
}

// noteApproval copies rec's approval, if any, onto e.
func (e *AuditEntry) noteApproval(rec *Record) {
	if a := rec.Approval; a != nil {
		e.ApprovalID, e.ApprovalStatus, e.Approver = a.ID, a.Status, a.DecidedBy
	}
}

// withCall puts an outcome's downstream call on a transition entry.
func withCall(c *DownstreamCall) func(*AuditEntry) {
	return func(e *AuditEntry) {
		if c != nil {
			cc := *c
			cc.MessageIDs = append([]string(nil), c.MessageIDs...)
			e.Call = &cc
		}
	}
}

// policyOf puts a claim's policy check on an entry.
func (c Claim) policyOf(e *AuditEntry) {
	e.PolicyRule, e.PolicyAction = c.PolicyRule, c.PolicyAction
}

// Answer is what a tool call was answered, as the audit records it: the
// facts an EventAnswer entry holds (AnswerEntry), which the entry of the
// call's own decision, or of its outcome, carries instead when the answer
// is known as that entry is written (Claim.Answer, Outcome.Answer).
type Answer struct {
	State    State
	Attempt  int
	Replayed bool
	// ErrorCode is the answer's error code ("" for none).
	ErrorCode string
	// ResponseSHA256 is the SHA-256 (hex) of the result's JSON text as
	// sent to the client.
	ResponseSHA256 string
	// DurationMS is the time from the call's start to its answer. On an
	// entry written in the call's transaction (a claim that ran, a
	// completion) the answer is built before that transaction commits:
	// the commit is not counted.
	DurationMS                           float64
	ApprovalID, ApprovalStatus, Approver string
	PolicyRule, PolicyAction             string
}

// AnswerFunc is Claim.Answer: the answer the caller will send for d, or
// nil when d does not settle it yet (the caller then writes an
// EventAnswer entry once it knows). It may be called more than once for
// one claim (a transaction run again), and from inside the ledger's
// write transaction: it must not block or call the store.
type AnswerFunc func(d Decision) *Answer

// OutcomeAnswer is Outcome.Answer: how a caller that records an outcome
// with Complete or Settle — a claim that called out with no transaction
// open — has the outcome's transition entry carry the call's answer.
// It is used by one call, not concurrently.
type OutcomeAnswer struct {
	// For is asked for the answer to the recorded outcome, as the
	// DecisionExecuted of the record as it will be committed; the rules
	// of AnswerFunc apply (called inside the write transaction, maybe
	// more than once).
	For AnswerFunc
	// Taken is set by Complete and Settle: true when they succeeded and
	// the outcome's entry carries the answer For last gave, so the caller
	// sends that answer and writes no EventAnswer entry; false when the
	// answer contradicted the entry (takeAnswer), For gave nil, or the
	// call failed.
	Taken bool
}

// onto is an option of saveTransition that recording rec's outcome
// takes: the entry takes the answer For gives for rec, and *ok reports
// whether it did. A nil OutcomeAnswer asks nothing.
func (a *OutcomeAnswer) onto(rec *Record, ok *bool) func(*AuditEntry) {
	return func(e *AuditEntry) {
		*ok = a != nil && a.For != nil && e.takeAnswer(a.For(Decision{Kind: DecisionExecuted, Record: rec}))
	}
}

// settle sets Taken once the outcome's transaction has ended with err.
func (a *OutcomeAnswer) settle(taken bool, err error) {
	if a != nil {
		a.Taken = taken && err == nil
	}
}

// AnswerEntry is the EventAnswer entry of a call of tool about key that
// was answered a: the form for a call whose decision's entry could not
// carry its answer (see Claim.Answer).
func AnswerEntry(actor Actor, tool, key string, a Answer) AuditEntry {
	e := AuditEntry{Event: EventAnswer, Actor: actor, Tool: tool, Key: key}
	e.putAnswer(a)
	return e
}

// putAnswer sets a's fields on e.
func (e *AuditEntry) putAnswer(a Answer) {
	e.StateAfter, e.Attempt, e.Replayed, e.ErrorCode = a.State, a.Attempt, a.Replayed, a.ErrorCode
	e.ResponseSHA256, e.DurationMS = a.ResponseSHA256, a.DurationMS
	e.ApprovalID, e.ApprovalStatus, e.Approver = a.ApprovalID, a.ApprovalStatus, a.Approver
	e.PolicyRule, e.PolicyAction = a.PolicyRule, a.PolicyAction
}

// takeAnswer puts a on e, a call's or a transition's entry, when no fact
// of a contradicts one e already holds (a mismatch's entry names the
// operation's state, its answer "rejected": those stay two entries), and
// reports whether it did. Fields e leaves empty take a's.
func (e *AuditEntry) takeAnswer(a *Answer) bool {
	if a == nil || e.ResponseSHA256 != "" || e.Replayed || e.DurationMS != 0 {
		return false
	}
	agree := func(have, want string) bool { return have == "" || want == "" || have == want }
	if !agree(string(e.StateAfter), string(a.State)) || (e.Attempt != 0 && a.Attempt != 0 && e.Attempt != a.Attempt) ||
		!agree(e.ErrorCode, a.ErrorCode) || !agree(e.ApprovalID, a.ApprovalID) || !agree(e.ApprovalStatus, a.ApprovalStatus) ||
		!agree(e.Approver, a.Approver) || !agree(e.PolicyRule, a.PolicyRule) || !agree(e.PolicyAction, a.PolicyAction) {
		return false
	}
	m := *e
	m.putAnswer(*a)
	fill := func(have *string, was string) {
		if *have == "" {
			*have = was
		}
	}
	fill((*string)(&m.StateAfter), string(e.StateAfter))
	fill(&m.ErrorCode, e.ErrorCode)
	fill(&m.ApprovalID, e.ApprovalID)
	fill(&m.ApprovalStatus, e.ApprovalStatus)
	fill(&m.Approver, e.Approver)
	fill(&m.PolicyRule, e.PolicyRule)
	fill(&m.PolicyAction, e.PolicyAction)
	if m.Attempt == 0 {
		m.Attempt = e.Attempt
	}
	*e = m
	return true
}

// answered is an option of saveTransition (and the call entry's): the
// entry takes the answer c.Answer gives for d, and *ok reports whether
// it did.
func (c Claim) answered(d Decision, ok *bool) func(*AuditEntry) {
	return func(e *AuditEntry) {
		*ok = c.Answer != nil && e.takeAnswer(c.Answer(d))
	}
}
