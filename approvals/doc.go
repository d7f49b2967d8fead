// Package approvals decides which operations a human must approve, which
// are denied outright, what the approver is shown, and who may decide.
//
// # Policy
//
// [Policy.Evaluate] looks at one validated request — the tool's name, the
// principal, and the [Facts] the tool computes from its typed arguments
// (an order's total and currency, a message's channel and recipients) —
// and answers allow, approve or deny, naming the rule that decided (the
// rule goes into the audit entry). Rules never read a tool's raw
// arguments, so a rule applies to every tool that has its fact. Deny rules come first: a tool the principal may not use, a
// currency not accepted, a recipient domain not allowed — the call is
// refused with forbidden and leaves no record. Then approval rules:
// update_order and cancel_order always (configurable), a create_order whose
// total is at or above a threshold, a notification to more than N
// recipients. Suspected duplicates (a new key with the same request as a
// recent operation) are detected by the ledger, which alone can see the
// tenant's recent fingerprints; the policy only switches that rule on.
//
// # Approvals
//
// An approval is bound to its operation's tenant, key and fingerprint, and
// for changes to the resource version its diff was computed from. It is
// single use: the approval's move to approved and the operation's move to
// in_progress — and, for the embedded store, the change itself — commit in
// one ledger transaction, so two approvers racing cause one execution. The
// approver must hold the approver role, be in the same tenant, and not be
// the principal who requested the operation ([CheckApprover]); the ledger
// re-checks the last two inside the transaction. A version that moved
// between request and approval fails the operation with
// precondition_failed, and nothing is applied.
//
// # Reaching approvers
//
// [Notice] is what a new approval request tells the tenant's approvers
// (type approval_requested, version 1): what waits, who asked, why, until
// when, and the console link ([ConsolePath] under the configured public
// URL). The tools queue it in the outbox in the transaction that records
// the request (ledger.Claim.OnHeld), so it exists exactly when the request
// does; it is delivered even if the approval is decided first.
//
// # What an approval proves
//
// That a principal holding the approver role, other than the requester,
// saw this diff and said yes before it expired. It does not prove the
// approver read it, nor that the approver and the requester are different
// people if one person holds both identities. An answer to an elicitation
// form shown by the agent's own MCP client is not an approval: the client
// (or the model driving it) can answer it itself.
package approvals
