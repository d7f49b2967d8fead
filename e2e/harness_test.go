// Package e2e tests idemgate end to end: every test builds nothing of its
// own but drives the real `idemgate serve` binary over stdio with real MCP
// clients (mark3labs/mcp-go and the official go-sdk), in both protocol eras
// (2025-11-25 with the initialize handshake, 2026-07-28 stateless), and
// asserts outcomes — orders in the store, saved result bytes, files in the
// outbox directory — rather than that some code ran.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"idemgate/ledger/postgres/pgtest"
)

// Paths set by TestMain.
var (
	moduleRoot string // directory of idemgate's go.mod
	binDir     string // temporary directory holding the built binaries
	idemgate   string // the idemgate binary
	noopBin    string // the baseline no-op MCP server; "" unless benchmarks run
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	root, err := findModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	moduleRoot = root
	stopOwners, err := setUpOwners()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer stopOwners()
	dir, err := os.MkdirTemp("", "idemgate-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	idemgate = filepath.Join(dir, "idemgate")
	buildArgs := []string{"build", "-o", idemgate}
	if os.Getenv("IDEMGATE_E2E_RACE") == "1" { // race-detect the server too (slow)
		buildArgs = append(buildArgs, "-race")
	}
	if err := goBuild(append(buildArgs, "idemgate")...); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building idemgate:", err)
		return 1
	}
	if f := flag.Lookup("test.bench"); (f != nil && f.Value.String() != "") || os.Getenv("IDEMGATE_BENCH") == "1" {
		noopBin = filepath.Join(dir, "noop")
		if err := goBuild("build", "-o", noopBin, "./e2e/testdata/noop"); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: building the no-op baseline server:", err)
			return 1
		}
	}
	return pgtest.Main(m) // m.Run, then stop the PostgreSQL cluster if a test started one
}

// findModuleRoot asks the go command for idemgate's go.mod, falling back
// to the parent directory (tests run in e2e/).
func findModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if gomod := strings.TrimSpace(string(out)); err == nil && gomod != "" && gomod != os.DevNull {
		return filepath.Dir(gomod), nil
	}
	abs, err := filepath.Abs("..")
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(abs, "go.mod")); err != nil {
		return "", fmt.Errorf("cannot find idemgate's go.mod: %w", err)
	}
	return abs, nil
}

func goBuild(args ...string) error {
	cmd := exec.Command("go", args...)
	cmd.Dir = moduleRoot
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// helperBins builds the programs under testdata/ that only some tests need,
// once, on first use.
var helperBins sync.Map // name → *helperBuild

type helperBuild struct {
	once sync.Once
	path string
	err  error
}

func helperBin(t testing.TB, name string) string {
	t.Helper()
	v, _ := helperBins.LoadOrStore(name, &helperBuild{})
	h := v.(*helperBuild)
	h.once.Do(func() {
		h.path = filepath.Join(binDir, name)
		h.err = goBuild("build", "-o", h.path, "./e2e/testdata/"+name)
	})
	if h.err != nil {
		t.Fatalf("building helper %s: %v", name, h.err)
	}
	return h.path
}

// ---------------------------------------------------------------------------
// Clients and protocol eras

type sdkKind int

const (
	mcpGo sdkKind = iota
	goSDK
)

// flavor is one MCP client library speaking one protocol era.
type flavor struct {
	Name    string
	SDK     sdkKind
	Version string
}

var (
	mcpGoLegacy = flavor{"mcpgo-2025-11-25", mcpGo, mcp.ProtocolVersion20251125}
	mcpGoModern = flavor{"mcpgo-2026-07-28", mcpGo, mcp.ProtocolVersion20260728}
	goSDKLegacy = flavor{"gosdk-2025-11-25", goSDK, "2025-11-25"}
	// goSDKModern is the newest era go-sdk v1.8.0 implements
	// (latestProtocolVersion in its mcp/shared.go).
	goSDKModern = flavor{"gosdk-2026-07-28", goSDK, "2026-07-28"}

	allFlavors = []flavor{mcpGoLegacy, mcpGoModern, goSDKLegacy, goSDKModern}
)

// serverConfig is how one `idemgate serve` process is started.
type serverConfig struct {
	DB        string   // --db; a new file in t.TempDir() when empty
	OutboxDir string   // --outbox-dir; the default (beside --db) when empty
	Tenant    string   // --tenant
	Principal string   // --principal
	Args      []string // further flags
}

func (c serverConfig) args() []string {
	a := []string{"serve", "--db", c.DB, "--log-level", "warn"}
	if c.OutboxDir != "" {
		a = append(a, "--outbox-dir", c.OutboxDir)
	}
	if c.Tenant != "" {
		a = append(a, "--tenant", c.Tenant)
	}
	if c.Principal != "" {
		a = append(a, "--principal", c.Principal)
	}
	return append(a, c.Args...)
}

// session is one server process and the client connected to it.
type session struct {
	t      testing.TB
	flavor flavor
	cfg    serverConfig
	cmd    *exec.Cmd
	stderr *syncBuffer
	piped  string // the ledger file whose owner serves this session's calls, if any

	mc *client.Client
	gs *sdk.ClientSession

	mu       sync.Mutex
	progress []progressEvent

	closeOnce sync.Once
}

type progressEvent struct {
	Token    any
	Progress float64
	Total    float64
	Message  string
}

// syncBuffer is a goroutine-safe buffer for a server's stderr.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startServer starts `idemgate serve` with cfg and connects a client of
// flavor f to it; both are closed when the test ends. The server's stderr
// is kept per session and printed when the test fails.
func startServer(t testing.TB, f flavor, cfg serverConfig) *session {
	t.Helper()
	if cfg.DB == "" {
		cfg.DB = filepath.Join(t.TempDir(), "ledger.db")
		if onPostgres() { // a new database in the test binary's PostgreSQL cluster
			cfg.DB = pgtest.NewDatabase(t)
			if cfg.OutboxDir == "" {
				cfg.OutboxDir = filepath.Join(t.TempDir(), "outbox")
			}
		}
	}
	if dir, ok := pgOutboxes.Load(cfg.DB); ok && cfg.OutboxDir == "" {
		cfg.OutboxDir = dir.(string)
	}
	s, err := connect(t, f, idemgate, cfg.args())
	if err != nil {
		t.Fatalf("start %s server %v: %v", f.Name, cfg.args(), err)
	}
	s.cfg = cfg
	return s
}

// onPostgres reports whether IDEMGATE_E2E_DB=postgres asks the servers
// that startServer starts with no --db of their own to run on PostgreSQL
// (a new database each) instead of a new ledger file.
func onPostgres() bool { return os.Getenv("IDEMGATE_E2E_DB") == "postgres" }

// connect starts bin with args and connects a client of flavor f.
func connect(t testing.TB, f flavor, bin string, args []string) (*session, error) {
	s := &session{t: t, flavor: f, stderr: &syncBuffer{}}
	var stderr io.Writer = s.stderr
	if testing.Verbose() && os.Getenv("IDEMGATE_E2E_STDERR") == "1" {
		stderr = io.MultiWriter(s.stderr, os.Stderr)
	}
	if db, ok := pipedLedger(args); ok {
		// Runs after the session's own clean-up below: the owner ends
		// once its clients have.
		s.piped = db
		t.Cleanup(func() {
			log := ownerLog(db)
			stopOwner(t, db)
			if strings.Contains(log, "WARNING: DATA RACE") {
				t.Errorf("the owner of %s reported a data race", db)
			}
			if strings.Contains(log, "answer mended") {
				t.Errorf("PRODUCT BUG: the owner had to mend an answer (see its log)")
			}
			if _, said := loggedOwners.LoadOrStore(t.Name()+"\x00"+db, true); !said && t.Failed() && log != "" {
				t.Logf("log of the owner of %s:\n%s", db, log)
			}
		})
	}
	t.Cleanup(func() {
		s.Close()
		if strings.Contains(s.stderr.String(), "WARNING: DATA RACE") {
			// Only with IDEMGATE_E2E_RACE=1 (server built with -race).
			t.Errorf("the server reported a data race")
		}
		if strings.Contains(s.stderr.String(), "answer mended") {
			// The server caught an answer breaking isError ⇔ documented error.
			t.Errorf("PRODUCT BUG: the server had to mend an answer (see its stderr)")
		}
		if t.Failed() {
			if out := s.stderr.String(); out != "" {
				t.Logf("stderr of %s %v:\n%s", bin, args, out)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	switch f.SDK {
	case mcpGo:
		tr := transport.NewStdioWithOptions(bin, nil, args,
			transport.WithCommandStderrWriter(stderr),
			// Build the command ourselves so the test holds the process
			// (crash tests SIGKILL it) and its lifetime is not tied to a
			// context.
			transport.WithCommandFunc(func(_ context.Context, command string, env, args []string) (*exec.Cmd, error) {
				cmd := exec.Command(command, args...)
				cmd.Env = append(os.Environ(), env...)
				s.cmd = cmd
				return cmd, nil
			}))
		c := client.NewClient(tr, client.WithProtocolVersion(f.Version))
		// Start the transport with a context that outlives this function:
		// the stdio transport keeps it for the connection's lifetime.
		if err := c.Start(context.Background()); err != nil {
			return nil, fmt.Errorf("start: %w", err)
		}
		s.mc = c
		c.OnNotification(func(n mcp.JSONRPCNotification) {
			if n.Method != "notifications/progress" {
				return
			}
			p := n.Params.AdditionalFields
			ev := progressEvent{Token: p["progressToken"]}
			ev.Progress, _ = p["progress"].(float64)
			ev.Total, _ = p["total"].(float64)
			ev.Message, _ = p["message"].(string)
			s.mu.Lock()
			s.progress = append(s.progress, ev)
			s.mu.Unlock()
		})
		req := mcp.InitializeRequest{}
		req.Params.ClientInfo = mcp.Implementation{Name: "idemgate-e2e", Version: "1"}
		req.Params.ProtocolVersion = f.Version
		if _, err := c.Initialize(ctx, req); err != nil {
			return nil, fmt.Errorf("initialize: %w", err)
		}
		if got := c.ProtocolVersion(); got != f.Version {
			return nil, fmt.Errorf("negotiated protocol %q, want %q", got, f.Version)
		}
	case goSDK:
		cmd := exec.Command(bin, args...)
		cmd.Stderr = stderr
		s.cmd = cmd
		c := sdk.NewClient(&sdk.Implementation{Name: "idemgate-e2e", Version: "1"}, &sdk.ClientOptions{
			ProgressNotificationHandler: func(_ context.Context, r *sdk.ProgressNotificationClientRequest) {
				s.mu.Lock()
				s.progress = append(s.progress, progressEvent{Token: r.Params.ProgressToken, Progress: r.Params.Progress, Total: r.Params.Total, Message: r.Params.Message})
				s.mu.Unlock()
			},
		})
		cs, err := c.Connect(ctx, &sdk.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, &sdk.ClientSessionOptions{ProtocolVersion: f.Version})
		if err != nil {
			return nil, fmt.Errorf("connect: %w", err)
		}
		s.gs = cs
		if got := cs.InitializeResult().ProtocolVersion; got != f.Version {
			return nil, fmt.Errorf("negotiated protocol %q, want %q", got, f.Version)
		}
	}
	return s, nil
}

// Close disconnects the client and lets the server exit (stdin closed).
func (s *session) Close() {
	s.closeOnce.Do(func() {
		switch {
		case s.mc != nil:
			s.mc.Close()
		case s.gs != nil:
			s.gs.Close()
		}
	})
}

// Kill sends SIGKILL to the server process and, when it passes its calls
// to the ledger's owner, to the owner right after: no deferred function, no
// flush, no clean close of the ledger file runs.
func (s *session) Kill() {
	s.t.Helper()
	if s.cmd == nil || s.cmd.Process == nil {
		s.t.Fatal("no server process to kill")
	}
	if err := s.cmd.Process.Kill(); err != nil {
		s.t.Fatalf("kill server: %v", err)
	}
	if s.piped != "" {
		killOwner(s.t, s.piped)
	}
	s.Close()
}

func (s *session) progressEvents() []progressEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.progress)
}

// ---------------------------------------------------------------------------
// Tool calls

// rawResult is a tool result as it came off the wire.
type rawResult struct {
	Texts      []string        // text content items
	Others     int             // content items that are not text
	Structured json.RawMessage // structuredContent
	IsError    bool
}

// callRaw calls tool with args (a map, or json.RawMessage sent verbatim).
// progressToken, when not nil, asks for progress notifications.
func (s *session) callRaw(ctx context.Context, tool string, args any, progressToken any) (*rawResult, error) {
	out := &rawResult{}
	switch {
	case s.mc != nil:
		req := mcp.CallToolRequest{}
		req.Params.Name = tool
		req.Params.Arguments = args
		if progressToken != nil {
			req.Params.Meta = &mcp.Meta{ProgressToken: progressToken}
		}
		res, err := s.mc.CallTool(ctx, req)
		if err != nil {
			return nil, err
		}
		for _, c := range res.Content {
			if tc, ok := c.(mcp.TextContent); ok {
				out.Texts = append(out.Texts, tc.Text)
			} else if tc, ok := c.(*mcp.TextContent); ok {
				out.Texts = append(out.Texts, tc.Text)
			} else {
				out.Others++
			}
		}
		out.Structured = res.RawStructuredContent
		if len(out.Structured) == 0 && res.StructuredContent != nil {
			if out.Structured, err = json.Marshal(res.StructuredContent); err != nil {
				return nil, err
			}
		}
		out.IsError = res.IsError
	case s.gs != nil:
		params := &sdk.CallToolParams{Name: tool, Arguments: args}
		if progressToken != nil {
			params.SetProgressToken(progressToken)
		}
		res, err := s.gs.CallTool(ctx, params)
		if err != nil {
			return nil, err
		}
		for _, c := range res.Content {
			if tc, ok := c.(*sdk.TextContent); ok {
				out.Texts = append(out.Texts, tc.Text)
			} else {
				out.Others++
			}
		}
		if res.StructuredContent != nil {
			if out.Structured, err = json.Marshal(res.StructuredContent); err != nil {
				return nil, err
			}
		}
		out.IsError = res.IsError
	default:
		return nil, errors.New("session is not connected")
	}
	if err := answerRule(tool, out); err != nil {
		// Every answer of every tool obeys the rule; a test that only
		// counts errors must still fail on it.
		s.t.Errorf("[%s] PRODUCT BUG: %v", s.flavor.Name, err)
		return nil, err
	}
	return out, nil
}

// documentedCodes are the error codes of DESIGN §4 (and the README).
var documentedCodes = []string{
	"invalid_arguments", "key_reused_with_different_request", "forbidden", "not_found",
	"precondition_failed", "operation_in_progress", "outcome_unknown", "key_expired",
	"approval_required", "downstream_error", "internal",
}

// answerRule is the rule every tool answer obeys, checked on every answer
// the suite receives: isError holds exactly when structuredContent has an
// error object, and that error has a documented code and a message.
func answerRule(tool string, r *rawResult) error {
	var env struct {
		Error *struct {
			Code    *string `json:"code"`
			Message *string `json:"message"`
		} `json:"error"`
	}
	if len(r.Structured) > 0 {
		if err := json.Unmarshal(r.Structured, &env); err != nil {
			return fmt.Errorf("%s: structuredContent is not an object: %v: %.300s", tool, err, r.Structured)
		}
	}
	switch {
	case r.IsError && env.Error == nil:
		return fmt.Errorf("%s: isError=true without an error object: %.400s", tool, r.Structured)
	case !r.IsError && env.Error != nil:
		return fmt.Errorf("%s: isError=false with an error object: %.400s", tool, r.Structured)
	case env.Error != nil && (env.Error.Code == nil || !slices.Contains(documentedCodes, *env.Error.Code)):
		return fmt.Errorf("%s: isError=true with an undocumented error code: %.400s", tool, r.Structured)
	case env.Error != nil && (env.Error.Message == nil || *env.Error.Message == ""):
		return fmt.Errorf("%s: isError=true with an error without a message: %.400s", tool, r.Structured)
	}
	return nil
}

// envelope is idemgate's result envelope (DESIGN §4).
type envelope struct {
	OperationKey string          `json:"operation_key"`
	Status       string          `json:"status"`
	Replayed     bool            `json:"replayed"`
	Result       json.RawMessage `json:"result"`
	Error        *envelopeError  `json:"error"`
	Approval     *struct {
		ApprovalID          string `json:"approval_id"`
		Status              string `json:"status"`
		Reason              string `json:"reason"`
		EarlierOperationKey string `json:"earlier_operation_key"`
		ExpiresAt           string `json:"expires_at"`
	} `json:"approval"`
	NextAction  string `json:"next_action"`
	Attempts    int    `json:"attempts"`
	FirstSeenAt string `json:"first_seen_at"`
	CompletedAt string `json:"completed_at"`

	IsError bool   `json:"-"` // the tool result's isError
	Text    string `json:"-"` // the envelope exactly as sent (text content)
}

type envelopeError struct {
	Code    string          `json:"code"`
	Message string          `json:"message"`
	Details json.RawMessage `json:"details"`
}

func (e envelope) code() string {
	if e.Error == nil {
		return ""
	}
	return e.Error.Code
}

func (e envelope) String() string {
	if len(e.Text) > 600 {
		return e.Text[:600] + "…"
	}
	return e.Text
}

// orderID is result.order.order_id.
func (e envelope) orderID() string {
	var r struct {
		Order struct {
			OrderID string `json:"order_id"`
		} `json:"order"`
	}
	_ = json.Unmarshal(e.Result, &r)
	return r.Order.OrderID
}

// call calls a tool and decodes its envelope. It checks what every answer
// must satisfy: exactly one text content item, structuredContent present
// and equal (as JSON) to that text, the envelope valid against the
// published output schema, and (callRaw, for every answer) isError ⇔ an
// error with a documented code. It is safe for concurrent use.
func (s *session) call(ctx context.Context, tool string, args any) (envelope, error) {
	return s.callWithProgress(ctx, tool, args, nil)
}

func (s *session) callWithProgress(ctx context.Context, tool string, args any, token any) (envelope, error) {
	r, err := s.callRaw(ctx, tool, args, token)
	if err != nil {
		return envelope{}, fmt.Errorf("%s: %w", tool, err)
	}
	return decodeEnvelope(tool, r)
}

func decodeEnvelope(tool string, r *rawResult) (envelope, error) {
	var e envelope
	if len(r.Texts) != 1 || r.Others != 0 {
		return e, fmt.Errorf("%s: want exactly one text content item, got %d text and %d other", tool, len(r.Texts), r.Others)
	}
	text := r.Texts[0]
	if len(r.Structured) == 0 {
		return e, fmt.Errorf("%s: no structuredContent (text %.200s)", tool, text)
	}
	if !jsonEqual([]byte(text), r.Structured) {
		return e, fmt.Errorf("%s: text content is not the structured JSON:\ntext:       %.400s\nstructured: %.400s", tool, text, r.Structured)
	}
	if err := validateEnvelope([]byte(text)); err != nil {
		return e, fmt.Errorf("%s: answer does not match the published outputSchema: %v\n%.400s", tool, err, text)
	}
	if err := json.Unmarshal([]byte(text), &e); err != nil {
		return e, fmt.Errorf("%s: answer is not the envelope: %w", tool, err)
	}
	e.IsError, e.Text = r.IsError, text
	if e.IsError != (e.Error != nil) {
		return e, fmt.Errorf("%s: isError=%v but error=%v: %s", tool, e.IsError, e.Error != nil, e)
	}
	return e, nil
}

// callTool is call for the test goroutine: any transport or envelope
// problem fails the test.
func (s *session) callTool(t testing.TB, tool string, args any) envelope {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := s.call(ctx, tool, args)
	if err != nil {
		t.Fatalf("[%s] %v", s.flavor.Name, err)
	}
	return e
}

// mustSucceed calls tool and fails the test unless it succeeded.
func (s *session) mustSucceed(t testing.TB, tool string, args any) envelope {
	t.Helper()
	e := s.callTool(t, tool, args)
	if e.IsError || e.Status != "succeeded" {
		t.Fatalf("[%s] %s: want succeeded, got %s", s.flavor.Name, tool, e)
	}
	return e
}

// mustFail calls tool and fails the test unless it answered isError with
// error code code.
func (s *session) mustFail(t testing.TB, tool string, args any, code string) envelope {
	t.Helper()
	e := s.callTool(t, tool, args)
	if !e.IsError || e.code() != code {
		t.Fatalf("[%s] %s: want isError with code %s, got isError=%v %s", s.flavor.Name, tool, code, e.IsError, e)
	}
	return e
}

// ---------------------------------------------------------------------------
// Domain helpers

type item struct {
	SKU   string
	Qty   int
	Price int
}

// orderArgs are create_order arguments; notify_customer is left to its
// default unless extra sets it.
func orderArgs(key, customer string, items []item, extra map[string]any) map[string]any {
	lines := make([]any, 0, len(items))
	for _, it := range items {
		lines = append(lines, map[string]any{"sku": it.SKU, "quantity": it.Qty, "unit_price_minor": it.Price})
	}
	m := map[string]any{"customer_id": customer, "currency": "EUR", "items": lines}
	if key != "" {
		m["operation_key"] = key
	}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

var coffee = []item{{"coffee-1kg", 2, 1850}}

func newKey() string { return uuid.NewString() }

// orderCount is list_orders(customer).count, checked against the list.
func (s *session) orderCount(t testing.TB, customer string) int {
	t.Helper()
	e := s.mustSucceed(t, "list_orders", map[string]any{"customer_id": customer, "limit": 100})
	var r struct {
		Count  int               `json:"count"`
		Orders []json.RawMessage `json:"orders"`
	}
	if err := json.Unmarshal(e.Result, &r); err != nil {
		t.Fatalf("list_orders result: %v: %s", err, e)
	}
	if r.Count != len(r.Orders) {
		t.Fatalf("list_orders: count %d but %d orders", r.Count, len(r.Orders))
	}
	return r.Count
}

// listOrderIDs is the order ids of list_orders(customer).
func listOrderIDs(e envelope) ([]string, error) {
	var r struct {
		Count  int `json:"count"`
		Orders []struct {
			OrderID string `json:"order_id"`
		} `json:"orders"`
	}
	if err := json.Unmarshal(e.Result, &r); err != nil {
		return nil, err
	}
	if r.Count != len(r.Orders) {
		return nil, fmt.Errorf("count %d but %d orders", r.Count, len(r.Orders))
	}
	ids := make([]string, 0, len(r.Orders))
	for _, o := range r.Orders {
		ids = append(ids, o.OrderID)
	}
	return ids, nil
}

// opStatus is the result of get_operation_status.
type opStatus struct {
	Tool          string          `json:"tool"`
	State         string          `json:"state"`
	Attempts      int             `json:"attempts"`
	Result        json.RawMessage `json:"result"`
	DownstreamRef string          `json:"downstream_ref"`
	Expired       bool            `json:"expired"`
	Deliveries    []struct {
		Step      string `json:"step"`
		MessageID string `json:"message_id"`
		State     string `json:"state"`
		Attempts  int    `json:"attempts"`
	} `json:"deliveries"`
}

func decodeStatus(e envelope) (opStatus, error) {
	var st opStatus
	err := json.Unmarshal(e.Result, &st)
	return st, err
}

// status calls get_operation_status; found is false for not_found.
func (s *session) status(t testing.TB, key string) (st opStatus, e envelope, found bool) {
	t.Helper()
	e = s.callTool(t, "get_operation_status", map[string]any{"operation_key": key})
	if e.code() == "not_found" {
		return st, e, false
	}
	if e.IsError {
		t.Fatalf("get_operation_status %s: %s", key, e)
	}
	st, err := decodeStatus(e)
	if err != nil {
		t.Fatalf("get_operation_status result: %v: %s", err, e)
	}
	return st, e, true
}

// ---------------------------------------------------------------------------
// JSON helpers

// jsonEqual reports whether a and b are the same JSON value (numbers
// compared exactly as written after canonical decoding).
func jsonEqual(a, b []byte) bool {
	va, err1 := decodeJSON(a)
	vb, err2 := decodeJSON(b)
	return err1 == nil && err2 == nil && reflect.DeepEqual(va, vb)
}

func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

var (
	outputSchemaOnce sync.Once
	outputSchema     *jsonschema.Schema
	outputSchemaErr  error
)

// validateEnvelope checks an answer against schemas/result.json, the
// outputSchema the server publishes for every tool.
func validateEnvelope(b []byte) error {
	outputSchemaOnce.Do(func() {
		path := filepath.Join(moduleRoot, "schemas", "result.json")
		f, err := os.Open(path)
		if err != nil {
			outputSchemaErr = err
			return
		}
		defer f.Close()
		doc, err := jsonschema.UnmarshalJSON(f)
		if err != nil {
			outputSchemaErr = err
			return
		}
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		if err := c.AddResource("mem:///result.json", doc); err != nil {
			outputSchemaErr = err
			return
		}
		outputSchema, outputSchemaErr = c.Compile("mem:///result.json")
	})
	if outputSchemaErr != nil {
		return fmt.Errorf("compiling result.json: %w", outputSchemaErr)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return err
	}
	return outputSchema.Validate(doc)
}

// testContext is a context bounded by the test's deadline (or 2 minutes).
func testContext(t testing.TB) context.Context {
	d := 2 * time.Minute
	if tt, ok := t.(*testing.T); ok {
		if dl, ok := tt.Deadline(); ok && time.Until(dl) < d {
			d = time.Until(dl) - time.Second
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond every 50 ms until it holds or timeout passes.
func eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// forEachFlavor runs fn as a subtest per client flavor.
func forEachFlavor(t *testing.T, flavors []flavor, fn func(t *testing.T, f flavor)) {
	for _, f := range flavors {
		t.Run(f.Name, func(t *testing.T) { fn(t, f) })
	}
}

func mcpListToolsRequest() mcp.ListToolsRequest { return mcp.ListToolsRequest{} }
