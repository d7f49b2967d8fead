package tools

import "idemgate/ledger"

// Code is an error code of an answer: the error.code enum of the published
// output schema (schemas/result.json, DESIGN §4). The codes are defined
// once, in package ledger, which writes some of them into saved outcomes
// itself; Code and the constants below are those. Callers branch on a
// code, never on a message.
type Code = ledger.Code

// The documented error codes, all of them (TestCodesAreTheSchemas keeps
// this list and the schema's enum equal).
const (
	CodeInvalidArguments   = ledger.CodeInvalidArguments
	CodeKeyReused          = ledger.CodeKeyReused
	CodeForbidden          = ledger.CodeForbidden
	CodeNotFound           = ledger.CodeNotFound
	CodePreconditionFailed = ledger.CodePreconditionFailed
	CodeInProgress         = ledger.CodeInProgress
	CodeOutcomeUnknown     = ledger.CodeOutcomeUnknown
	CodeKeyExpired         = ledger.CodeKeyExpired
	CodeApprovalRequired   = ledger.CodeApprovalRequired
	CodeDownstreamError    = ledger.CodeDownstreamError
	CodeInternal           = ledger.CodeInternal
)

// Codes lists every documented error code, in the schema's order.
func Codes() []Code { return ledger.Codes() }

// opError is the error of an answer or a saved outcome.
func opError(code Code, msg string) *ledger.OpError {
	return &ledger.OpError{Code: string(code), Message: msg}
}

// NextAction is the advice an answer gives: the next_action enum of the
// published output schema.
type NextAction string

// The next actions, all of them (TestCodesAreTheSchemas keeps this list
// and the schema's enum equal).
const (
	NextNone      NextAction = "none"
	NextWaitPoll  NextAction = "wait_and_poll_status"
	NextAwait     NextAction = "await_approval"
	NextReconcile NextAction = "reconcile"
	NextFixRetry  NextAction = "fix_arguments_and_retry_same_key"
	// NextRetry: nothing happened and the arguments were fine; call again
	// with the same key and arguments (after error.details.retry_after_seconds
	// when the downstream asked for a delay).
	NextRetry      NextAction = "retry_same_key"
	NextNewKey     NextAction = "use_new_key_for_new_intent"
	NextDoNotRetry NextAction = "do_not_retry"
)

// NextActions lists every next action, in the schema's order.
func NextActions() []NextAction {
	return []NextAction{NextNone, NextWaitPoll, NextAwait, NextReconcile, NextFixRetry, NextRetry, NextNewKey, NextDoNotRetry}
}
