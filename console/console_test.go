package console

import "testing"

// TestTemplatesParse: every page's template parses with the shared layout
// and card (a broken template would otherwise fail only when served).
func TestTemplatesParse(t *testing.T) {
	if len(parsePages()) == 0 {
		t.Fatal("no pages")
	}
}
