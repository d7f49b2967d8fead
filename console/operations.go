package console

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"time"

	"idemgate/ledger"
	"idemgate/outbox"
	"idemgate/tools"
)

// opsPage is the data of the operations pages.
type opsPage struct {
	page
	Filter  opsFilter
	States  []string
	Ops     []opRow
	Scanned int
	More    bool

	Op       *ledger.Record
	Customer string // of Op's order (customerOf)
	// ResultSummary is the result in words (summarize), Result its JSON.
	ResultSummary string
	Result        string
	Args          string
	Messages      []*outbox.Message
	Audit         []ledger.AuditEntry
	AuditN        int
	Answer        *outcome
	Dead          []*outbox.Message
	// DeadScanned is how many outbox messages the dead-letter list read;
	// DeadTruncated, that it stopped at its bound with messages left.
	DeadScanned   int
	DeadTruncated bool
	// TraceLink is the trace viewer's URL of an audit entry, "" for one
	// that names no trace; nil without a configured viewer.
	TraceLink func(ledger.AuditEntry) string
}

type opsFilter struct {
	State, Tool, Principal, Customer, Since string
}

// opRow is one operation of a list, with the customer of its order.
type opRow struct {
	*ledger.Record
	Customer string
}

// customerOf is the customer of rec's order, from what the record keeps:
// the request's customer_id (create_order), the result's
// order.customer_id (an order written, updated or cancelled), or the
// customer_id of the order a change or a cancel is for (its approval's
// Resource: it is there while the request waits, and after a rejection
// or a failure). "" when none of them says: a notification, a change or a
// cancel held before approvals kept their resource and not done, or a
// tombstone (retention removed its request and result).
func customerOf(rec *ledger.Record) string {
	var v struct {
		CustomerID string `json:"customer_id"`
		Order      struct {
			CustomerID string `json:"customer_id"`
		} `json:"order"`
	}
	raws := []json.RawMessage{rec.Args, rec.Result}
	if rec.Approval != nil {
		raws = append(raws, rec.Approval.Resource)
	}
	for _, raw := range raws {
		v.CustomerID, v.Order.CustomerID = "", ""
		if len(raw) > 0 && json.Unmarshal(raw, &v) == nil {
			if v.CustomerID != "" {
				return v.CustomerID
			}
			if v.Order.CustomerID != "" {
				return v.Order.CustomerID
			}
		}
	}
	return ""
}

// opsScan bounds how many records one operations list reads.
const opsScan = 2000

var stateNames = []string{"in_progress", "awaiting_approval", "succeeded", "failed", "rejected", "retryable", "unknown"}

// operationsPage lists the tenant's operations, newest first, filtered by
// state, tool, principal and time; a key goes to its operation's page.
func (c *Console) operationsPage(w http.ResponseWriter, r *http.Request, id Identity) {
	q := r.URL.Query()
	if key := strings.TrimSpace(q.Get("key")); key != "" {
		http.Redirect(w, r, Prefix+"/operations/"+url.PathEscape(key), http.StatusSeeOther)
		return
	}
	f := opsFilter{State: q.Get("state"), Tool: strings.TrimSpace(q.Get("tool")), Principal: strings.TrimSpace(q.Get("principal")),
		Customer: strings.TrimSpace(q.Get("customer")), Since: q.Get("since")}
	for _, v := range []string{f.State, f.Tool, f.Principal, f.Customer, f.Since} {
		if len(v) > 200 {
			c.errorPage(w, r, &id, http.StatusBadRequest, "A filter is at most 200 characters.")
			return
		}
	}
	p := opsPage{page: page{Title: "Operations", Who: &id, Nav: "operations"}, Filter: f, States: stateNames}
	c.listOps(w, r, id, &p, ledger.State(f.State), "operations")
}

// attentionPage lists the unknown operations: each needs a reconcile or
// a person's resolution.
func (c *Console) attentionPage(w http.ResponseWriter, r *http.Request, id Identity) {
	p := opsPage{page: page{Title: "Needs a person", Who: &id, Nav: "attention"}}
	if m := r.URL.Query().Get("requeued"); m != "" {
		p.Notice = "Requeued " + m + ": it is delivered within seconds."
	}
	dead, err := c.deadLetters(r, id.Tenant)
	if err != nil {
		c.apiError(w, r, id, err)
		return
	}
	p.Dead, p.DeadScanned, p.DeadTruncated = dead.Messages, dead.Scanned, dead.Truncated
	c.listOps(w, r, id, &p, ledger.StateUnknown, "attention")
}

func (c *Console) listOps(w http.ResponseWriter, r *http.Request, id Identity, p *opsPage, state ledger.State, tmpl string) {
	var since time.Time
	switch p.Filter.Since {
	case "1h":
		since = c.cfg.Now().Add(-time.Hour)
	case "24h":
		since = c.cfg.Now().Add(-24 * time.Hour)
	case "7d":
		since = c.cfg.Now().Add(-7 * 24 * time.Hour)
	}
	lf := ledger.Filter{Tenant: id.Tenant, State: state, Limit: 200}
	for p.Scanned < opsScan && len(p.Ops) < 200 {
		recs, err := c.cfg.Store.List(r.Context(), lf)
		if err != nil {
			c.apiError(w, r, id, err)
			return
		}
		stop := len(recs) < lf.Limit
		for _, rec := range recs {
			if !since.IsZero() && rec.FirstSeenAt.Before(since) {
				continue
			}
			if (p.Filter.Tool != "" && rec.Tool != p.Filter.Tool) || (p.Filter.Principal != "" && !ledger.SamePrincipal(rec.Principal, p.Filter.Principal)) {
				continue
			}
			row := opRow{Record: rec, Customer: customerOf(rec)}
			if p.Filter.Customer != "" && row.Customer != p.Filter.Customer {
				continue
			}
			p.Ops = append(p.Ops, row)
		}
		p.Scanned += len(recs)
		if stop {
			break
		}
		lf.After = ledger.ListPosition(recs[len(recs)-1])
		p.More = p.Scanned >= opsScan
	}
	c.renderOps(w, r, http.StatusOK, tmpl, *p)
}

// operationPage shows one operation: its record, approval, messages and
// its whole history from the audit log.
func (c *Console) operationPage(w http.ResponseWriter, r *http.Request, id Identity) {
	c.showOperation(w, r, id, r.PathValue("key"), nil, http.StatusOK)
}

func (c *Console) showOperation(w http.ResponseWriter, r *http.Request, id Identity, key string, answer *outcome, status int) {
	rec, err := c.cfg.Store.Get(r.Context(), id.Tenant, key)
	if err != nil || rec == nil {
		c.errorPage(w, r, &id, http.StatusNotFound, "No operation with this key in your tenant.")
		return
	}
	p := opsPage{page: page{Title: "Operation " + key, Who: &id, Nav: "operations"}, Op: rec, Answer: answer,
		Customer: customerOf(rec), Result: pretty(rec.Result), Args: pretty(rec.Args)}
	_, p.ResultSummary = summarize(rec.Tool, rec.Result)
	_ = c.cfg.Store.View(r.Context(), func(tx ledger.Tx) error {
		p.Messages, _ = outbox.OfOperation(tx, id.Tenant, key, rec.Incarnation)
		return nil
	})
	if p.Audit, p.AuditN, err = c.cfg.Store.AuditForKey(r.Context(), id.Tenant, key, 500); err != nil {
		c.cfg.Logger.Warn("console: audit for key", "key", key, "err", err)
	}
	if tmpl := c.cfg.TraceURL; tmpl != "" {
		p.TraceLink = func(e ledger.AuditEntry) string { return TraceLink(tmpl, e.Actor.TraceID, e.Actor.SpanID) }
	}
	c.renderOps(w, r, status, "operation", p)
}

// TraceLink is the trace viewer's URL tmpl for a trace and span (hex):
// {trace_id} and {span_id} replaced; "" when traceID is empty.
func TraceLink(tmpl, traceID, spanID string) string {
	if traceID == "" {
		return ""
	}
	return strings.NewReplacer("{trace_id}", url.PathEscape(traceID), "{span_id}", url.PathEscape(spanID)).Replace(tmpl)
}

// settle reconciles or resolves an unknown operation through the
// service's API (the same code as reconcile_operation and
// resolve_operation), then shows the operation with the answer.
func (c *Console) settle(w http.ResponseWriter, r *http.Request, id Identity) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		c.errorPage(w, r, &id, http.StatusBadRequest, "The form could not be read: "+err.Error())
		return
	}
	key := r.PathValue("key")
	var resp *tools.Response
	action := r.PostFormValue("action")
	switch action {
	case "reconcile":
		resp = c.cfg.Service.Reconcile(r.Context(), actor(id), tools.ReconcileRequest{OperationKey: key})
	case "resolve":
		resp = c.cfg.Service.Resolve(r.Context(), actor(id), tools.ResolveRequest{
			OperationKey: key, Outcome: r.PostFormValue("outcome"),
			Evidence: strings.TrimSpace(r.PostFormValue("evidence")), DownstreamRef: strings.TrimSpace(r.PostFormValue("downstream_ref")),
		})
	default:
		c.errorPage(w, r, &id, http.StatusBadRequest, "Choose reconcile or resolve.")
		return
	}
	if c.cfg.AfterDecide != nil {
		c.cfg.AfterDecide(r.Context())
	}
	c.cfg.Logger.Info("console: settle", "principal", id.Principal, "tenant", id.Tenant, "key", key, "action", action, "status", resp.Status)
	out := &outcome{Decision: action, Status: string(resp.Status), Replayed: resp.Replayed, Key: resp.OperationKey, Result: pretty(resp.Result)}
	status := http.StatusOK
	if resp.Error != nil {
		out.Code, out.Message = resp.Error.Code, resp.Error.Message
		status = http.StatusConflict
	}
	c.showOperation(w, r, id, key, out, status)
}

func (c *Console) renderOps(w http.ResponseWriter, r *http.Request, status int, name string, p opsPage) {
	if p.Now.IsZero() {
		p.Now = c.cfg.Now()
	}
	c.renderAny(w, status, name, p)
}
