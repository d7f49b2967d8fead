package ledger

import "errors"

var (
	// ErrNotFound is returned when no record exists for a (tenant, key), or
	// the record belongs to another tenant.
	ErrNotFound = errors.New("ledger: not found")

	// ErrStaleGeneration is returned by Complete and RenewLease when the
	// caller's generation is no longer the record's: its lease was taken over
	// or the record was already completed.
	ErrStaleGeneration = errors.New("ledger: stale generation")

	// ErrKeyNotIssued is returned by a claim when Options.RequireIssuedKeys is
	// set and the key was not handed out by IssueKey in the same tenant.
	ErrKeyNotIssued = errors.New("ledger: operation key was not issued by this ledger")

	// ErrAlreadyDecided is returned by Decide when the approval was already
	// approved, rejected or expired; the Decision carries the record.
	ErrAlreadyDecided = errors.New("ledger: approval already decided")

	// ErrApprovalExpired is returned by Decide when the approval expired
	// before the decision; the operation is then rejected.
	ErrApprovalExpired = errors.New("ledger: approval expired")

	// ErrSelfApproval is returned by Decide when the approver is the
	// principal who requested the operation.
	ErrSelfApproval = errors.New("ledger: an operation cannot be approved by its requester")

	// ErrWrongState is returned by Settle when the record is not in one of
	// the states the caller expected (someone else settled it first).
	ErrWrongState = errors.New("ledger: record is not in the expected state")

	// ErrDownstreamMismatch is returned when a process would run an
	// operation against a downstream other than the one it was claimed for
	// (an approver's command line without --orders-api, say).
	ErrDownstreamMismatch = errors.New("ledger: operation belongs to another downstream")

	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("ledger: closed")

	// ErrSchemaVersion is returned by Open when the file was written by a
	// newer, incompatible version of idemgate.
	ErrSchemaVersion = errors.New("ledger: unsupported on-disk schema version")
)

// DownstreamMismatchError is the ErrDownstreamMismatch a claim or decision
// returns, with the two downstreams named: the one the operation was
// recorded for and the one the refusing process is configured for.
type DownstreamMismatchError struct {
	Recorded, Configured string
}

func (e *DownstreamMismatchError) Error() string {
	return ErrDownstreamMismatch.Error() + ": the operation belongs to " + e.Recorded + ", this process is configured for " + e.Configured
}

// Is makes errors.Is(err, ErrDownstreamMismatch) hold.
func (e *DownstreamMismatchError) Is(target error) bool { return target == ErrDownstreamMismatch }
