package console

import "testing"

func TestTraceLink(t *testing.T) {
	const tmpl = "https://traces.example/trace/{trace_id}?span={span_id}"
	if got, want := TraceLink(tmpl, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"), "https://traces.example/trace/4bf92f3577b34da6a3ce929d0e0e4736?span=00f067aa0ba902b7"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := TraceLink(tmpl, "", ""); got != "" {
		t.Errorf("an entry without a trace links to %q", got)
	}
}
