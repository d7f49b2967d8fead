package console

import "testing"

// TestTemplatesParse: every page's template parses with the shared layout
// and card (a broken template would otherwise fail only when served).
func TestTemplatesParse(t *testing.T) {
	if len(parsePages()) == 0 {
		t.Fatal("no pages")
	}
}

// TestMoney: totals in minor units are shown as amounts of their currency.
func TestMoney(t *testing.T) {
	for _, c := range []struct{ minor, cur, want string }{
		{"3700", "EUR", "37.00 EUR"}, {"5", "USD", "0.05 USD"}, {"-250", "EUR", "-2.50 EUR"},
		{"1200", "JPY", "1200 JPY"}, {"12.5", "EUR", "12.5 EUR"}, {"3700", "", "3700"},
	} {
		if got := money(c.minor, c.cur); got != c.want {
			t.Errorf("money(%q, %q) = %q, want %q", c.minor, c.cur, got, c.want)
		}
	}
}
