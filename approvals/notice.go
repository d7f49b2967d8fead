package approvals

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"idemgate/ledger"
)

// The approvers' notice: what is POSTed to [approvals] notify_webhook when
// an approval is requested (docs/approvals.md, "Reaching approvers").
const (
	// NoticeType is the notice's "type".
	NoticeType = "approval_requested"
	// NoticeVersion is the notice's "version". Adding a field does not
	// change it; removing or renaming one, or changing what one means,
	// does.
	NoticeVersion = 1
	// NoticeSummaryMax bounds Notice.Summary, in bytes.
	NoticeSummaryMax = 2000
)

// ConsolePathPrefix is where the console shows one approval:
// ConsolePathPrefix + approval id.
const ConsolePathPrefix = "/ui/approvals/"

// ConsolePath is the console page of the approval id, relative to the
// console's public URL.
func ConsolePath(approvalID string) string {
	return ConsolePathPrefix + url.PathEscape(approvalID)
}

// Notice tells a tenant's approvers that an operation waits for one of
// them. It is a snapshot taken when the approval was requested: the
// approval may be decided or expire before the notice arrives, and the
// console page it links to shows the approval as it then stands.
type Notice struct {
	Type    string `json:"type"`    // NoticeType
	Version int    `json:"version"` // NoticeVersion
	// NoticeID is the notice's identity, also sent as the Idempotency-Key
	// header: every delivery attempt of one notice carries the same one.
	NoticeID   string `json:"notice_id"`
	ApprovalID string `json:"approval_id"`
	// Tenant is whose approvers the notice is for: principals of this
	// tenant holding the approver role, other than RequestedBy.
	Tenant      string    `json:"tenant"`
	RequestedBy string    `json:"requested_by"`
	RequestedAt time.Time `json:"requested_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	// Tool and OperationKey are what waits.
	Tool         string `json:"tool"`
	OperationKey string `json:"operation_key"`
	// Rule and Reason are why it waits (the policy rule, or
	// suspected_duplicate with EarlierOperationKey, or rerun_after_unknown).
	Rule                string `json:"rule"`
	Reason              string `json:"reason"`
	EarlierOperationKey string `json:"earlier_operation_key,omitempty"`
	// Summary is the diff as readable text, cut at NoticeSummaryMax bytes
	// (ending in "…" when cut); the console shows it whole.
	Summary string `json:"summary"`
	// Total is the order's total the operation commits (create, change)
	// or cancels; absent when the operation has none.
	Total *Total `json:"total,omitempty"`
	// ConsoleURL opens the approval in the console: the configured public
	// URL followed by ConsolePath(ApprovalID).
	ConsoleURL string `json:"console_url"`
	// Headline says what waits in words: "Change order ord_1 for
	// customer cust-42" (OrderChange.Headline), or for an operation
	// without an order the tool and who asked.
	Headline string `json:"headline"`
	// Text is the notice for a person, in the field Slack- and
	// Mattermost-style incoming webhooks post ("text"): the
	// headline, the change in the order's words (OrderChange.Words, else
	// Summary), who asked, why and until when, and ConsoleURL on the last
	// line. At most NoticeSummaryMax bytes of change, "…" when cut.
	Text string `json:"text"`
}

// Total is an amount in minor units of an ISO 4217 currency.
type Total struct {
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
}

// NewNotice is the notice of rec's pending approval, with the id noticeID,
// total (nil when none) and links under consoleURL (a URL accepted by
// CheckPublicURL).
func NewNotice(rec *ledger.Record, noticeID string, total *Total, consoleURL string) Notice {
	a := rec.Approval
	if a == nil {
		a = &ledger.Approval{}
	}
	n := Notice{
		Type: NoticeType, Version: NoticeVersion, NoticeID: noticeID,
		ApprovalID: a.ID, Tenant: rec.Tenant, RequestedBy: a.RequestedBy,
		RequestedAt: a.CreatedAt.UTC(), ExpiresAt: a.ExpiresAt.UTC(),
		Tool: rec.Tool, OperationKey: rec.Key,
		Rule: a.Rule, Reason: a.Reason, EarlierOperationKey: a.EarlierKey,
		Summary:    cut(strings.TrimSpace(a.DiffText), NoticeSummaryMax),
		Total:      total,
		ConsoleURL: strings.TrimRight(consoleURL, "/") + ConsolePath(a.ID),
	}
	n.Headline, n.Text = noticeText(rec, n)
	return n
}

// noticeText is the headline and the text of notice n of rec's approval.
func noticeText(rec *ledger.Record, n Notice) (headline, text string) {
	a := rec.Approval
	words := n.Summary
	headline = rec.Tool + " requested by " + n.RequestedBy
	if oc, ok := DescribeOrder(rec.Tool, a.Diff, a.Resource); ok {
		headline = oc.Headline()
		words = cut(oc.Words(), NoticeSummaryMax)
		if _, rest, ok := strings.Cut(words, "\n"); ok {
			words = rest // the headline is the first line already
		} else {
			words = ""
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Approval needed: %s", headline)
	if words != "" {
		fmt.Fprintf(&b, "\n%s", words)
	}
	fmt.Fprintf(&b, "\nAsked by %s; held: %s. Expires %s.", n.RequestedBy, Why(n.Rule, n.Reason, n.EarlierOperationKey), n.ExpiresAt.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "\nApprove or reject: %s", n.ConsoleURL)
	return headline, b.String()
}

// cut is s if it fits in n bytes, else its start (at a character
// boundary) and "…", n bytes at most.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const more = "…"
	k := n - len(more)
	for k > 0 && !utf8.RuneStart(s[k]) {
		k--
	}
	return s[:k] + more
}

// CheckPublicURL checks the console's public URL (the base of the links in
// notices): an absolute http or https URL with a host, and no query,
// fragment or user info; a path prefix is allowed (a console behind a
// reverse proxy under /idemgate). It returns the URL without a trailing
// slash.
func CheckPublicURL(raw string) (string, error) {
	if raw == "" {
		return "", errors.New("public URL is empty")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("public URL: %w", err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("public URL %q: scheme must be http or https", raw)
	case u.Host == "":
		return "", fmt.Errorf("public URL %q: no host", raw)
	case u.User != nil:
		return "", fmt.Errorf("public URL %q: must not carry a user or password", u.Redacted())
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return "", fmt.Errorf("public URL %q: must not have a query or fragment", raw)
	}
	return strings.TrimRight(u.String(), "/"), nil
}
