package e2e

// Reaching approvers (docs/approvals.md, "Reaching approvers"): a new approval request
// POSTs one notice to [approvals] notify_webhook, through the outbox — a
// real receiving HTTP server here, the real binary, real ledger files.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// notice is the approvers' notice as documented (version 1).
type notice struct {
	Type                string    `json:"type"`
	Version             int       `json:"version"`
	NoticeID            string    `json:"notice_id"`
	ApprovalID          string    `json:"approval_id"`
	Tenant              string    `json:"tenant"`
	RequestedBy         string    `json:"requested_by"`
	RequestedAt         time.Time `json:"requested_at"`
	ExpiresAt           time.Time `json:"expires_at"`
	Tool                string    `json:"tool"`
	OperationKey        string    `json:"operation_key"`
	Rule                string    `json:"rule"`
	Reason              string    `json:"reason"`
	EarlierOperationKey string    `json:"earlier_operation_key"`
	Summary             string    `json:"summary"`
	Total               *struct {
		AmountMinor int64  `json:"amount_minor"`
		Currency    string `json:"currency"`
	} `json:"total"`
	ConsoleURL string `json:"console_url"`
	Headline   string `json:"headline"`
	Text       string `json:"text"`
}

// noticePost is one POST the receiver got.
type noticePost struct {
	key, signature string
	body           []byte
	status         int
}

// noticeReceiver is an approvers' chat relay: it keeps one notice per
// Idempotency-Key, as a receiver of an idempotent webhook does, and
// answers 503 while it is failing.
type noticeReceiver struct {
	*httptest.Server
	mu       sync.Mutex
	posts    []noticePost
	accepted map[string][]byte // Idempotency-Key → body, first accepted
	failNext int               // answer 503 to this many more POSTs
	down     bool              // answer 503 to every POST
}

func newNoticeReceiver(t *testing.T) *noticeReceiver {
	r := &noticeReceiver{accepted: map[string][]byte{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		p := noticePost{key: req.Header.Get("Idempotency-Key"), signature: req.Header.Get("Idemgate-Signature"), body: body, status: http.StatusOK}
		if req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/json" {
			p.status = http.StatusBadRequest
		} else if r.down || r.failNext > 0 {
			p.status = http.StatusServiceUnavailable
			if r.failNext > 0 {
				r.failNext--
			}
		} else if _, dup := r.accepted[p.key]; !dup {
			r.accepted[p.key] = body
		}
		r.posts = append(r.posts, p)
		w.WriteHeader(p.status)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *noticeReceiver) snapshot() ([]noticePost, map[string][]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	acc := make(map[string][]byte, len(r.accepted))
	for k, v := range r.accepted {
		acc[k] = v
	}
	return append([]noticePost(nil), r.posts...), acc
}

func (r *noticeReceiver) setDown(down bool) {
	r.mu.Lock()
	r.down = down
	r.mu.Unlock()
}

// waitAccepted waits until the receiver has accepted n notices and
// returns them.
func (r *noticeReceiver) waitAccepted(t *testing.T, n int, within time.Duration) map[string][]byte {
	t.Helper()
	var acc map[string][]byte
	if !eventually(within, func() bool { _, acc = r.snapshot(); return len(acc) >= n }) {
		posts, _ := r.snapshot()
		t.Fatalf("the receiver accepted %d notices within %s, want %d (%d POSTs)", len(acc), within, n, len(posts))
	}
	return acc
}

// onlyNotice decodes the one accepted notice.
func onlyNotice(t *testing.T, acc map[string][]byte) (string, notice, []byte) {
	t.Helper()
	if len(acc) != 1 {
		t.Fatalf("accepted notices: %d, want 1", len(acc))
	}
	for k, body := range acc {
		var n notice
		if err := json.Unmarshal(body, &n); err != nil {
			t.Fatalf("notice body %s: %v", body, err)
		}
		return k, n, body
	}
	panic("unreachable")
}

// bigOrder is a create_order over the default approval threshold
// (100000 minor units): 150000.00 EUR… in minor units 150000.
func bigOrder(key string) map[string]any {
	return orderArgs(key, "cust-notify", []item{{"espresso-machine", 1, 150000}}, nil)
}

// notifyConfig writes a configuration file with [approvals] and [console].
func notifyConfig(t *testing.T, webhook, secret, publicURL string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "idemgate.toml")
	body := fmt.Sprintf("[approvals]\nnotify_webhook = %q\nnotify_secret = %q\n\n[console]\npublic_url = %q\n", webhook, secret, publicURL)
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// verifySignature checks Idemgate-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>,
// with t within a minute of now.
func verifySignature(secret, header string, body []byte) error {
	ts, mac, ok := strings.Cut(header, ",v1=")
	ts, ok2 := strings.CutPrefix(ts, "t=")
	if !ok || !ok2 {
		return fmt.Errorf("signature header %q is not t=…,v1=…", header)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("signature time %q: %v", ts, err)
	}
	if d := time.Since(time.Unix(sec, 0)); d < -time.Minute || d > time.Minute {
		return fmt.Errorf("signature time is %s off", d)
	}
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(ts + "."))
	h.Write(body)
	if want := hex.EncodeToString(h.Sum(nil)); !hmac.Equal([]byte(mac), []byte(want)) {
		return fmt.Errorf("signature %s does not match the body (want %s)", mac, want)
	}
	return nil
}

// TestNotifyApprovalRequested: an agent's create_order over the threshold,
// over Streamable HTTP, is held; exactly one POST reaches the receiver,
// with the documented fields, a valid signature, the message id as
// Idempotency-Key, and a console link that opens the approval for the
// tenant's approver (and nobody without a session).
func TestNotifyApprovalRequested(t *testing.T) {
	recv := newNoticeReceiver(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	aliceTok := addToken(t, tokens, "alice", aprTenant, "agent")
	bossTok := addToken(t, tokens, "boss", aprTenant, "approver")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	base := "http://" + addr
	const secret = "notice-secret-1"
	cfg := notifyConfig(t, recv.URL+"/hooks/approvals", secret, base+"/")
	httpServerAt(t, addr, newLedger(t), tokens, "--config", cfg)
	agent := httpSession(t, base, aliceTok)

	key := newKey()
	held := agent.mustHold(t, "create_order", bigOrder(key))
	aprID := held.Approval.ApprovalID

	acc := recv.waitAccepted(t, 1, 15*time.Second)
	time.Sleep(2500 * time.Millisecond) // time for a second POST, were one to come
	posts, acc := recv.snapshot()
	if len(posts) != 1 {
		t.Errorf("the receiver got %d POSTs, want exactly 1", len(posts))
	}
	idemKey, n, body := onlyNotice(t, acc)
	if err := verifySignature(secret, posts[0].signature, body); err != nil {
		t.Errorf("signature: %v", err)
	}
	if n.NoticeID != idemKey || !strings.HasPrefix(idemKey, "msg_") {
		t.Errorf("notice_id %q, Idempotency-Key %q: want the same message id", n.NoticeID, idemKey)
	}
	if n.Type != "approval_requested" || n.Version != 1 {
		t.Errorf("type %q version %d, want approval_requested 1", n.Type, n.Version)
	}
	if n.ApprovalID != aprID || n.Tenant != aprTenant || n.RequestedBy != "alice" || n.Tool != "create_order" || n.OperationKey != key {
		t.Errorf("notice names approval %q tenant %q requester %q tool %q key %q; want %q %q alice create_order %q",
			n.ApprovalID, n.Tenant, n.RequestedBy, n.Tool, n.OperationKey, aprID, aprTenant, key)
	}
	if n.Rule != "amount_threshold" || n.Reason == "" {
		t.Errorf("rule %q reason %q", n.Rule, n.Reason)
	}
	if n.Total == nil || n.Total.AmountMinor != 150000 || n.Total.Currency != "EUR" {
		t.Errorf("total %+v, want 150000 EUR", n.Total)
	}
	if !strings.Contains(n.Summary, "create order") || !strings.Contains(n.Summary, "espresso-machine") {
		t.Errorf("summary does not show the order: %q", n.Summary)
	}
	// The text a chat tool's incoming webhook shows: the change in words
	// and the link on the last line.
	if !strings.HasPrefix(n.Headline, "Place an order for customer ") || !strings.HasPrefix(n.Text, "Approval needed: "+n.Headline+"\n") ||
		!strings.Contains(n.Text, "line espresso-machine") || !strings.Contains(n.Text, "Total: 1500.00 EUR") ||
		!strings.HasSuffix(n.Text, "\nApprove or reject: "+base+"/ui/approvals/"+aprID) {
		t.Errorf("headline %q, text:\n%s", n.Headline, n.Text)
	}
	if n.RequestedAt.IsZero() || !n.ExpiresAt.After(n.RequestedAt) || n.ExpiresAt.Sub(n.RequestedAt) != 24*time.Hour {
		t.Errorf("requested_at %s, expires_at %s: want the default 24h approval", n.RequestedAt, n.ExpiresAt)
	}
	if want := base + "/ui/approvals/" + aprID; n.ConsoleURL != want {
		t.Fatalf("console_url %q, want %q", n.ConsoleURL, want)
	}

	// The link works: the tenant's approver, logged in, sees the request.
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: 10 * time.Second}
	resp, err := hc.Get(n.ConsoleURL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !strings.Contains(resp.Request.URL.Path, "/ui/login") {
		t.Errorf("the link without a session led to %s, want the login page", resp.Request.URL)
	}
	resp, err = hc.PostForm(base+"/ui/login", url.Values{"token": {bossTok}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("approver login: %d", resp.StatusCode)
	}
	resp, err = hc.Get(n.ConsoleURL)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), key) || !strings.Contains(string(page), "alice") {
		t.Errorf("the console link for the approver: %d, names the key %v, the requester %v",
			resp.StatusCode, strings.Contains(string(page), key), strings.Contains(string(page), "alice"))
	}
}

// TestNotifyRetriedThenAcceptedOnce: the receiver fails the first two
// POSTs (503); the outbox retries with backoff, and the third is
// accepted: three POSTs of one notice, the same Idempotency-Key and the
// same bytes, one accepted notice, and the attempts visible in
// get_operation_status (the notice's delivery step: delivered, 3 attempts).
func TestNotifyRetriedThenAcceptedOnce(t *testing.T) {
	recv := newNoticeReceiver(t)
	recv.failNext = 2
	db := newLedger(t)
	agent := startAgent(t, goSDKModern, db,
		"--approval-notify-webhook", recv.URL, "--public-url", "https://gate.example.com")
	key := newKey()
	aprID := agent.mustHold(t, "create_order", bigOrder(key)).Approval.ApprovalID

	acc := recv.waitAccepted(t, 1, 30*time.Second)
	time.Sleep(2500 * time.Millisecond)
	posts, acc := recv.snapshot()
	idemKey, n, body := onlyNotice(t, acc)
	if n.ApprovalID != aprID || n.ConsoleURL != "https://gate.example.com/ui/approvals/"+aprID {
		t.Errorf("notice for %q linking %q", n.ApprovalID, n.ConsoleURL)
	}
	if len(posts) != 3 {
		t.Errorf("POSTs: %d, want 3 (two refused, one accepted)", len(posts))
	}
	for i, p := range posts {
		want := http.StatusServiceUnavailable
		if i == 2 {
			want = http.StatusOK
		}
		if p.key != idemKey || string(p.body) != string(body) || p.status != want {
			t.Errorf("POST %d: key %q status %d same body %v; want key %q status %d, the same bytes", i+1, p.key, p.status, string(p.body) == string(body), idemKey, want)
		}
		if p.signature != "" {
			t.Errorf("POST %d is signed though no secret is configured", i+1)
		}
	}
	st, e, found := agent.status(t, key)
	if !found {
		t.Fatalf("no status for %s: %s", key, e)
	}
	var step *struct {
		Step      string `json:"step"`
		MessageID string `json:"message_id"`
		State     string `json:"state"`
		Attempts  int    `json:"attempts"`
	}
	for i := range st.Deliveries {
		if st.Deliveries[i].Step == "approval_notice:"+aprID {
			step = &st.Deliveries[i]
		}
	}
	if step == nil {
		t.Fatalf("get_operation_status shows no delivery of the notice: %s", e)
	}
	if step.MessageID != idemKey || step.State != "delivered" || step.Attempts != 3 {
		t.Errorf("notice delivery: %+v, want message %s delivered after 3 attempts", *step, idemKey)
	}
}

// TestNotifyDeliveredAfterRestart: the receiver is down when the approval
// is requested; the server is killed (SIGKILL) after a failed attempt; the
// notice, written with the approval request, is delivered by the next
// server on the same ledger once the receiver is back — and it is still
// delivered although the approval was decided meanwhile (docs/approvals.md:
// a notice is delivered whatever became of its approval).
func TestNotifyDeliveredAfterRestart(t *testing.T) {
	recv := newNoticeReceiver(t)
	recv.setDown(true)
	db := newLedger(t)
	flags := []string{"--approval-notify-webhook", recv.URL, "--public-url", "http://127.0.0.1:8080"}
	agent := startAgent(t, goSDKModern, db, flags...)
	key := newKey()
	args := bigOrder(key)
	aprID := agent.mustHold(t, "create_order", args).Approval.ApprovalID
	if !eventually(15*time.Second, func() bool { p, _ := recv.snapshot(); return len(p) >= 1 }) {
		t.Fatal("the first server never tried to deliver the notice")
	}
	// Killed once the failed attempt is recorded (it rides the ledger's
	// next write, within 200 ms): killed before that, the dead server's
	// claim on the notice would keep the next one off it for the claim's
	// 30 s lease (outbox/claim.go; TestClaimOfDeadDelivererExpires).
	if !eventually(15*time.Second, func() bool { return noticeAttempts(t, agent, key, aprID) >= 1 }) {
		t.Fatal("the first server never recorded its failed attempt at the notice")
	}
	agent.Kill()

	// Decided before the notice got through: approved from the command
	// line, which has no notify_webhook (the notice is not its to deliver).
	cmd := exec.Command(idemgate, "approvals", "approve", aprID, "--db", db, "--principal", "boss", "--tenant", aprTenant, "--comment", "ok")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("approvals approve: %v\n%s", err, out)
	}
	if posts, acc := recv.snapshot(); len(acc) != 0 {
		t.Fatalf("a notice was accepted while the receiver was down: %d POSTs", len(posts))
	}

	recv.setDown(false)
	agent = startAgent(t, goSDKModern, db, flags...)
	acc := recv.waitAccepted(t, 1, 30*time.Second)
	time.Sleep(2500 * time.Millisecond)
	posts, acc := recv.snapshot()
	_, n, _ := onlyNotice(t, acc)
	if n.ApprovalID != aprID || n.OperationKey != key {
		t.Errorf("notice for approval %q key %q, want %q %q", n.ApprovalID, n.OperationKey, aprID, key)
	}
	ok := 0
	for _, p := range posts {
		if p.status == http.StatusOK {
			ok++
		}
	}
	if ok != 1 {
		t.Errorf("accepted POSTs: %d, want 1 (of %d)", ok, len(posts))
	}
	// The operation ran once, by the approval.
	if got := resultOrder(t, agent.mustSucceed(t, "create_order", args)); got.TotalMinor != 150000 {
		t.Errorf("order after approval: %+v", got)
	}
}

// noticeAttempts is the recorded attempts at the approval notice of
// aprID, as get_operation_status of key shows them (0: none shown yet).
func noticeAttempts(t *testing.T, s *session, key, aprID string) int {
	t.Helper()
	st, _, found := s.status(t, key)
	if !found {
		return 0
	}
	for _, d := range st.Deliveries {
		if d.Step == "approval_notice:"+aprID {
			return d.Attempts
		}
	}
	return 0
}
