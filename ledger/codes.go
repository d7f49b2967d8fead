package ledger

// Code is the error code of a saved outcome or an answer (OpError.Code):
// the error.code enum of the published output schema (DESIGN §4). The
// ledger writes some of them itself (a rejected approval, an expired one,
// a mismatched key on the audit log); the tools write the rest. Callers
// branch on the code, never on a message.
type Code string

// The documented error codes, all of them, in the schema's order (a test
// in package tools keeps this list and the schema's enum equal).
const (
	CodeInvalidArguments   Code = "invalid_arguments"
	CodeKeyReused          Code = "key_reused_with_different_request"
	CodeForbidden          Code = "forbidden"
	CodeNotFound           Code = "not_found"
	CodePreconditionFailed Code = "precondition_failed"
	CodeInProgress         Code = "operation_in_progress"
	CodeOutcomeUnknown     Code = "outcome_unknown"
	CodeKeyExpired         Code = "key_expired"
	CodeApprovalRequired   Code = "approval_required"
	CodeDownstreamError    Code = "downstream_error"
	CodeInternal           Code = "internal"
)

// Codes lists every documented error code, in the schema's order.
func Codes() []Code {
	return []Code{CodeInvalidArguments, CodeKeyReused, CodeForbidden, CodeNotFound, CodePreconditionFailed,
		CodeInProgress, CodeOutcomeUnknown, CodeKeyExpired, CodeApprovalRequired, CodeDownstreamError, CodeInternal}
}

// Is reports whether e carries code c (false for a nil e).
func (c Code) Is(e *OpError) bool { return e != nil && e.Code == string(c) }
