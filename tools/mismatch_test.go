package tools

import (
	"fmt"
	"testing"

	"idemgate/ledger"
)

// TestDownstreamMismatchAnswer: the answer names both downstreams from the
// ledger's typed error, not from its text.
func TestDownstreamMismatchAnswer(t *testing.T) {
	s := newService(t, nil, nil)
	err := fmt.Errorf("claim: %w", &ledger.DownstreamMismatchError{Recorded: "orders_api http://a.example", Configured: "embedded"})
	r := s.failed("create_order", "k1", err)
	want := "Nothing was run: the operation belongs to orders_api http://a.example, this process is configured for embedded. " +
		"The server handling this call is configured for a different order system than the one this operation was recorded for; an operator must fix the configuration (--orders-api / --config)."
	if r.Error == nil || r.Error.Code != string(CodeInternal) || r.Error.Message != want || r.NextAction != NextDoNotRetry {
		t.Fatalf("answer = %+v (%v)\nwant message %q", r, r.Error, want)
	}
}
