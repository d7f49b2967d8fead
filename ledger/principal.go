package ledger

import (
	"strings"

	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"
)

// NormalizePrincipal is the form in which principal names are compared:
// surrounding space trimmed, Unicode NFKC, then case folded (and NFKC
// again, as case folding can denormalise). "ALICE-assistant",
// " alice-assistant" and the full-width "ａｌｉｃｅ-assistant" are all
// "alice-assistant". Records and audit entries keep the name as it was
// given; only comparisons use this form.
func NormalizePrincipal(p string) string {
	return norm.NFKC.String(cases.Fold().String(norm.NFKC.String(strings.TrimSpace(p))))
}

// SamePrincipal reports whether a and b name the same principal: equal
// after NormalizePrincipal. Every check of who someone is (self-approval,
// self-resolution, a policy's per-principal rules) uses it, so a name that
// differs only in case or Unicode form is never a second person.
func SamePrincipal(a, b string) bool {
	return NormalizePrincipal(a) == NormalizePrincipal(b)
}
