package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

// idRecorder notes the JSON-RPC id of every tools/call a client sends.
type idRecorder struct {
	mu  sync.Mutex
	ids []string // raw JSON of each tools/call's id, in order
}

func (r *idRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.Method == http.MethodPost {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(b))
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(b, &m) == nil && m.Method == "tools/call" {
			r.mu.Lock()
			r.ids = append(r.ids, string(m.ID))
			r.mu.Unlock()
		}
	}
	return http.DefaultTransport.RoundTrip(req)
}

func (r *idRecorder) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Trim(r.ids[len(r.ids)-1], `"`)
}

// auditLine is the part of an exported audit entry the test reads.
type auditLine struct {
	Seq   uint64 `json:"seq"`
	Event string `json:"event"`
	Actor struct {
		Tenant       string `json:"tenant"`
		Principal    string `json:"principal"`
		ClientName   string `json:"client_name"`
		AuthClient   string `json:"auth_client"`
		AuthIssuer   string `json:"auth_issuer"`
		RequestID    string `json:"request_id"`
		Trace        string `json:"trace"`
		SessionID    string `json:"session_id"`
		OnBehalfOf   string `json:"on_behalf_of"`
		Model        string `json:"model"`
		ClientStated *struct {
			OnBehalfOf string `json:"on_behalf_of"`
			Model      string `json:"model"`
		} `json:"client_stated"`
	} `json:"actor"`
	Tool           string  `json:"tool"`
	Key            string  `json:"key"`
	Decision       string  `json:"decision"`
	StateAfter     string  `json:"state_after"`
	ErrorCode      string  `json:"error_code"`
	PolicyRule     string  `json:"policy_rule"`
	PolicyAction   string  `json:"policy_action"`
	Replayed       bool    `json:"replayed"`
	ResponseSHA256 string  `json:"response_sha256"`
	DurationMS     float64 `json:"duration_ms"`
	Call           *struct {
		System  string `json:"system"`
		OrderID string `json:"order_id"`
		Version int    `json:"version"`
	} `json:"downstream_call"`
}

// TestAuditEntryOverHTTP: over Streamable HTTP, with a token configured
// with the user it acts for and its model, and a client that states a user,
// a model and a traceparent in _meta, every entry of a create, its replay
// and its refusals carries the session, the JSON-RPC id, the configured
// user and model, the client's statements marked client_stated, the trace,
// the policy check, what the store wrote, and a digest of exactly the text
// the client received. `audit export` and `ops show KEY --json` show the
// same entries; `ops show KEY` lists the call, the replay and the
// refusals.
func TestAuditEntryOverHTTP(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	r := runCLI(t, 10*time.Second, "tokens", "add", "--tokens", tokens, "--principal", "alice", "--tenant", "acme", "--role", "agent",
		"--on-behalf-of", "yuki@example.com", "--model", "model-a")
	if r.Code != 0 {
		t.Fatalf("tokens add --on-behalf-of --model: exit %d: %s", r.Code, r.Stderr)
	}
	token := strings.TrimSpace(r.Stdout)
	db := filepath.Join(dir, "ledger.db")
	base := httpServer(t, db, tokens)

	rec := &idRecorder{}
	tr, err := transport.NewStreamableHTTP(base+"/mcp",
		transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}),
		transport.WithHTTPBasicClient(&http.Client{Transport: rec}))
	if err != nil {
		t.Fatal(err)
	}
	c := client.NewClient(tr)
	ctx := testContext(t)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.ProtocolVersion20251125 // a session-ful era
	init.Params.ClientInfo = mcp.Implementation{Name: "audit-e2e", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	session := tr.GetSessionId()
	if session == "" {
		t.Fatal("no Mcp-Session-Id after initialize")
	}

	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	type sent struct {
		requestID string
		text      string
	}
	call := func(args map[string]any, meta map[string]any) sent {
		t.Helper()
		req := mcp.CallToolRequest{}
		req.Params.Name = "create_order"
		req.Params.Arguments = args
		req.Params.Meta = &mcp.Meta{AdditionalFields: meta}
		res, err := c.CallTool(ctx, req)
		if err != nil {
			t.Fatalf("create_order: %v", err)
		}
		var text string
		for _, ct := range res.Content {
			if tc, ok := ct.(mcp.TextContent); ok {
				text = tc.Text
			}
		}
		return sent{rec.last(), text}
	}
	stated := map[string]any{"idemgate/on_behalf_of": "bob", "idemgate/model": "model-b", "traceparent": traceparent}
	key := newKey()
	args := orderArgs(key, "cust-audit", coffee, nil)
	created := call(args, stated)
	replayed := call(args, stated)
	mismatch := call(orderArgs(key, "cust-audit", []item{{"tea", 1, 900}}, nil), stated)
	invalid := call(orderArgs(key, "cust-audit", []item{{"tea", 0, 900}}, nil), map[string]any{"traceparent": "not-a-traceparent"})
	if !strings.Contains(replayed.text, `"replayed":true`) || !strings.Contains(mismatch.text, "key_reused_with_different_request") || !strings.Contains(invalid.text, "invalid_arguments") {
		t.Fatalf("answers: replay %s\nmismatch %s\ninvalid %s", replayed.text, mismatch.text, invalid.text)
	}

	// Replay and refusal entries are buffered by the server for up to
	// 200 ms; wait until the answer of the last call is in the file. An
	// answer is on the entry of its call's decision (the create's
	// transition, the replay's call entry) or, where it says more than
	// that entry (the mismatch's), on an answer entry: on the entries
	// with a response digest, one per call.
	var lines []auditLine
	if !eventually(10*time.Second, func() bool {
		lines = exportAudit(t, db)
		n := 0
		for _, l := range lines {
			if l.Key == key && l.ResponseSHA256 != "" {
				n++
			}
		}
		return n == 4
	}) {
		t.Fatalf("audit export never held the 4 answers of key %s: %+v", key, lines)
	}
	var mine []auditLine
	for _, l := range lines {
		if l.Key == key {
			mine = append(mine, l)
		}
	}
	sha := func(s string) string { sum := sha256.Sum256([]byte(s)); return hex.EncodeToString(sum[:]) }
	byRequest := map[string]sent{created.requestID: created, replayed.requestID: replayed, mismatch.requestID: mismatch, invalid.requestID: invalid}
	if len(byRequest) != 4 {
		t.Fatalf("JSON-RPC ids %v are not distinct", byRequest)
	}
	seen := map[string]bool{}
	for _, l := range mine {
		a := l.Actor
		s, ok := byRequest[a.RequestID]
		if !ok {
			t.Errorf("entry %d (%s %s): request_id %q is none of the client's tools/call ids", l.Seq, l.Event, l.Decision, a.RequestID)
			continue
		}
		if a.SessionID != session || a.Principal != "alice" || a.Tenant != "acme" || a.OnBehalfOf != "yuki@example.com" || a.Model != "model-a" || a.ClientName != "audit-e2e" {
			t.Errorf("entry %d (%s %s): actor %+v, want session %s, alice/acme for yuki@example.com with model-a from the token", l.Seq, l.Event, l.Decision, a, session)
		}
		if s == invalid {
			if a.Trace != "" || a.ClientStated != nil {
				t.Errorf("entry %d: trace %q, client_stated %+v; want none for a malformed traceparent and no statements", l.Seq, a.Trace, a.ClientStated)
			}
		} else if a.Trace != traceparent || a.ClientStated == nil || a.ClientStated.OnBehalfOf != "bob" || a.ClientStated.Model != "model-b" {
			t.Errorf("entry %d (%s %s): trace %q, client_stated %+v; want the traceparent and bob/model-b marked client_stated", l.Seq, l.Event, l.Decision, a.Trace, a.ClientStated)
		}
		if l.ResponseSHA256 != "" {
			if seen[a.RequestID] {
				t.Errorf("entry %d (%s %s): a second answer of request %s", l.Seq, l.Event, l.Decision, a.RequestID)
			}
			seen[a.RequestID] = true
			if l.ResponseSHA256 != sha(s.text) || l.DurationMS <= 0 {
				t.Errorf("entry %d (%s %s): response_sha256 %s, duration %v; want the SHA-256 of the text the client received (%s) and a duration", l.Seq, l.Event, l.Decision, l.ResponseSHA256, l.DurationMS, sha(s.text))
			}
		}
		if l.Decision == "executed" && (l.Call == nil || l.Call.System != "embedded" || !strings.HasPrefix(l.Call.OrderID, "ord_") || l.Call.Version != 1 || l.PolicyAction != "allow") {
			t.Errorf("executed entry %+v: want the policy check and the embedded order written", l)
		}
	}
	if len(seen) != 4 {
		t.Errorf("answers of requests %v audited, want all 4", seen)
	}

	// ops show --json: the same entries, oldest first, with the record.
	r = runCLI(t, 10*time.Second, "ops", "show", key, "--db", db, "--tenant", "acme", "--json")
	if r.Code != 0 {
		t.Fatalf("ops show --json: exit %d: %s", r.Code, r.Stderr)
	}
	var shown struct {
		Record *struct {
			State string `json:"state"`
		} `json:"record"`
		Total   int         `json:"history_total"`
		History []auditLine `json:"history"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &shown); err != nil {
		t.Fatalf("ops show --json: %v\n%s", err, r.Stdout)
	}
	if shown.Record == nil || shown.Record.State != "succeeded" || shown.Total != len(mine) || len(shown.History) != len(mine) {
		t.Fatalf("ops show --json: record %+v, %d of %d entries; want succeeded and the %d entries of the export", shown.Record, len(shown.History), shown.Total, len(mine))
	}
	for i := range mine {
		if shown.History[i].Seq != mine[i].Seq || shown.History[i].ResponseSHA256 != mine[i].ResponseSHA256 {
			t.Errorf("ops show entry %d = seq %d, want seq %d as exported", i, shown.History[i].Seq, mine[i].Seq)
		}
	}

	// ops show: a table with the call, the replay and the refusals.
	r = runCLI(t, 10*time.Second, "ops", "show", key, "--db", db, "--tenant", "acme")
	if r.Code != 0 {
		t.Fatalf("ops show: exit %d: %s", r.Code, r.Stderr)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^state\s+succeeded \(attempts 1\)$`),
		regexp.MustCompile(`(?m)^\d+\s+\S+\s+transition\s+alice for yuki@example.com \(client says for bob\)\s+model-a \(client says model-b\)\s+\S+\s+` + regexp.QuoteMeta(created.requestID) + `\s+executed: - → succeeded\s.*embedded order ord_\w+ v1`),
		regexp.MustCompile(`(?m)^\d+\s+\S+\s+transition\s+.*\s` + regexp.QuoteMeta(created.requestID) + `\s+executed: - → succeeded\s+sha256:` + sha(created.text)[:12]),
		regexp.MustCompile(`(?m)^\d+\s+\S+\s+call\s+.*\s` + regexp.QuoteMeta(replayed.requestID) + `\s+replay: succeeded\s+sha256:` + sha(replayed.text)[:12]),
		regexp.MustCompile(`(?m)^\d+\s+\S+\s+answer\s+.*\s` + regexp.QuoteMeta(mismatch.requestID) + `\s+rejected\s+key_reused_with_different_request sha256:` + sha(mismatch.text)[:12]),
		regexp.MustCompile(`(?m)^\d+\s+\S+\s+call\s+.*\s` + regexp.QuoteMeta(mismatch.requestID) + `\s+mismatch key_reused_with_different_request\s`),
		regexp.MustCompile(`(?m)^\d+\s+\S+\s+call\s+.*\s` + regexp.QuoteMeta(invalid.requestID) + `\s+refused invalid_arguments\s+sha256:` + sha(invalid.text)[:12]),
	} {
		if !want.MatchString(r.Stdout) {
			t.Errorf("ops show output lacks a line matching %s:\n%s", want, r.Stdout)
		}
	}
}

// TestAuditEntryOverStdio: a stdio server's entries carry the process's
// session id (the same for every call of the process, another for the
// next process) and the user and model of serve --on-behalf-of/--model.
func TestAuditEntryOverStdio(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	cfg := serverConfig{DB: db, Args: []string{"--on-behalf-of", "yuki@example.com", "--model", "model-a"}}
	var keys []string
	for range 2 {
		s := startServer(t, mcpGoLegacy, cfg)
		for range 2 {
			key := newKey()
			keys = append(keys, key)
			s.mustSucceed(t, "create_order", orderArgs(key, "cust-"+key, coffee, map[string]any{"notify_customer": false}))
		}
		s.Close()
	}
	sessions := map[string]string{}
	for _, l := range exportAudit(t, db) {
		if l.ResponseSHA256 == "" {
			continue // not an answering entry (the creates answer on their transitions)
		}
		if l.Actor.OnBehalfOf != "yuki@example.com" || l.Actor.Model != "model-a" || !strings.HasPrefix(l.Actor.SessionID, "stdio-") || l.Actor.RequestID == "" {
			t.Errorf("stdio answer entry actor %+v: want yuki@example.com, model-a, a stdio- session and a request id", l.Actor)
		}
		sessions[l.Key] = l.Actor.SessionID
	}
	if len(sessions) != 4 || sessions[keys[0]] != sessions[keys[1]] || sessions[keys[2]] != sessions[keys[3]] || sessions[keys[0]] == sessions[keys[2]] {
		t.Errorf("sessions by key %v: want one per process, two processes", sessions)
	}
}

// exportAudit is `idemgate audit export` of db, decoded.
func exportAudit(t *testing.T, db string) []auditLine {
	t.Helper()
	r := runCLI(t, 20*time.Second, "audit", "export", "--db", db)
	if r.Code != 0 {
		t.Fatalf("audit export: exit %d: %s", r.Code, r.Stderr)
	}
	var out []auditLine
	dec := json.NewDecoder(strings.NewReader(r.Stdout))
	for dec.More() {
		var l auditLine
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("audit export line: %v", err)
		}
		out = append(out, l)
	}
	return out
}
