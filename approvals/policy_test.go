package approvals

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func order(currency string, q, price int64) Facts {
	return Facts{HasAmount: true, Amount: q * price, Currency: currency}
}

func TestEvaluate(t *testing.T) {
	p := Default()
	p.AllowedCurrencies = []string{"EUR"}
	p.AllowedRecipientDomains = []string{"example.com", "hooks.example.com"}
	p.DeniedTools = map[string][]string{"intern": {"cancel_order"}}
	tests := []struct {
		name, principal, tool string
		facts                 Facts
		action, rule          string
	}{
		{"small order runs", "a", "create_order", order("EUR", 1, 500), Allow, "default_allow"},
		{"at the threshold needs approval", "a", "create_order", order("EUR", 100, 1000), Approve, "amount_threshold"},
		{"above the threshold needs approval", "a", "create_order", order("EUR", 1000, 1000), Approve, "amount_threshold"},
		{"currency not accepted", "a", "create_order", order("USD", 1, 1), Deny, "currency_not_allowed"},
		{"cancel always needs approval", "a", "cancel_order", always, Approve, "always_approve"},
		{"update always needs approval", "a", "update_order", always, Approve, "always_approve"},
		{"denied tool wins over approval", "intern", "cancel_order", always, Deny, "denied_tool"},
		{"allowed e-mail domain", "a", "send_notification", email("Ann <ann@example.com>"), Allow, "default_allow"},
		{"recipient domain not allowed", "a", "send_notification", email("x@evil.test"), Deny, "recipient_domain_not_allowed"},
		{"a list in one recipient fails closed", "a", "send_notification", email("a@evil.test, b@example.com"), Deny, "recipient_domain_not_allowed"},
		{"trailing junk fails closed", "a", "send_notification", email("a@evil.test;"), Deny, "recipient_domain_not_allowed"},
		{"webhook host not allowed", "a", "send_notification", webhook("https://evil.test/hook"), Deny, "recipient_domain_not_allowed"},
		{"allowed webhook host", "a", "send_notification", webhook("https://hooks.example.com/x"), Allow, "default_allow"},
		{"scheme-relative webhook fails closed", "a", "send_notification", webhook("//evil.test/hook"), Deny, "recipient_domain_not_allowed"},
		{"padded webhook fails closed", "a", "send_notification", webhook(" https://evil.test/x"), Deny, "recipient_domain_not_allowed"},
		{"e-mail address on the webhook channel fails closed", "a", "send_notification", webhook("x@example.com"), Deny, "recipient_domain_not_allowed"},
		{"sms numbers have no domain", "a", "send_notification", Facts{Channel: "sms", Recipients: []string{"+15551234567"}}, Allow, "default_allow"},
		{"too many recipients", "a", "send_notification", Facts{Channel: "email", Recipients: manyRecipients(11)}, Approve, "max_recipients"},
		{"exactly the maximum runs", "a", "send_notification", Facts{Channel: "email", Recipients: manyRecipients(10)}, Allow, "default_allow"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := p.Evaluate(tt.principal, tt.tool, tt.facts)
			if got.Action != tt.action || got.Rule != tt.rule {
				t.Errorf("Evaluate = %+v, want %s by %s", got, tt.action, tt.rule)
			}
			if got.Action != Allow && got.Reason == "" {
				t.Errorf("a %s verdict without a reason", got.Action)
			}
		})
	}
}

// always is the facts of a tool that says it always needs approval
// (cancel_order, update_order).
var always = Facts{AlwaysApprove: true}

// TestAlwaysApproveConfigured: always_approve in the config file, when
// set, is the list of tools that always need approval, in place of what
// the tools say of themselves; the defaults leave it to the tools.
func TestAlwaysApproveConfigured(t *testing.T) {
	for _, tc := range []struct {
		name   string
		list   []string
		tool   string
		facts  Facts
		action string
	}{
		{"defaults: the tool says so", nil, "cancel_order", always, Approve},
		{"defaults: the tool does not", nil, "create_order", order("EUR", 1, 1), Allow},
		{"the README's list", []string{"update_order", "cancel_order"}, "cancel_order", always, Approve},
		{"a list that adds a tool", []string{"update_order", "cancel_order", "create_order"}, "create_order", order("EUR", 1, 1), Approve},
		{"a list without the tool", []string{"create_order"}, "cancel_order", always, Allow},
		{"an empty list", []string{}, "update_order", always, Allow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Default()
			p.AlwaysApprove = tc.list
			if got := p.Evaluate("a", tc.tool, tc.facts); got.Action != tc.action {
				t.Errorf("Evaluate(%s) with always_approve %v = %+v, want %s", tc.tool, tc.list, got, tc.action)
			}
		})
	}
	p, err := Load(writePolicy(t, "always_approve = []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p.AlwaysApprove == nil || p.Evaluate("a", "cancel_order", always).Action != Allow {
		t.Errorf("always_approve = [] loaded as %#v: the tools' own word still applies", p.AlwaysApprove)
	}
}

func writePolicy(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policy.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func email(to string) Facts {
	return Facts{Channel: "email", Recipients: []string{to}}
}

func webhook(to string) Facts {
	return Facts{Channel: "webhook", Recipients: []string{to}}
}

func manyRecipients(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "user" + strings.Repeat("x", i) + "@example.com"
	}
	return out
}

func TestLoad(t *testing.T) {
	write := writePolicy
	t.Run("overrides defaults", func(t *testing.T) {
		p, err := Load(write(t, "create_order_threshold_minor = 5000\napproval_ttl = \"2h\"\n[denied_tools]\n\"bot\" = [\"cancel_order\"]\n"))
		if err != nil {
			t.Fatal(err)
		}
		if p.CreateOrderThresholdMinor != 5000 || p.ApprovalTTL.Hours() != 2 || p.MaxRecipients != 10 || len(p.DeniedTools["bot"]) != 1 {
			t.Errorf("Load = %+v", p)
		}
	})
	for name, body := range map[string]string{
		"unknown key":     "alowed_currencies = [\"USD\"]\n",
		"bad duration":    "approval_ttl = \"soon\"\n",
		"negative ttl":    "approval_ttl = \"-1h\"\n",
		"lowercase code":  "allowed_currencies = [\"usd\"]\n",
		"negative amount": "create_order_threshold_minor = -1\n",
		"not toml":        "{",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Load(write(t, body)); err == nil {
				t.Errorf("Load(%q) succeeded, want an error", body)
			} else if name == "unknown key" && !strings.Contains(err.Error(), "alowed_currencies") {
				t.Errorf("error %q does not name the unknown key", err)
			}
		})
	}
}

func TestDiffs(t *testing.T) {
	before := map[string]any{"note": "a", "items": []any{map[string]any{"sku": "s", "quantity": 1.0}}, "total_minor": 5.0}
	after := map[string]any{"note": "b", "items": []any{map[string]any{"sku": "s", "quantity": 1}}, "total_minor": 5}
	d := UpdateDiff("order", "ord_1", 3, before, after)
	if len(d.Changes) != 1 || d.Changes[0].Path != "note" || d.Changes[0].Before != "a" || d.Changes[0].After != "b" {
		t.Errorf("UpdateDiff changes = %+v, want only note a → b", d.Changes)
	}
	if !strings.Contains(d.Text, "ord_1") || !strings.Contains(d.Text, "version 3") {
		t.Errorf("UpdateDiff text %q lacks the order or version", d.Text)
	}
	c := CancelDiff("order", "ord_1", 2, map[string]any{"status": "placed", "customer_id": "c1"}, "asked")
	if len(c.Changes) != 2 || c.Changes[0].After != "cancelled" || c.Changes[1].Path != "cancel_reason" || c.Changes[1].After != "asked" || !strings.Contains(c.Text, "customer_id") || !strings.Contains(c.Text, "asked") {
		t.Errorf("CancelDiff = %+v", c)
	}
	n := CreateDiff("order", map[string]any{"customer_id": "c1", "currency": "EUR"})
	if len(n.Changes) != 2 || n.Changes[0].Before != nil {
		t.Errorf("CreateDiff = %+v, want every field with no before", n)
	}
}

// TestDeniedToolsMatchPrincipalCaseInsensitively: a denied principal
// cannot slip past its rule by changing the case of its name.
func TestDeniedToolsMatchPrincipalCaseInsensitively(t *testing.T) {
	p := Default()
	p.DeniedTools = map[string][]string{"Intern-Bot": {"cancel_order"}}
	for _, name := range []string{"intern-bot", "INTERN-BOT", "Intern-Bot"} {
		if v := p.Evaluate(name, "cancel_order", always); v.Action != Deny {
			t.Errorf("Evaluate(%q, cancel_order) = %+v, want deny", name, v)
		}
	}
	if v := p.Evaluate("intern-bot-2", "cancel_order", always); v.Action == Deny {
		t.Errorf("another principal denied: %+v", v)
	}
}
