package approvals

import (
	"errors"

	"idemgate/ledger"
)

// RoleApprover is the role that may decide approvals.
const RoleApprover = "approver"

// ErrNotApprover is returned by CheckApprover when the principal lacks the
// approver role.
var ErrNotApprover = errors.New("approvals: the approver role is required")

// CheckApprover refuses a decision by anyone without the approver role.
// Tenant and requester are checked by the ledger inside the decision's
// transaction (an approval is only found in its own tenant, and
// ledger.ErrSelfApproval refuses the requester), so key possession or a
// stale read is never authority.
func CheckApprover(a ledger.Actor) error {
	if a.Role != RoleApprover {
		return ErrNotApprover
	}
	return nil
}
