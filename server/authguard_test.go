package server

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"
)

// testGuard is an AuthGuard whose clock the test moves and whose log it
// reads.
type testGuard struct {
	*AuthGuard
	now time.Time
	log bytes.Buffer
}

func newTestGuard(limit int) *testGuard {
	tg := &testGuard{now: time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)}
	tg.AuthGuard = NewAuthGuard(limit, slog.New(slog.NewTextHandler(&tg.log, nil)), NewMetrics())
	tg.AuthGuard.now = func() time.Time { return tg.now }
	return tg
}

func fail(g *testGuard, remote string) {
	r := httptest.NewRequest("POST", "/mcp", nil)
	r.RemoteAddr = remote
	g.Failed(r, AuthBearer, "unknown token")
}

func paused(g *testGuard, remote string) time.Duration {
	r := httptest.NewRequest("POST", "/mcp", nil)
	r.RemoteAddr = remote
	return g.Paused(r, AuthBearer)
}

// TestAuthGuardLogsOncePerMinute: a source's first failure is logged at
// once; the others of the minute are not, and the first line after the
// minute counts them.
func TestAuthGuardLogsOncePerMinute(t *testing.T) {
	g := newTestGuard(0)
	for range 10 {
		fail(g, "192.0.2.7:4000")
		g.now = g.now.Add(5 * time.Second)
	}
	g.now = g.now.Add(15 * time.Second) // 65 s after the first
	fail(g, "192.0.2.7:4001")
	lines := regexp.MustCompile(`msg="authentication failed" kind=bearer source=192\.0\.2\.7 reason="unknown token" failures=(\d+)`).FindAllStringSubmatch(g.log.String(), -1)
	if len(lines) != 2 || lines[0][1] != "1" || lines[1][1] != "10" {
		t.Fatalf("log lines %q, want 2: failures=1, then failures=10 (the 9 left out and the new one)\n%s", lines, g.log.String())
	}
	if paused(g, "192.0.2.7:4002") != 0 {
		t.Error("limit 0 paused a source")
	}
	// A source that stops: its failures left out are logged when it is
	// forgotten (at the next failure of anyone after its minute).
	for range 3 {
		fail(g, "192.0.2.9:1")
	}
	g.now = g.now.Add(3 * time.Minute)
	fail(g, "192.0.2.10:1")
	if !strings.Contains(g.log.String(), `source=192.0.2.9 reason="unknown token" failures=2 forgotten=true`) {
		t.Errorf("the 2 failures of 192.0.2.9 left out of the log were not logged when it was forgotten\n%s", g.log.String())
	}
}

// TestAuthGuardPauses: limit failures within the window pause the source
// for the window, not another source; the pause ends on time; a source's
// IPv6 neighbours in its /64 are the same source.
func TestAuthGuardPauses(t *testing.T) {
	g := newTestGuard(3)
	for range 2 {
		fail(g, "192.0.2.7:4000")
	}
	if d := paused(g, "192.0.2.7:4000"); d != 0 {
		t.Fatalf("paused %s after 2 failures of 3", d)
	}
	fail(g, "192.0.2.7:4000")
	if d := paused(g, "192.0.2.7:5000"); d != AuthFailureWindow {
		t.Fatalf("paused %s after 3 failures, want %s", d, AuthFailureWindow)
	}
	if d := paused(g, "192.0.2.8:4000"); d != 0 {
		t.Errorf("another source paused %s", d)
	}
	if got := strings.Count(g.log.String(), `msg="authentication: source paused" source=192.0.2.7`); got != 1 {
		t.Errorf("%d lines say the source was paused, want 1\n%s", got, g.log.String())
	}
	g.now = g.now.Add(AuthFailureWindow - time.Second)
	if d := paused(g, "192.0.2.7:4000"); d != time.Second || retryAfter(d) != 1 {
		t.Errorf("paused %s (Retry-After %d) a second before the end, want 1s", d, retryAfter(d))
	}
	g.now = g.now.Add(time.Second)
	if d := paused(g, "192.0.2.7:4000"); d != 0 {
		t.Errorf("still paused %s after the window", d)
	}
	fail(g, "192.0.2.7:4000") // a new window: one failure
	if d := paused(g, "192.0.2.7:4000"); d != 0 {
		t.Errorf("paused %s by the first failure of a new window", d)
	}

	for i := range 3 {
		fail(g, fmt.Sprintf("[2001:db8:1:2::%x]:443", i+1))
	}
	if d := paused(g, "[2001:db8:1:2:ffff::9]:80"); d != AuthFailureWindow {
		t.Errorf("an address of the same /64: paused %s, want %s", d, AuthFailureWindow)
	}
	if d := paused(g, "[2001:db8:1:3::1]:80"); d != 0 {
		t.Errorf("another /64 paused %s", d)
	}
	if d := paused(g, "[::ffff:192.0.2.8]:80"); d != 0 {
		t.Errorf("192.0.2.8 as a mapped IPv6 address paused %s", d)
	}
}

// TestAuthGuardBoundedMemory: failures from more sources than it keeps
// leave at most maxAuthSources remembered, and once their window and
// pause are over the next failure forgets them all.
func TestAuthGuardBoundedMemory(t *testing.T) {
	g := newTestGuard(5)
	g.logger = slog.New(slog.DiscardHandler)
	for i := range 3 * maxAuthSources {
		fail(g, fmt.Sprintf("10.%d.%d.%d:1", i>>16&255, i>>8&255, i&255))
	}
	if n := g.sourcesRemembered(); n != maxAuthSources {
		t.Fatalf("%d sources remembered after %d, want at most %d", n, 3*maxAuthSources, maxAuthSources)
	}
	g.now = g.now.Add(2 * AuthFailureWindow)
	fail(g, "192.0.2.1:1")
	if n := g.sourcesRemembered(); n != 1 {
		t.Errorf("%d sources remembered once the others' windows were over, want 1", n)
	}
}
