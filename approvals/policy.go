package approvals

import (
	"errors"
	"fmt"
	"net/mail"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"idemgate/ledger"
)

// Policy is the approval and deny policy. The zero value is not useful;
// start from Default. It is read-only after loading and safe for
// concurrent use.
type Policy struct {
	// AlwaysApprove, when set (always_approve in the config file), lists
	// the tools that always need approval, in place of what the tools say
	// of themselves (Facts.AlwaysApprove: update_order and cancel_order
	// do). nil leaves it to the tools.
	AlwaysApprove []string `toml:"always_approve"`
	// CreateOrderThresholdMinor: a create_order whose total (minor units)
	// is at or above this needs approval. 0 disables the rule.
	CreateOrderThresholdMinor int64 `toml:"create_order_threshold_minor"`
	// MaxRecipients: a notification to more recipients needs approval.
	// 0 disables the rule.
	MaxRecipients int `toml:"max_recipients"`
	// SuspectedDuplicates holds a new key with the same request as a recent
	// operation of the tenant for approval.
	SuspectedDuplicates bool `toml:"suspected_duplicates"`
	// ApprovalTTL is how long a pending approval waits before the operation
	// is rejected (approval_expired).
	ApprovalTTL Duration `toml:"approval_ttl"`
	// DeniedTools maps a principal to tools it may not use. Principal
	// names match as ledger.SamePrincipal compares them (case and Unicode
	// form do not matter).
	DeniedTools map[string][]string `toml:"denied_tools"`
	// AllowedCurrencies, when not empty, is the only currencies accepted.
	AllowedCurrencies []string `toml:"allowed_currencies"`
	// AllowedRecipientDomains, when not empty, is the only e-mail domains
	// and webhook hosts a notification may go to.
	AllowedRecipientDomains []string `toml:"allowed_recipient_domains"`
}

// Duration is a time.Duration written as "24h" in the config file.
type Duration struct{ time.Duration }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// Default is the policy with nothing configured.
func Default() Policy {
	return Policy{
		CreateOrderThresholdMinor: 100_000,
		MaxRecipients:             10,
		SuspectedDuplicates:       true,
		ApprovalTTL:               Duration{24 * time.Hour},
	}
}

// Load reads a TOML policy file over the defaults. Unknown keys are an
// error naming them, so a typo cannot silently disable a rule.
func Load(path string) (Policy, error) {
	p := Default()
	b, err := os.ReadFile(path)
	if err != nil {
		return p, fmt.Errorf("policy file: %w", err)
	}
	if len(b) > 1<<20 {
		return p, fmt.Errorf("policy file %s: larger than 1 MiB", path)
	}
	md, err := toml.Decode(string(b), &p)
	if err != nil {
		return p, fmt.Errorf("policy file %s: %w", path, err)
	}
	if un := md.Undecoded(); len(un) > 0 {
		keys := make([]string, len(un))
		for i, k := range un {
			keys[i] = k.String()
		}
		return p, fmt.Errorf("policy file %s: unknown keys %s", path, strings.Join(keys, ", "))
	}
	return p, p.Validate()
}

// Validate refuses settings that make no sense.
func (p Policy) Validate() error {
	var errs []error
	if p.CreateOrderThresholdMinor < 0 {
		errs = append(errs, fmt.Errorf("create_order_threshold_minor must be ≥ 0, got %d", p.CreateOrderThresholdMinor))
	}
	if p.MaxRecipients < 0 {
		errs = append(errs, fmt.Errorf("max_recipients must be ≥ 0, got %d", p.MaxRecipients))
	}
	if p.ApprovalTTL.Duration <= 0 {
		errs = append(errs, fmt.Errorf("approval_ttl must be positive, got %s", p.ApprovalTTL.Duration))
	}
	for _, c := range p.AllowedCurrencies {
		if len(c) != 3 || strings.ToUpper(c) != c {
			errs = append(errs, fmt.Errorf("allowed_currencies: %q is not an ISO 4217 code like EUR", c))
		}
	}
	return errors.Join(errs...)
}

// Verdict is what the policy decided for one request.
type Verdict struct {
	Action string // allow, approve, deny
	Rule   string // the rule that decided, e.g. "amount_threshold"
	Reason string // for the model and the approver
}

// The verdict actions.
const (
	Allow   = "allow"
	Approve = "approve"
	Deny    = "deny"
)

// Facts are what the policy looks at in one request. The tool computes
// them from its typed, validated arguments (each tool's descriptor says
// which facts it has); a zero field is a fact the request does not have,
// and the rules about it do not apply.
type Facts struct {
	// Amount is the order total the operation commits, in minor units of
	// Currency; HasAmount says the request has one (create_order).
	Amount    int64
	HasAmount bool
	// Currency is the ISO 4217 code the request pays in, "" for none.
	Currency string
	// Channel and Recipients are where a message goes (send_notification):
	// email, sms or webhook, and the recipients as written.
	Channel    string
	Recipients []string
	// AlwaysApprove says that every request of the tool needs a human
	// approver (the tool's descriptor says so: update_order, cancel_order),
	// unless the policy lists the tools that do (Policy.AlwaysApprove).
	AlwaysApprove bool
	// ThresholdMinor, when > 0, is the tool's own approval threshold for
	// Amount (a declared tool's approval_threshold_minor), in place of
	// the policy's create_order_threshold_minor; < 0: the tool has no
	// amount rule (a declared tool that names no threshold).
	ThresholdMinor int64
}

// Evaluate decides for one validated request of principal to tool, from
// the request's facts. Deny rules come first, then approval rules; the
// first that matches decides.
func (p Policy) Evaluate(principal, tool string, f Facts) Verdict {
	for name, denied := range p.DeniedTools {
		if ledger.SamePrincipal(name, principal) && slices.Contains(denied, tool) {
			return Verdict{Deny, "denied_tool", fmt.Sprintf("principal %s may not use %s", principal, tool)}
		}
	}
	if f.Currency != "" && len(p.AllowedCurrencies) > 0 && !slices.Contains(p.AllowedCurrencies, f.Currency) {
		return Verdict{Deny, "currency_not_allowed", fmt.Sprintf("currency %s is not accepted (accepted: %s)", f.Currency, strings.Join(p.AllowedCurrencies, ", "))}
	}
	if len(p.AllowedRecipientDomains) > 0 {
		for _, to := range f.Recipients {
			d, ok := recipientDomain(f.Channel, to)
			if !ok {
				return Verdict{Deny, "recipient_domain_not_allowed", fmt.Sprintf("recipient %.64q is not one %s address whose domain can be checked against the allowed domains", to, f.Channel)}
			}
			if d != "" && !slices.Contains(p.AllowedRecipientDomains, d) {
				return Verdict{Deny, "recipient_domain_not_allowed", fmt.Sprintf("recipient domain %s is not allowed (allowed: %s)", d, strings.Join(p.AllowedRecipientDomains, ", "))}
			}
		}
	}
	always := f.AlwaysApprove
	if p.AlwaysApprove != nil {
		always = slices.Contains(p.AlwaysApprove, tool)
	}
	if always {
		return Verdict{Approve, "always_approve", tool + " always needs a human approver"}
	}
	if f.HasAmount && f.ThresholdMinor > 0 && f.Amount >= f.ThresholdMinor {
		return Verdict{Approve, "amount_threshold", fmt.Sprintf("the amount %d (minor units) is at or above %s's approval threshold %d", f.Amount, tool, f.ThresholdMinor)}
	}
	if f.HasAmount && f.ThresholdMinor == 0 && p.CreateOrderThresholdMinor > 0 && f.Amount >= p.CreateOrderThresholdMinor {
		return Verdict{Approve, "amount_threshold", fmt.Sprintf("the order total %d (minor units) is at or above the approval threshold %d", f.Amount, p.CreateOrderThresholdMinor)}
	}
	if n := len(f.Recipients); p.MaxRecipients > 0 && n > p.MaxRecipients {
		return Verdict{Approve, "max_recipients", fmt.Sprintf("the notification goes to %d recipients, more than %d", n, p.MaxRecipients)}
	}
	return Verdict{Allow, "default_allow", ""}
}

// recipientDomain is the domain a recipient goes to, checked strictly so
// that an allow-list fails closed: an e-mail recipient must be exactly one
// address, a webhook one absolute http(s) URL with a host. SMS recipients
// (phone numbers) have no domain: "", true. false means the recipient
// cannot be checked and must be refused.
func recipientDomain(channel, to string) (string, bool) {
	switch channel {
	case "email":
		a, err := mail.ParseAddress(to)
		if err != nil {
			return "", false
		}
		i := strings.LastIndexByte(a.Address, '@')
		if i < 0 || i == len(a.Address)-1 {
			return "", false
		}
		return strings.ToLower(a.Address[i+1:]), true
	case "webhook":
		u, err := url.Parse(to)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Hostname() == "" || to != strings.TrimSpace(to) {
			return "", false
		}
		return strings.ToLower(u.Hostname()), true
	case "sms":
		return "", true
	}
	return "", false
}
