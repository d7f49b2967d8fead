package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/tools"
)

// page is what every template gets.
type page struct {
	Title string
	Who   *Identity
	// SignIn is the name of the OpenID provider the login page offers to
	// sign in with ("" for none).
	SignIn string
	Nav    string // the current section: approvals, history
	Notice string
	Error  string
	Now    time.Time

	Approvals []approvalItem
	Approval  *approvalItem
	Outcome   *outcome
	Status    int
	// HistoryScanned is how many recent operations the history looked at.
	HistoryScanned int
}

// approvalItem is one approval as the pages show it: what the operation
// does in the order's words (approvals.DescribeOrder over the approval's
// structured diff and resource), who asked for whom, why, and for a
// suspected duplicate the earlier operation beside it.
type approvalItem struct {
	tools.ApprovalView
	// Headline says what the operation does: "Change order ord_1 for
	// customer cust-42"; for an operation without an order, its tool.
	Headline string
	// Order is the diff in the order's terms; nil for an operation
	// without an order (a notification), whose Rows are the structured
	// diff's paths.
	Order *approvals.OrderChange
	Rows  []changeRow
	// Lines are the order's lines before the operation (a change's, a
	// cancel's: what is cancelled) or a create's new lines.
	Lines []lineRow
	// Total is the order's total after the operation (a create's, a
	// change's new total) or, for a cancel, the total cancelled;
	// TotalBefore and Difference are a change's.
	Total, TotalBefore, Difference string
	// Why is why it waits (approvals.Why); AgentReason is the reason the
	// agent gave (a cancel's).
	Why, AgentReason string
	// OnBehalfOf and Model are whom the requester acted for and the model
	// driving it, from the audit entry of the call that asked (Stated:
	// only the client said so).
	OnBehalfOf, Model string
	Stated            bool
	// Mine: the session's principal asked for this operation, and so may
	// not decide it.
	Mine bool
	// Earlier is the operation a suspected duplicate resembles.
	Earlier *earlierOp
	// RawDiff and RawResource are the structured diff and the resource as
	// indented JSON, behind a disclosure.
	RawDiff, RawResource string
	Waiting              string // how long it has waited
	Left                 string // how long until it expires
}

type changeRow struct{ Path, Before, After string }

type lineRow struct{ SKU, Quantity, UnitPrice, Amount string }

// earlierOp is the earlier operation a suspected duplicate resembles, as
// it stands now, beside the request held.
type earlierOp struct {
	Key, State, Tool string
	When             time.Time
	Missing          bool
	// Apart is how long before the held request the earlier one was
	// first seen; Same says the two requests are identical (equal
	// fingerprints: the same tool and arguments).
	Apart string
	Same  bool
	// Order is the order the earlier operation wrote (nil: none yet),
	// Summary its outcome in words, Result its result as JSON.
	Order   *resultOrder
	Summary string
	Result  string
}

func parsePages() map[string]*template.Template {
	funcs := template.FuncMap{
		"ts":  func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
		"iso": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"deref": func(p *string) string {
			if p == nil {
				return ""
			}
			return *p
		},
		"derefTime": func(p *time.Time) time.Time {
			if p == nil {
				return time.Time{}
			}
			return *p
		},
	}
	out := map[string]*template.Template{}
	for _, name := range []string{"login", "approvals", "approval", "outcome", "history", "error", "operations", "attention", "operation", "overview", "signedin"} {
		out[name] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/approval_card.html", "templates/"+name+".html"))
	}
	return out
}

// roughly says a duration the way a person reads it: "3 h 12 min",
// "45 s", "expired".
func roughly(d time.Duration) string {
	if d <= 0 {
		return "expired"
	}
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%d d %d h", int(d.Hours())/24, int(d.Hours())%24)
	case d >= time.Hour:
		return fmt.Sprintf("%d h %d min", int(d.Hours()), int(d.Minutes())%60)
	case d >= time.Minute:
		return fmt.Sprintf("%d min %d s", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%d s", int(d.Seconds()))
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	if p.Now.IsZero() {
		p.Now = c.cfg.Now()
	}
	if name == "login" {
		p = c.loginData(p)
	}
	c.renderAny(w, status, name, p)
}

// renderAny renders template name with data (a page or a struct embedding
// one) and answers it with status.
func (c *Console) renderAny(w http.ResponseWriter, status int, name string, data any) {
	var b bytes.Buffer
	if err := c.pages[name].Execute(&b, data); err != nil {
		c.cfg.Logger.Error("console: template", "page", name, "err", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}

func (c *Console) errorPage(w http.ResponseWriter, r *http.Request, who *Identity, status int, msg string) {
	c.render(w, r, status, "error", page{Title: http.StatusText(status), Who: who, Error: msg, Status: status})
}

// actor is the ledger actor of a console session.
func actor(id Identity) ledger.Actor {
	return ledger.Actor{Tenant: id.Tenant, Principal: id.Principal, Role: id.Role, ClientName: "idemgate-console"}
}

// apiError shows an error of the approvals API.
func (c *Console) apiError(w http.ResponseWriter, r *http.Request, id Identity, err error) {
	var e *tools.Error
	if errors.As(err, &e) {
		status := http.StatusBadRequest
		switch e.Code() {
		case tools.CodeForbidden:
			status = http.StatusForbidden
		case tools.CodeNotFound:
			status = http.StatusNotFound
		case tools.CodeInternal:
			status = http.StatusInternalServerError
		}
		c.errorPage(w, r, &id, status, e.Answer().Error.Message)
		return
	}
	c.cfg.Logger.Error("console", "err", err)
	c.errorPage(w, r, &id, http.StatusInternalServerError, "The ledger could not be read; try again shortly.")
}

func (c *Console) approvalsPage(w http.ResponseWriter, r *http.Request, id Identity) {
	var all []tools.ApprovalView
	req := tools.ListApprovalsRequest{Limit: 100}
	for len(all) < 500 {
		list, err := c.cfg.Service.ListApprovals(r.Context(), actor(id), req)
		if err != nil {
			c.apiError(w, r, id, err)
			return
		}
		all = append(all, list.Approvals...)
		if list.NextCursor == "" {
			break
		}
		req.Cursor = list.NextCursor
	}
	p := page{Title: "Approvals", Who: &id, Nav: "approvals"}
	for _, a := range all {
		p.Approvals = append(p.Approvals, c.item(r, id, a))
	}
	if r.URL.Query().Get("decided") != "" {
		p.Notice = "Decision recorded."
	}
	c.render(w, r, http.StatusOK, "approvals", p)
}

func (c *Console) approvalPage(w http.ResponseWriter, r *http.Request, id Identity) {
	a, err := c.cfg.Service.ShowApproval(r.Context(), actor(id), r.PathValue("id"))
	if err != nil {
		c.apiError(w, r, id, err)
		return
	}
	it := c.item(r, id, *a)
	c.render(w, r, http.StatusOK, "approval", page{Title: "Approval " + a.ApprovalID, Who: &id, Nav: "approvals", Approval: &it})
}

// maxComment bounds a decision's comment (decide_approval's limit).
const maxComment = 1000

func (c *Console) decide(w http.ResponseWriter, r *http.Request, id Identity) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		c.errorPage(w, r, &id, http.StatusBadRequest, "The form could not be read: "+err.Error())
		return
	}
	decision := tools.Decision(r.PostFormValue("decision"))
	if decision != tools.Approve && decision != tools.Reject {
		c.errorPage(w, r, &id, http.StatusBadRequest, "Choose approve or reject.")
		return
	}
	comment := strings.TrimSpace(r.PostFormValue("comment"))
	if n := len([]rune(comment)); n > maxComment {
		c.errorPage(w, r, &id, http.StatusBadRequest, fmt.Sprintf("The comment is %d characters; at most %d.", n, maxComment))
		return
	}
	approvalID := r.PathValue("id")
	// The approval must be the session's tenant's before anything is
	// decided: another tenant's, or none, answers 404 and decides nothing.
	// The decision's own answer cannot tell that apart, since not_found is
	// also the outcome of an approved change or cancel whose order has
	// vanished — the approval used, the operation failed — which is shown
	// as the outcome it is. (An approval is never deleted while it can be
	// decided, so one found here is still there for Decide.)
	if _, err := c.cfg.Service.ShowApproval(r.Context(), actor(id), approvalID); err != nil {
		c.apiError(w, r, id, err)
		return
	}
	resp := c.cfg.Service.Decide(r.Context(), actor(id), tools.DecideRequest{ApprovalID: approvalID, Decision: decision, Comment: comment})
	if c.cfg.AfterDecide != nil {
		c.cfg.AfterDecide(r.Context())
	}
	c.cfg.Logger.Info("console: decision", "principal", id.Principal, "tenant", id.Tenant, "approval", approvalID, "decision", decision, "status", resp.Status)
	out := &outcome{Decision: string(decision), Status: string(resp.Status), Replayed: resp.Replayed, Key: resp.OperationKey}
	if resp.Error != nil {
		out.Code, out.Message = resp.Error.Code, resp.Error.Message
	}
	out.Result = pretty(resp.Result)
	p := page{Title: "Outcome", Who: &id, Nav: "approvals", Outcome: out}
	tool := ""
	if a, err := c.cfg.Service.ShowApproval(r.Context(), actor(id), approvalID); err == nil {
		it := c.item(r, id, *a)
		p.Approval = &it
		tool = a.Tool
	}
	out.Heading, out.Took = headingOf(decision, resp, tool)
	_, out.Summary = summarize(tool, resp.Result)
	status := http.StatusOK
	if resp.IsError && !(decision == tools.Reject && resp.Status == ledger.StateRejected) {
		status = http.StatusConflict
	}
	c.render(w, r, status, "outcome", p)
}

// historyScan bounds how many recent operations the history view reads.
const historyScan = 2000

func (c *Console) historyPage(w http.ResponseWriter, r *http.Request, id Identity) {
	p := page{Title: "History", Who: &id, Nav: "history"}
	f := ledger.Filter{Tenant: id.Tenant, Limit: 200}
	for p.HistoryScanned < historyScan && len(p.Approvals) < 200 {
		recs, err := c.cfg.Store.List(r.Context(), f)
		if err != nil {
			c.apiError(w, r, id, err)
			return
		}
		for _, rec := range recs {
			if rec.Approval == nil || rec.Approval.Status == ledger.ApprovalPending {
				continue
			}
			a, err := c.cfg.Service.ShowApproval(r.Context(), actor(id), rec.Approval.ID)
			if err != nil {
				continue
			}
			p.Approvals = append(p.Approvals, c.item(r, id, *a))
		}
		p.HistoryScanned += len(recs)
		if len(recs) < f.Limit {
			break
		}
		f.After = ledger.ListPosition(recs[len(recs)-1])
	}
	slices.SortStableFunc(p.Approvals, func(a, b approvalItem) int {
		return derefTime(b.DecidedAt, b.ExpiresAt).Compare(derefTime(a.DecidedAt, a.ExpiresAt))
	})
	c.render(w, r, http.StatusOK, "history", p)
}

func derefTime(p *time.Time, or time.Time) time.Time {
	if p == nil {
		return or
	}
	return *p
}

// show renders a diff value on one line: "—" for none.
func show(v any) string {
	if v == nil {
		return "—"
	}
	if s, ok := v.(string); ok {
		return s
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// pretty indents a JSON document for reading ("" for none).
func pretty(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if json.Indent(&b, raw, "", "  ") != nil {
		return string(raw)
	}
	return b.String()
}
