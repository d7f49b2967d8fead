package ledger

import (
	"context"
	"encoding/json"
	"time"
)

// State is the execution state of an operation (DESIGN §3).
type State string

// The states of a record.
const (
	StateInProgress       State = "in_progress"
	StateSucceeded        State = "succeeded"
	StateFailed           State = "failed"
	StateAwaitingApproval State = "awaiting_approval"
	StateUnknown          State = "unknown"
	StateRejected         State = "rejected"
	StateRetryable        State = "retryable"
)

// Final reports whether s is a final state, whose result is replayed.
func (s State) Final() bool {
	return s == StateSucceeded || s == StateFailed || s == StateRejected
}

// ResultFormat is the version of the record and saved result encoding
// written by this build (recordenc.go). Records carry the format they
// were written with, so that a build refuses (ErrSchemaVersion) a record
// of a newer format instead of replaying a result it does not understand,
// and a newer build knows what it reads. Version 1 is the format as reset
// before 1.0: the development formats before it are not read.
const ResultFormat = 1

// OpError is a saved, model-facing error of an operation. Code is one
// of the documented codes (Codes); test it with Code.Is.
type OpError struct {
	Code    string          `json:"code"`
	Message string          `json:"message"`
	Details json.RawMessage `json:"details,omitempty"`
}

// Approval is the approval request that holds an awaiting_approval record,
// and after a decision, the record of who decided what. It is bound to its
// record's tenant, key and fingerprint, and to ResourceVersion, the version
// of the resource the diff was computed from.
type Approval struct {
	ID              string          `json:"approval_id"`
	Status          string          `json:"status"` // pending, approved, rejected, expired
	Reason          string          `json:"reason"` // policy, suspected_duplicate, …
	Rule            string          `json:"rule,omitempty"`
	EarlierKey      string          `json:"earlier_operation_key,omitempty"`
	RequestedBy     string          `json:"requested_by,omitempty"`
	ResourceVersion int             `json:"resource_version,omitempty"`
	Diff            json.RawMessage `json:"diff,omitempty"`
	DiffText        string          `json:"diff_text,omitempty"`
	CreatedAt       time.Time       `json:"created_at"`
	ExpiresAt       time.Time       `json:"expires_at"`
	DecidedBy       string          `json:"decided_by,omitempty"`
	DecidedAt       time.Time       `json:"decided_at,omitzero"`
	Comment         string          `json:"comment,omitempty"`
	// Resource is the resource the operation acts on as it was when the
	// approval was asked, as JSON — for a change or a cancel, the order at
	// ResourceVersion — so approvers see it as data, not only in DiffText.
	// Empty when there is none (a create's diff is the whole new order)
	// and in approvals recorded before it was kept.
	Resource json.RawMessage `json:"resource,omitempty"`
}

// Approval statuses.
const (
	ApprovalPending  = "pending"
	ApprovalApproved = "approved"
	ApprovalRejected = "rejected"
	ApprovalExpired  = "expired"
	// ApprovalSuperseded: the operation was settled (reconciled, resolved)
	// while its approval was pending; the approval can no longer be used.
	ApprovalSuperseded = "superseded"
)

// Record is the ledger row of one (tenant, key).
type Record struct {
	Tenant      string `json:"tenant"`
	Key         string `json:"key"`
	Tool        string `json:"tool"`
	Fingerprint string `json:"fingerprint"`
	State       State  `json:"state"`
	Attempts    int    `json:"attempts"`
	Generation  uint64 `json:"generation"`
	// Incarnation tells apart the operations that have used this key: an
	// id fixed when the record is created and never changed by retries,
	// re-runs or approvals — its creation time, then random bits (see
	// IncarnationTime; 16 random hex digits in records written before). A key is free again once its tombstone
	// is deleted, and an operation under it then is a new one, with a new
	// incarnation; downstream identities (order ids, message ids, the
	// order API's Idempotency-Key) are derived from key and incarnation.
	// Empty in records written before it existed: their identities are
	// derived from the key alone, as they were then.
	Incarnation   string          `json:"incarnation,omitempty"`
	LeaseOwner    string          `json:"lease_owner,omitempty"`
	LeaseExpires  time.Time       `json:"lease_expires_at,omitzero"`
	OnLeaseExpiry State           `json:"on_lease_expiry,omitempty"`
	Principal     string          `json:"principal"`
	Args          json.RawMessage `json:"args,omitempty"`       // the validated request, kept while it may still run: dropped when the record reaches a final state (its Fingerprint stands for it)
	Downstream    string          `json:"downstream,omitempty"` // where its side effect goes: "embedded" or "orders_api <url>"
	ResultFormat  int             `json:"result_format,omitempty"`
	Result        json.RawMessage `json:"result,omitempty"`
	Error         *OpError        `json:"error,omitempty"`
	Summary       string          `json:"summary,omitempty"`
	DownstreamRef string          `json:"downstream_ref,omitempty"`
	Approval      *Approval       `json:"approval,omitempty"`
	Tombstone     bool            `json:"tombstone,omitempty"`
	FirstSeenAt   time.Time       `json:"first_seen_at"`
	UpdatedAt     time.Time       `json:"updated_at"`
	CompletedAt   time.Time       `json:"completed_at,omitzero"`
	// AuditSeqs are the sequence numbers of the newest audit entries
	// written in the same transaction as this record (its transitions), at
	// most maxRecordAuditSeqs of them: AuditForKey finds those entries here
	// instead of in the per-key audit index, so a transition writes no
	// randomly keyed index entry. Older ones, and every entry written
	// without the record (calls, replays, refusals), are in the index.
	AuditSeqs []uint64 `json:"audit_seqs,omitempty"`
	// Fresh is true, and never stored, while the claim that created this
	// record runs (its ApplyFunc included): the record and its
	// Incarnation did not exist before that transaction, so no id derived
	// from the incarnation (an order's, a message's) can name anything
	// stored yet, and a create may write such an id without first reading
	// whether it is free; and no waiter can be watching the record, so
	// its first write sends no change notice (on PostgreSQL each read is
	// a round trip, and the notice a statement). False everywhere else: in
	// a re-run, an approved run, a completion, and in the Decision.
	Fresh bool `json:"-"`
}

// Actor is who made a call, for records and audit entries. Tenant,
// Principal and Role are the authenticated identity (the bearer token, or
// the stdio process's configuration). Client names and ClientStated are
// self-reported by the client: recorded, never trusted for identity.
type Actor struct {
	Tenant        string `json:"tenant"`
	Principal     string `json:"principal"`
	Role          string `json:"role,omitempty"`
	ClientName    string `json:"client_name,omitempty"`
	ClientVersion string `json:"client_version,omitempty"`
	// RequestID is the JSON-RPC id of the tools/call request (numbers in
	// decimal, strings as sent; at most 64 bytes).
	RequestID string `json:"request_id,omitempty"`
	// Trace is the W3C traceparent the client sent in _meta, when it is
	// well-formed.
	Trace string `json:"trace,omitempty"`
	// TraceID and SpanID name the OpenTelemetry trace and the server span
	// of the call (hex), when the server traces its calls: the trace the
	// traceparent named, or a new one.
	TraceID string `json:"trace_id,omitempty"`
	SpanID  string `json:"span_id,omitempty"`
	// SessionID is the MCP session (Streamable HTTP: Mcp-Session-Id) or,
	// over stdio, an id the process generates at start.
	SessionID string `json:"session_id,omitempty"`
	// OnBehalfOf and Model are the user the agent acts for and the model
	// driving it, as the operator configured them: on the bearer token
	// (tokens add --on-behalf-of --model) or the stdio server
	// (serve --on-behalf-of --model).
	OnBehalfOf string `json:"on_behalf_of,omitempty"`
	Model      string `json:"model,omitempty"`
	// ClientStated is what the client said about itself in the request's
	// _meta: recorded as stated, never checked.
	ClientStated *ClientStated `json:"client_stated,omitempty"`
	// AuthClient and AuthIssuer are, for a caller with an OAuth access
	// token, the client the token was issued to (azp or client_id) and
	// the authorization server that issued it: vouched for by that
	// server, unlike ClientName, which the session stated.
	AuthClient string `json:"auth_client,omitempty"`
	AuthIssuer string `json:"auth_issuer,omitempty"`
}

// ClientStated is what a client claims in a request's _meta
// (idemgate/on_behalf_of, idemgate/model). Nobody verified it: it is not an
// identity.
type ClientStated struct {
	OnBehalfOf string `json:"on_behalf_of,omitempty"`
	Model      string `json:"model,omitempty"`
}

// Claim asks the ledger to run one operation.
type Claim struct {
	Actor       Actor
	Key         string
	Tool        string
	Fingerprint string
	// OnLeaseExpiry is the state an in_progress record takes when its lease
	// expires: StateRetryable when the side effect cannot have happened
	// without the ledger knowing (embedded store), StateUnknown otherwise.
	OnLeaseExpiry State
	// SuspectDuplicates, when true, holds a new key whose fingerprint equals
	// a recent operation of the same tenant (within Options.SuspectWindow)
	// as awaiting_approval instead of running it.
	SuspectDuplicates bool
	// RequireApproval holds a new operation as awaiting_approval instead of
	// running it; Proposal.Reason and Rule say why.
	RequireApproval bool
	// Proposal is the approval request created when the operation is held:
	// its diff, text, rule and resource version. The ledger sets ID,
	// status, requester and times.
	Proposal *Approval
	// BuildProposal, when Proposal is nil, builds it: it is called only
	// when the claim creates an awaiting_approval record, so a call the
	// ledger answers from an existing record (a replay) never builds one.
	BuildProposal func() *Approval
	// Args is the validated request, saved with the record so that a later
	// run — an approver's decision, a re-run after an unknown outcome — can
	// perform exactly it. Dropped when the operation reaches a final state
	// (succeeded, failed, rejected), which never runs again.
	Args json.RawMessage
	// PolicyRule names the policy rule that decided the call, and
	// PolicyAction its action (allow, approve), for the audit.
	PolicyRule   string
	PolicyAction string
	// Downstream names where the side effect goes ("embedded", or
	// "orders_api <base URL>"). It is saved in a new record; running an
	// existing record again from a process configured for another
	// downstream is refused with ErrDownstreamMismatch.
	Downstream string
	// OnHeld, when set, runs inside the transaction that creates the
	// record's pending approval (RequireApproval, or a suspected
	// duplicate), after the record is written: its writes (the approvers'
	// notice in the outbox) commit with the approval request or not at
	// all. An error rolls the whole claim back.
	OnHeld HeldFunc
	// Answer, when set, gives the answer the caller will send for the
	// decision, so that the decision's own audit entry — the call entry of
	// an answer from the record (a replay), or the transition of a claim
	// that ran or was held in its transaction — records it too, and the
	// call leaves one entry instead of two (Decision.Answered).
	Answer AnswerFunc
}

// HeldFunc runs inside the transaction that creates rec's pending
// approval (rec.Approval); see Claim.OnHeld and SettleRequest.OnHeld.
type HeldFunc func(tx Tx, rec *Record) error

// SettleRequest moves a record that no caller owns (unknown, or in_progress
// with an expired lease, or retryable) to the outcome that reconciliation
// with the downstream, or a person with evidence, established.
type SettleRequest struct {
	Actor Actor
	Key   string
	// From lists the states the record may be in; any other is
	// ErrWrongState.
	From []State
	// Outcome is the new state and its result: StateSucceeded or
	// StateFailed (final), StateRetryable (proven not executed),
	// StateUnknown, or StateAwaitingApproval (a re-run needs a human:
	// Proposal describes it).
	Outcome  Outcome
	Proposal *Approval
	// Why is recorded in the audit entry: the evidence, or what the
	// reconciliation found.
	Why string
	// How is how an unknown outcome was settled, written on the audit
	// entry (AuditEntry.Settled) when the record leaves unknown; empty is
	// SettledOther.
	How Settlement
	// OnHeld, when set and Outcome.State is StateAwaitingApproval, runs
	// inside the transaction that creates the new pending approval (see
	// Claim.OnHeld).
	OnHeld HeldFunc
}

// DecideRequest is an approver's decision on a pending approval.
type DecideRequest struct {
	Approver   Actor
	ApprovalID string
	Approve    bool
	Comment    string
	Downstream string // the deciding process's downstream; must match the record's to approve
}

// Outcome is what a side effect produced.
type Outcome struct {
	State         State // StateSucceeded or StateFailed (StateUnknown, StateRetryable for Complete)
	Result        json.RawMessage
	Error         *OpError
	Summary       string // kept in the tombstone after retention, e.g. "order ord_…"
	DownstreamRef string
	// Also, when set, runs inside the transaction that records a
	// succeeded outcome (Complete, Settle): the writes of the steps that
	// follow — an order's confirmation in the outbox — commit with it.
	Also func(tx Tx) error
	// Call, when set, is what the side effect did at its downstream; it is
	// written on the audit entry that records the outcome (read after Also
	// has run, so Also may add to it).
	Call *DownstreamCall
	// Answer, when set, asks for the answer the caller will send for the
	// outcome (Complete and Settle; Execute's and Decide's use
	// Claim.Answer or none), so that the transition entry recording it
	// carries the answer too, by Claim.Answer's rule, and the call leaves
	// no answer entry of its own (OutcomeAnswer.Taken).
	Answer *OutcomeAnswer
}

// DecisionKind says what a claim decided.
type DecisionKind string

// The decisions of a claim.
const (
	// DecisionExecuted: the operation ran now (Execute) and Record holds its outcome.
	DecisionExecuted DecisionKind = "executed"
	// DecisionClaimed: the caller owns the in_progress record (Claim) and must Complete it.
	DecisionClaimed DecisionKind = "claimed"
	// DecisionReplay: the record is final; its saved result is the answer.
	DecisionReplay DecisionKind = "replay"
	// DecisionMismatch: the key is in use with another tool or fingerprint.
	DecisionMismatch DecisionKind = "mismatch"
	// DecisionBusy: another executor holds a live lease.
	DecisionBusy DecisionKind = "busy"
	// DecisionHeld: the record awaits approval or reconciliation; nothing ran.
	DecisionHeld DecisionKind = "held"
	// DecisionApprovalRequested: a new record was created awaiting
	// approval because the claim required it.
	DecisionApprovalRequested DecisionKind = "approval_requested"
	// DecisionSuspectedDuplicate: a new record was created awaiting approval
	// because Earlier has the same fingerprint under another key.
	DecisionSuspectedDuplicate DecisionKind = "suspected_duplicate"
	// DecisionExpired: only a tombstone is left; the result is gone.
	DecisionExpired DecisionKind = "expired"
)

// Decision is the answer of a claim.
type Decision struct {
	Kind    DecisionKind
	Record  *Record
	Earlier *Record // for DecisionSuspectedDuplicate
	// Answered reports that the audit entry of this decision carries the
	// answer Claim.Answer gave for it: the caller writes no EventAnswer
	// entry for the call.
	Answered bool

	refusal error // Decide: the sentinel returned beside the decision
}

// Tx is a transaction on the ledger's store, given to downstreams that keep
// their data beside the ledger (the embedded order store, the outbox) so
// their writes commit or roll back with the ledger's transition. Keys and
// collection names are opaque strings. Values returned by Get and Scan are
// only valid inside the transaction.
type Tx interface {
	Get(collection, key string) ([]byte, error)
	Put(collection, key string, value []byte) error
	Delete(collection, key string) error
	// Scan calls fn for each key with the prefix, in key order (or reverse
	// order), until fn returns false or an error.
	Scan(collection, prefix string, reverse bool, fn func(key string, value []byte) (bool, error)) error
	// Now is the ledger clock's time for this transaction.
	Now() time.Time
}

// ApplyFunc performs an operation's side effect inside the claim's
// transaction. A returned error rolls back everything, claim included, so
// the operation leaves no record; an Outcome with StateFailed is a
// definitive failure that is saved and replayed.
type ApplyFunc func(tx Tx, rec *Record) (Outcome, error)

// Filter selects records for List.
type Filter struct {
	Tenant string // "" lists every tenant (operator use)
	State  State  // "" lists every state
	Limit  int    // <= 0 means 100
	// After, when not empty, lists only records older than this position
	// (ListPosition of the previous page's last record).
	After string
}

// Store is the ledger. Every method is safe for concurrent use by many
// goroutines, and — over a backend shared by processes, such as the bbolt
// file — by many processes, with the same guarantees. [Ledger] implements
// it over any [Backend].
type Store interface {
	// Execute claims c and, when the claim is new or a retryable re-run,
	// runs apply in the same transaction. Returns the decision; errors are
	// ErrKeyNotIssued, ErrClosed, context errors, or internal errors.
	Execute(ctx context.Context, c Claim, apply ApplyFunc) (Decision, error)
	// Claim is Execute without a side effect: a new claim leaves an
	// in_progress record with a lease, and DecisionClaimed.
	Claim(ctx context.Context, c Claim) (Decision, error)
	// Complete records the outcome of a claimed operation. It returns
	// ErrStaleGeneration when gen is not the record's current generation or
	// the record is no longer in_progress.
	Complete(ctx context.Context, actor Actor, key string, gen uint64, out Outcome) (*Record, error)
	// RenewLease extends a live lease; ErrStaleGeneration as for Complete.
	RenewLease(ctx context.Context, tenant, key string, gen uint64) error
	// Get returns the record of (tenant, key), as a tombstone when its
	// retention has passed, or ErrNotFound. It never writes.
	Get(ctx context.Context, tenant, key string) (*Record, error)
	// List returns records, newest first (by first-seen time, then tenant
	// and key): at most f.Limit, older than f.After when set.
	List(ctx context.Context, f Filter) ([]*Record, error)
	// IssueKey remembers that key was handed out to tenant.
	IssueKey(ctx context.Context, tenant, key string) error
	// View and Update run fn in a read-only or read-write transaction on
	// the downstream collections.
	View(ctx context.Context, fn func(Tx) error) error
	Update(ctx context.Context, fn func(Tx) error) error
	// Decide applies an approver's decision, atomically: approving moves the
	// approval to approved and the operation to in_progress, and runs apply
	// (when not nil) in the same transaction; rejecting makes the operation
	// rejected. Errors: ErrNotFound (no such approval in the approver's
	// tenant), ErrAlreadyDecided (with the record as it stands in the
	// returned Decision), ErrApprovalExpired, ErrSelfApproval.
	Decide(ctx context.Context, r DecideRequest, apply ApplyFunc) (Decision, error)
	// PendingApprovals lists the tenant's pending, unexpired approvals'
	// records, oldest first (by request time, then approval id): at most
	// limit, those after the position after (ApprovalPosition of the
	// previous page's last record; "" from the start).
	PendingApprovals(ctx context.Context, tenant, after string, limit int) ([]*Record, error)
	// ApprovalRecord returns the record an approval belongs to, or
	// ErrNotFound.
	ApprovalRecord(ctx context.Context, tenant, approvalID string) (*Record, error)
	// Settle applies a reconciliation or a manual resolution, atomically,
	// with its audit entry. Errors: ErrNotFound, ErrWrongState.
	Settle(ctx context.Context, r SettleRequest) (*Record, error)
	// OpenRecords lists records in state st (in_progress, unknown or
	// retryable), for the background sweeps: at most limit, in (tenant,
	// key) order, starting after the position after (OpenPosition of the
	// previous page's last record; "" starts at the beginning). A sweep
	// that pages on with the last record's position, wrapping around,
	// reaches every record however many stay stuck at the front.
	OpenRecords(ctx context.Context, st State, after string, limit int) ([]*Record, error)
	// ExpireLeases moves in_progress records whose lease expired to their
	// OnLeaseExpiry state and returns how many it moved.
	ExpireLeases(ctx context.Context) (int, error)
	// Sweep turns records past retention into tombstones and deletes
	// tombstones past their own retention, returning how many of each.
	Sweep(ctx context.Context) (compacted, deleted int, err error)
	// Audit buffers e, an entry of a call that changed nothing (a replay,
	// a refusal, a read): it is written with the next write transaction,
	// within a fraction of a second, or dropped by a read-only store.
	// Entries of transitions are written by the transitions themselves.
	Audit(e AuditEntry)
	// AuditLog returns up to limit entries with Seq > after, oldest first
	// (limit <= 0: all). Buffered entries are written first.
	AuditLog(ctx context.Context, after uint64, limit int) ([]AuditEntry, error)
	// AuditTail returns the newest n entries, oldest first.
	AuditTail(ctx context.Context, n int) ([]AuditEntry, error)
	// AuditForKey returns the audit entries of (tenant, key), oldest
	// first: the newest limit of them (limit <= 0: all), and how many
	// there are in all.
	AuditForKey(ctx context.Context, tenant, key string, limit int) ([]AuditEntry, int, error)
	// VerifyAudit checks the whole hash chain and returns the number of
	// entries, or an error naming the first entry that does not verify.
	VerifyAudit(ctx context.Context) (int, error)
	// VerifyAuditChain checks the hash chain of the entries the store
	// keeps: from entry 1, or from the anchor of a pruned log; from, when
	// not nil, is the chain of archives checked before, which the kept
	// part must continue exactly; an entry a record or the per-key index
	// numbers must be in the log or pruned. It returns what it proved, or
	// an error naming the first entry that does not verify
	// ([Ledger.VerifyAuditChain]).
	VerifyAuditChain(ctx context.Context, from *AuditChain) (AuditVerification, error)
	// CheckAuditCheckpoint checks that the log still holds the head a
	// signed checkpoint covers ([Ledger.CheckAuditCheckpoint]).
	CheckAuditCheckpoint(ctx context.Context, c AuditCheckpoint) error
	// PruneAudit removes the oldest audit entries written before before,
	// handing each batch to archive first (nil: they are discarded), in
	// small transactions that each move the anchor and append an
	// EventAuditPruned entry; it refuses to prune a part that does not
	// verify. Errors: ErrAuditPruneConflict, an archive's error, a
	// before in the future, a read-only store ([Ledger.PruneAudit]).
	PruneAudit(ctx context.Context, before time.Time, actor Actor, archive AuditArchive) (AuditPruned, error)
	// Health reports whether the store can be read and can commit.
	Health(ctx context.Context) Health
	// Close flushes buffered audit entries and releases the store.
	Close() error
}
