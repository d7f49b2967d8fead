package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/tools"
)

// An approval as the approver reads it (docs/console.md, Approvals: "the
// card"). Decisions the design left open:
//   - A cancel's agent reason is read from the structured diff
//     (cancel_reason, which approvals.CancelDiff records); approvals asked
//     before it was recorded show none rather than read the diff's text.
//   - "On behalf of" and the model come from the audit entry of the call
//     that asked, as the token or the stdio server configured them, or
//     marked "stated by the client" when only its _meta said so.
//   - A suspected duplicate is shown beside the earlier operation as it
//     stands now (it may have changed since the request was held); the
//     two are identical when their fingerprints are, which is what the
//     rule compares.
//   - The requester's own request shows no decide buttons; the server
//     still refuses a decision posted anyway, headed "Refused: …".

// item prepares one approval for the pages, from the approvals API's
// structured fields (never the diff's text) and, for who asked on behalf
// of whom and a suspected duplicate's earlier operation, the ledger.
func (c *Console) item(r *http.Request, id Identity, a tools.ApprovalView) approvalItem {
	now := c.cfg.Now()
	it := approvalItem{
		ApprovalView: a, Headline: a.Tool, Why: approvals.Why(a.Rule, a.Reason, a.EarlierOperationKey),
		Mine:    ledger.SamePrincipal(id.Principal, a.RequestedBy),
		Waiting: roughly(now.Sub(a.CreatedAt)), Left: roughly(a.ExpiresAt.Sub(now)),
		RawDiff: pretty(a.Diff), RawResource: pretty(a.Resource),
	}
	if oc, ok := approvals.DescribeOrder(a.Tool, a.Diff, a.Resource); ok {
		it.Order, it.Headline, it.AgentReason = oc, oc.Headline(), oc.CancelReason
		for _, row := range oc.Rows {
			it.Rows = append(it.Rows, changeRow{row.What, row.Before, row.After})
		}
		for _, l := range oc.Lines {
			it.Lines = append(it.Lines, lineRow{l.SKU, fmt.Sprint(l.Quantity), approvals.Money(l.UnitPriceMinor, oc.Currency), lineAmount(l, oc.Currency)})
		}
		if oc.Action == approvals.ActionChange && oc.TotalBefore != nil {
			it.TotalBefore, it.Difference = approvals.Money(*oc.TotalBefore, oc.Currency), oc.Difference()
		}
	} else {
		var changes []approvals.Change
		if len(a.Diff) > 0 && json.Unmarshal(a.Diff, &changes) == nil {
			for _, ch := range changes {
				it.Rows = append(it.Rows, changeRow{ch.Path, show(ch.Before), show(ch.After)})
			}
		}
	}
	if t := a.Total; t != nil {
		it.Total = approvals.Money(t.AmountMinor, t.Currency)
	}
	it.OnBehalfOf, it.Model, it.Stated = c.askedFor(r.Context(), id.Tenant, a.OperationKey, a.RequestedBy)
	if a.EarlierOperationKey != "" {
		it.Earlier = c.earlier(r.Context(), id.Tenant, a)
		if o := it.Earlier.Order; o != nil && it.Order != nil && it.Order.Action == approvals.ActionCreate {
			it.Headline = "Place a second order for customer " + it.Order.CustomerID + " that looks like order " + o.OrderID
		}
	}
	return it
}

// lineAmount is a line's amount, quantity × unit price, in currency.
func lineAmount(l approvals.Line, currency string) string {
	if l.Quantity != 0 && l.UnitPriceMinor > (1<<62)/max(l.Quantity, 1) {
		return "" // too large to multiply safely: the order's total says it
	}
	return approvals.Money(l.Quantity*l.UnitPriceMinor, currency)
}

// auditScan bounds how many of an operation's newest audit entries are
// read to find whom its request was made for.
const auditScan = 200

// askedFor is the user the requester acted for and the model driving it,
// from the audit entries of key by requester: the identity's
// configuration (token, stdio server) when it says, else what the client
// stated in _meta (stated true). "" when neither says, or the audit log
// cannot be read.
func (c *Console) askedFor(ctx context.Context, tenant, key, requester string) (onBehalfOf, model string, stated bool) {
	entries, _, err := c.cfg.Store.AuditForKey(ctx, tenant, key, auditScan)
	if err != nil {
		return "", "", false
	}
	for _, e := range entries {
		if !ledger.SamePrincipal(e.Actor.Principal, requester) {
			continue
		}
		if e.Actor.OnBehalfOf != "" || e.Actor.Model != "" {
			return e.Actor.OnBehalfOf, e.Actor.Model, false
		}
		if s := e.Actor.ClientStated; s != nil && (s.OnBehalfOf != "" || s.Model != "") {
			onBehalfOf, model, stated = s.OnBehalfOf, s.Model, true
		}
	}
	return onBehalfOf, model, stated
}

// earlier is the earlier operation the suspected duplicate a resembles,
// as the ledger has it now.
func (c *Console) earlier(ctx context.Context, tenant string, a tools.ApprovalView) *earlierOp {
	e := &earlierOp{Key: a.EarlierOperationKey}
	rec, err := c.cfg.Store.Get(ctx, tenant, a.EarlierOperationKey)
	if err != nil || rec == nil {
		e.Missing = true
		return e
	}
	e.State, e.Tool, e.When, e.Result = string(rec.State), rec.Tool, rec.FirstSeenAt, pretty(rec.Result)
	e.Apart = "moments"
	if d := a.CreatedAt.Sub(rec.FirstSeenAt); d >= time.Second {
		e.Apart = roughly(d)
	}
	e.Order, e.Summary = summarize(rec.Tool, rec.Result)
	if held, err := c.cfg.Store.Get(ctx, tenant, a.OperationKey); err == nil && held != nil {
		e.Same = held.Fingerprint == rec.Fingerprint && held.Tool == rec.Tool
	}
	return e
}

// resultOrder is the order an operation's result holds.
type resultOrder struct {
	OrderID    string           `json:"order_id"`
	Version    int              `json:"version"`
	Status     string           `json:"status"`
	CustomerID string           `json:"customer_id"`
	Currency   string           `json:"currency"`
	TotalMinor int64            `json:"total_minor"`
	Items      []approvals.Line `json:"items"`
}

// Total is the order's total in its currency.
func (o *resultOrder) Total() string { return approvals.Money(o.TotalMinor, o.Currency) }

// done says what a succeeded operation of each tool did to its order.
var done = map[string]string{
	"create_order": "placed",
	"update_order": "changed",
	"cancel_order": "cancelled",
}

// summarize is the outcome of an operation of tool whose result is raw,
// in words — "Order ord_1 placed for customer cust-42: 2 lines, total
// 37.00 EUR (version 1)", "Message msg_… (email, 1 recipient): queued" —
// and the order it holds (nil when none). "" when the result says
// neither.
func summarize(tool string, raw json.RawMessage) (*resultOrder, string) {
	if len(raw) == 0 {
		return nil, ""
	}
	var res struct {
		Order   *resultOrder `json:"order"`
		Message *struct {
			ID         string `json:"message_id"`
			Channel    string `json:"channel"`
			Recipients int    `json:"recipients"`
			State      string `json:"state"`
		} `json:"message"`
	}
	if json.Unmarshal(raw, &res) != nil {
		return nil, ""
	}
	if o := res.Order; o != nil && o.OrderID != "" {
		verb := done[tool]
		if verb == "" || o.Status == "cancelled" {
			verb = o.Status
		}
		lines := "1 line"
		if len(o.Items) != 1 {
			lines = fmt.Sprintf("%d lines", len(o.Items))
		}
		return o, fmt.Sprintf("Order %s %s for customer %s: %s, total %s (version %d)", o.OrderID, verb, o.CustomerID, lines, o.Total(), o.Version)
	}
	if m := res.Message; m != nil && m.ID != "" {
		who := "1 recipient"
		if m.Recipients != 1 {
			who = fmt.Sprintf("%d recipients", m.Recipients)
		}
		return nil, fmt.Sprintf("Message %s (%s, %s): %s", m.ID, m.Channel, who, strings.ReplaceAll(m.State, "_", " "))
	}
	return nil, ""
}

// Action is what the operation does to its order (approvals.ActionCreate,
// ActionChange, ActionCancel), "" for an operation without an order.
func (it approvalItem) Action() string {
	if it.Order == nil {
		return ""
	}
	return it.Order.Action
}
