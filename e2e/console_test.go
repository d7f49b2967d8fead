package e2e

// The web console (docs/console.md, DESIGN §10) in a real headless
// Chromium driven by chromedp: an approver logs in with a token, sees the
// diff, approves with a comment, and the agent's retry over MCP replays the
// outcome; agents' tokens and other tenants see nothing; a forged
// cross-site POST changes nothing; an expired session goes back to the
// login page; two browsers approving at once cause one execution.
//
// The tests skip, with an install hint, when no browser is found — except
// under CI=true, where that is a failure. IDEMGATE_CHROMIUM names the
// browser binary. With IDEMGATE_UPDATE_SCREENSHOTS=1 the screenshots are
// written into docs/console/ (docs/console.md shows them); otherwise into the
// test's temporary directory.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// chromiumPath finds the browser, or skips (fails under CI=true).
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("IDEMGATE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium found for the console tests: install it (Debian/Ubuntu: apt-get install -y chromium) or set IDEMGATE_CHROMIUM to a Chrome/Chromium binary"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// newBrowser starts a headless Chromium with an empty profile of its own
// and returns a tab's context; it is closed at the end of the test.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	bin := chromiumPath(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.WindowSize(1100, 900),
	}
	// Chromium now and then exits while starting on a loaded machine,
	// before it prints its DevTools address, with nothing in its output
	// that says why ("chrome failed to start", seen in a run of the console
	// tests beside other test suites and a CPU hog): a browser that did not
	// start is started again, up to three times in all.
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		// The profile and the browser's temporary files (the singleton
		// socket's directory, left behind when the browser is killed at
		// the end) in one directory of the test's.
		dir := t.TempDir()
		actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(opts, chromedp.UserDataDir(dir), chromedp.Env("TMPDIR="+dir))...)
		ctx, cancelTab := chromedp.NewContext(actx)
		ctx, cancelTime := context.WithTimeout(ctx, 2*time.Minute)
		if err = chromedp.Do(ctx); err == nil { // start the browser now
			t.Cleanup(func() { cancelTime(); cancelTab(); cancelAlloc() })
			return ctx
		}
		cancelTime()
		cancelTab()
		cancelAlloc()
		if !strings.Contains(err.Error(), "chrome failed to start") {
			break
		}
		t.Logf("starting %s (attempt %d): %v", bin, attempt, err)
	}
	t.Fatalf("starting %s: %v", bin, err)
	return nil
}

// do runs browser steps or fails the test.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	step, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(step, steps...); err != nil {
		loc, _ := chromedp.Run(ctx, chromedp.Location())
		body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		t.Fatalf("browser: %s: %v\nat %s:\n%s", what, err, loc, body)
	}
}

// textOf is the visible text of the first element matching css.
func textOf(t *testing.T, ctx context.Context, css string) string {
	t.Helper()
	var err error
	for range 5 { // a page that has just been navigated to may still be replacing its document
		step, cancel := context.WithTimeout(ctx, 10*time.Second)
		s, e := chromedp.Run(step, chromedp.Text(chromedp.CSS(css)))
		cancel()
		if e == nil {
			return strings.TrimSpace(s)
		}
		err = e
		time.Sleep(300 * time.Millisecond)
	}
	t.Fatalf("browser: text of %s: %v", css, err)
	return ""
}

// bodyText is the whole page's text.
func bodyText(t *testing.T, ctx context.Context) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil {
		t.Fatalf("browser: page text: %v", err)
	}
	return s
}

func location(t *testing.T, ctx context.Context) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		t.Fatalf("browser: location: %v", err)
	}
	return s
}

// screenshot saves the page as name.png (see the file comment).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("browser: screenshot %s: %v", name, err)
	}
	dir := t.TempDir()
	if os.Getenv("IDEMGATE_UPDATE_SCREENSHOTS") == "1" {
		dir = filepath.Join(moduleRoot, "docs", "console")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// screenshotOf saves the element css as name.png (see the file comment).
func screenshotOf(t *testing.T, ctx context.Context, css, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS(css)))
	if err != nil {
		t.Fatalf("browser: screenshot %s of %s: %v", name, css, err)
	}
	dir := t.TempDir()
	if os.Getenv("IDEMGATE_UPDATE_SCREENSHOTS") == "1" {
		dir = filepath.Join(moduleRoot, "docs", "console")
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// loginWithToken logs the browser in with token at base's console.
func loginWithToken(t *testing.T, ctx context.Context, base, token string) {
	t.Helper()
	do(t, ctx, "log in",
		chromedp.Navigate(base+"/ui/login"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Submit(chromedp.CSS("#token")),
		chromedp.WaitVisible(chromedp.CSS("#who")),
	)
}

// consoleTokens makes a tokens file with alice (agent, acme), boss and
// boss2 (approvers, acme) and zed (approver, globex); it returns the file
// and the tokens by principal.
func consoleTokens(t *testing.T, dir string) (string, map[string]string) {
	t.Helper()
	file := filepath.Join(dir, "tokens.json")
	toks := map[string]string{
		"alice": addToken(t, file, "alice", aprTenant, "agent"),
		"boss":  addToken(t, file, "boss", aprTenant, "approver"),
		"boss2": addToken(t, file, "boss2", aprTenant, "approver"),
		"zed":   addToken(t, file, "zed", "globex", "approver"),
	}
	return file, toks
}

// TestConsoleApproveCancel: an agent asks over MCP (Streamable HTTP) to
// cancel an order and is held; the approver logs into the console served
// by the same `serve --http` at /ui, sees the request with its diff
// (status placed → cancelled) and the order's total, approves it with a
// comment, and sees the outcome; the order is cancelled once; the agent's
// retry replays the approved outcome byte for byte; the history shows who
// decided and the comment.
func TestConsoleApproveCancel(t *testing.T) {
	ctx := newBrowser(t)
	dir := t.TempDir()
	tokens, toks := consoleTokens(t, dir)
	base := httpServer(t, filepath.Join(dir, "ledger.db"), tokens)
	agent := httpSession(t, base, toks["alice"])

	o := placeOrder(t, agent, "cust-console")
	key := newKey()
	args := cancelArgs(key, o.OrderID, 1)
	id := agent.mustHold(t, "cancel_order", args).Approval.ApprovalID

	do(t, ctx, "open the login page", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	if loc := location(t, ctx); !strings.Contains(loc, "/ui/login") {
		t.Fatalf("without a session /ui led to %s, want the login page", loc)
	}
	screenshot(t, ctx, "login")
	loginWithToken(t, ctx, base, toks["boss"])
	card := "#apr-" + id
	do(t, ctx, "see the approval", chromedp.WaitVisible(chromedp.CSS(card)))
	if got := textOf(t, ctx, "#pending-count"); got != "1" {
		t.Errorf("pending count = %q, want 1", got)
	}
	for css, want := range map[string]string{
		card + " .requester":                    "alice",
		card + " .rule":                         "always_approve",
		card + " .key":                          key,
		card + " table.diff tbody tr td.path":   "status",
		card + " table.diff tbody tr td.before": "placed",
		card + " table.diff tbody tr td.after":  "cancelled",
		card + " .total":                        "",
		card + " time.countdown":                "",
	} {
		got := textOf(t, ctx, css)
		if want == "" {
			if got == "" {
				t.Errorf("%s is empty", css)
			}
			continue
		}
		if got != want {
			t.Errorf("%s = %q, want %q", css, got, want)
		}
	}
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("`+card+` table.diff tbody tr").length`)); err != nil || n != 1 {
		t.Errorf("diff rows = %d (%v), want exactly 1", n, err)
	}
	screenshot(t, ctx, "approvals")

	do(t, ctx, "approve with a comment",
		chromedp.SendKeys(chromedp.CSS("#comment-"+id), "refund issued"),
		chromedp.Click(chromedp.CSS(card+" button.approve")),
		chromedp.WaitVisible(chromedp.CSS("#outcome-status")),
	)
	if got := textOf(t, ctx, "#outcome-status"); got != "succeeded" {
		t.Fatalf("outcome = %q, want succeeded\n%s", got, bodyText(t, ctx))
	}
	if res := textOf(t, ctx, "#outcome-summary"); !strings.Contains(res, "Order "+o.OrderID+" cancelled") {
		t.Errorf("the outcome page does not say the order was cancelled: %s", res)
	}
	screenshot(t, ctx, "outcome")

	replay := agent.mustSucceed(t, "cancel_order", args)
	if !replay.Replayed {
		t.Errorf("the agent's retry was not a replay: %s", replay)
	}
	if got := getOrder(t, agent, o.OrderID); got.Status != "cancelled" || got.Version != 2 {
		t.Errorf("order after approval = %+v, want cancelled at version 2 (one execution)", got)
	}
	if got := resultOrder(t, replay); got.Status != "cancelled" || got.Version != 2 {
		t.Errorf("replayed outcome = %+v", got)
	}

	do(t, ctx, "open the history", chromedp.Navigate(base+"/ui/history"), chromedp.WaitVisible(chromedp.CSS(card)))
	if got := textOf(t, ctx, card+" .comment"); got != "refund issued" {
		t.Errorf("history comment = %q, want %q", got, "refund issued")
	}
	if got := textOf(t, ctx, card+" .decided-by"); !strings.HasPrefix(got, "boss ") {
		t.Errorf("history decided by = %q, want boss", got)
	}
	screenshot(t, ctx, "history")
	do(t, ctx, "the list is empty", chromedp.Navigate(base+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS("#none-pending")))

	// Logging out ends the session: the pages lead to the login again.
	do(t, ctx, "log out",
		chromedp.Click(chromedp.CSS("form.who button")),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.Navigate(base+"/ui/approvals"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
	)
}

// TestConsoleAccess: an agent's token cannot open the console (403, and
// no session: the approvals page leads to the login); an approver of
// another tenant sees no approval of this one, and opening its page by id
// answers 404 without showing anything of it.
func TestConsoleAccess(t *testing.T) {
	ctx := newBrowser(t)
	dir := t.TempDir()
	tokens, toks := consoleTokens(t, dir)
	base := httpServer(t, filepath.Join(dir, "ledger.db"), tokens)
	agent := httpSession(t, base, toks["alice"])
	o := placeOrder(t, agent, "cust-access")
	key := newKey()
	id := agent.mustHold(t, "cancel_order", cancelArgs(key, o.OrderID, 1)).Approval.ApprovalID

	resp, err := chromedp.RunResponse(ctx,
		chromedp.Navigate(base+"/ui/login"),
	)
	if err != nil || resp.Status != 200 {
		t.Fatalf("login page: %v %v", resp, err)
	}
	resp, err = chromedp.RunResponse(ctx,
		chromedp.SendKeys(chromedp.CSS("#token"), toks["alice"]),
		chromedp.Submit(chromedp.CSS("#token")),
	)
	if err != nil {
		t.Fatalf("agent login: %v", err)
	}
	if resp.Status != http.StatusForbidden {
		t.Errorf("an agent's token logging in: status %d, want 403", resp.Status)
	}
	if body := bodyText(t, ctx); !strings.Contains(body, "role agent") {
		t.Errorf("the refusal does not say why: %s", body)
	}
	screenshot(t, ctx, "forbidden")
	do(t, ctx, "approvals without a session", chromedp.Navigate(base+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS("#token")))
	if strings.Contains(bodyText(t, ctx), key) {
		t.Errorf("the page shown to an agent names the operation")
	}

	// The agent's bearer token on the console's pages is no session either.
	req, _ := http.NewRequest("GET", base+"/ui/approvals/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+toks["alice"])
	hr, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	hr.Body.Close()
	if hr.StatusCode != http.StatusSeeOther || !strings.Contains(hr.Header.Get("Location"), "/ui/login") {
		t.Errorf("bearer token on /ui: %d %s, want 303 to the login page", hr.StatusCode, hr.Header.Get("Location"))
	}

	// Another tenant's approver.
	loginWithToken(t, ctx, base, toks["zed"])
	do(t, ctx, "zed's approvals", chromedp.WaitVisible(chromedp.CSS("#none-pending")))
	if got := textOf(t, ctx, "#pending-count"); got != "0" {
		t.Errorf("globex's approver sees %s pending approvals, want 0", got)
	}
	resp, err = chromedp.RunResponse(ctx, chromedp.Navigate(base+"/ui/approvals/"+id))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != http.StatusNotFound {
		t.Errorf("globex's approver opening acme's approval: status %d, want 404", resp.Status)
	}
	if body := bodyText(t, ctx); strings.Contains(body, key) || strings.Contains(body, o.OrderID) || strings.Contains(body, "alice") {
		t.Errorf("globex's approver sees acme's data: %s", body)
	}
	for _, path := range []string{"/ui/history", "/ui/operations", "/ui/attention"} {
		do(t, ctx, "zed's "+path, chromedp.Navigate(base+path), chromedp.WaitVisible(chromedp.CSS("h1")))
		if body := bodyText(t, ctx); strings.Contains(body, key) || strings.Contains(body, "alice") {
			t.Errorf("globex's %s shows acme's operation:\n%s", path, body)
		}
	}
	resp, err = chromedp.RunResponse(ctx, chromedp.Navigate(base+"/ui/operations/"+key))
	if err != nil {
		t.Fatal(err)
	}
	if body := bodyText(t, ctx); resp.Status != http.StatusNotFound || strings.Contains(body, o.OrderID) {
		t.Errorf("globex's approver opening acme's operation: status %d, want 404 showing nothing:\n%s", resp.Status, body)
	}
	agent.mustBeState(t, key, "awaiting_approval")
}

// consoleServer starts `idemgate console` on a free loopback port and
// returns its base URL and the one-time login link it printed.
func consoleServer(t *testing.T, db, tokens string, extra ...string) (base, link string) {
	t.Helper()
	args := append([]string{"--db", db, "--tokens", tokens, "--principal", "boss", "--tenant", aprTenant, "--log-level", "warn"}, extra...)
	base, out := startConsole(t, args, regexp.MustCompile(`http://\S+/ui/login\?once=\S+`))
	return base, out[0]
}

// startConsole starts `idemgate console --listen ADDR args…` on a free
// loopback port and returns its base URL and the first len(want) lines
// of its stderr that match want, in order (each line its match), once
// they are printed; it is stopped with SIGINT at the end of the test.
func startConsole(t *testing.T, args []string, want ...*regexp.Regexp) (base string, matches []string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(idemgate, append([]string{"console", "--listen", addr}, args...)...)
	stopOwnerAtEnd(t, cmd.Args[1:])
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stderr := &syncBuffer{}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Errorf("idemgate console did not stop on SIGINT within 10 s")
		}
		pw.Close()
		if t.Failed() {
			t.Logf("console stderr:\n%s", stderr.String())
		}
	})
	found := make(chan []string, 1)
	go func() {
		var got []string
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			fmt.Fprintln(stderr, sc.Text())
			if len(got) < len(want) {
				if m := want[len(got)].FindString(sc.Text()); m != "" {
					if got = append(got, m); len(got) == len(want) {
						found <- got
					}
				}
			}
		}
	}()
	select {
	case matches = <-found:
	case <-time.After(10 * time.Second):
		t.Fatalf("idemgate console did not print %q within 10 s:\n%s", want, stderr.String())
	}
	return "http://" + addr, matches
}

// TestConsoleStandaloneLoginPage: `idemgate console` without --principal
// or --token prints the login page's address (no one-time link: nobody
// was named to log in as) — and, with --public-url, the same page there —
// and that address opens the login page, where an approver's token logs
// in. The public URL is https, so the session cookie is Secure although
// the console itself speaks plain HTTP (TLS ends at a proxy in front),
// and a request carrying the public URL's host is served on the loopback
// listener while another host is refused.
func TestConsoleStandaloneLoginPage(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	tokens, toks := consoleTokens(t, dir)
	agent := startAgent(t, mcpGoModern, db)
	placeOrder(t, agent, "cust-login-page") // the ledger exists and has entries
	base, printed := startConsole(t, []string{"--db", db, "--tokens", tokens, "--public-url", "https://gate.example.com", "--log-level", "warn"},
		regexp.MustCompile(`^\s+http://\S+$`), regexp.MustCompile(`^\s+https://gate\.example\.com\S*$`))
	local, public := strings.TrimSpace(printed[0]), strings.TrimSpace(printed[1])
	if local != base+"/ui/login" || public != "https://gate.example.com/ui/login" {
		t.Fatalf("printed %q and %q, want %s/ui/login and https://gate.example.com/ui/login", local, public, base)
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(local)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `id="token"`) || strings.Contains(string(body), "ended") {
		t.Fatalf("the printed address: status %d, want the login page with no notice\n%s", resp.StatusCode, body)
	}
	resp, err = noRedirect.PostForm(base+"/ui/login", url.Values{"token": {toks["boss"]}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var session *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "idemgate_console" {
			session = c
		}
	}
	if resp.StatusCode != http.StatusSeeOther || session == nil {
		t.Fatalf("login with boss's token: status %d, cookies %v; want 303 and a session", resp.StatusCode, resp.Cookies())
	}
	if !session.Secure || !session.HttpOnly || session.SameSite != http.SameSiteStrictMode {
		t.Errorf("session cookie %+v: want Secure (the public URL is https), HttpOnly, SameSite=Strict", session)
	}
	for host, want := range map[string]int{"gate.example.com": http.StatusOK, "attacker.example": http.StatusForbidden} {
		req, _ := http.NewRequest("GET", base+"/ui/login", nil)
		req.Host = host
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != want {
			t.Errorf("Host %s on the loopback listener: status %d, want %d", host, r.StatusCode, want)
		}
	}
}

// TestConsoleStandaloneCrossSiteAndExpiry: `idemgate console` serves the
// console alone over the agents' ledger file and prints a one-time login
// link, which works once. A page of another site that posts an approval
// form to the console with the approver's cookie is refused (403) and
// changes nothing: the approval stays pending and the order untouched. A
// Host that is not a loopback name is refused (DNS rebinding). When the
// session's lifetime has passed — and not before — the console leads back
// to the login.
//
// The session lives sessionTTL from the login; everything that needs it
// alive (the forged post, then "still logged in") runs right after the
// login, and the slow parts (starting a second browser, the agent's
// checks) after that, so a loaded machine cannot end the session before
// it is checked. (It did: with every step between login and the check
// taking its time, the 15 s session ended first and the check saw the
// login page.) The expiry itself is waited for as a condition: the
// console is asked again until it shows the login, which must not happen
// before the lifetime has passed.
func TestConsoleStandaloneCrossSiteAndExpiry(t *testing.T) {
	ctx := newBrowser(t)
	other := newBrowser(t) // started now: a browser's start is the slowest step on a loaded machine
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	tokens, _ := consoleTokens(t, dir)
	agent := startAgent(t, mcpGoModern, db)
	o := placeOrder(t, agent, "cust-forged")
	key := newKey()
	args := cancelArgs(key, o.OrderID, 1)
	id := agent.mustHold(t, "cancel_order", args).Approval.ApprovalID

	// A page on another origin that submits a decision form to the console.
	var base string
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%s/ui/approvals/%s/decide">
<input name="decision" value="approve"><input name="comment" value="forged"></form>
<script>document.getElementById("f").submit()</script>`, base, id)
	}))
	defer evil.Close()

	const ttl = 20 * time.Second
	base, link := consoleServer(t, db, tokens, "--session-ttl", ttl.String())
	loginStarted := time.Now() // the session cannot start before this
	do(t, ctx, "log in by the link", chromedp.Navigate(link), chromedp.WaitVisible(chromedp.CSS("#apr-"+id)))
	if got := textOf(t, ctx, "#who"); !strings.HasPrefix(got, "boss") {
		t.Errorf("logged in as %q, want boss", got)
	}

	resp, err := chromedp.RunResponse(ctx, chromedp.Navigate(evil.URL))
	if err != nil {
		t.Fatal(err)
	}
	do(t, ctx, "wait for the forged post's answer", chromedp.WaitVisible(chromedp.CSS("#error")))
	if loc := location(t, ctx); !strings.Contains(loc, "/decide") {
		t.Fatalf("the forged form did not post to the console (at %s)", loc)
	}
	if body := bodyText(t, ctx); !strings.Contains(body, "another site") {
		t.Errorf("the forged post was not refused as cross-site: %s", body)
	}
	// The session itself still works: the refusal was the request's origin.
	do(t, ctx, "still logged in", chromedp.Navigate(base+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS("#apr-"+id)))
	if took := time.Since(loginStarted); took >= ttl {
		t.Logf("the session was checked %s after the login (lifetime %s): the machine is very slow", took.Round(time.Millisecond), ttl)
	}
	do(t, ctx, "back to the refusal for its picture", chromedp.Navigate(evil.URL), chromedp.WaitVisible(chromedp.CSS("#error")))
	screenshot(t, ctx, "cross-site-refused")

	if again := agent.mustHold(t, "cancel_order", args); again.Approval.ApprovalID != id {
		t.Errorf("after the forged post: approval %s, want the same pending %s", again.Approval.ApprovalID, id)
	}
	agent.mustBeState(t, key, "awaiting_approval")
	if got := getOrder(t, agent, o.OrderID); got.Status != "placed" || got.Version != 1 {
		t.Errorf("order after the forged post = %+v, want placed at version 1", got)
	}

	// A second browser opening the same link gets the login page.
	resp, err = chromedp.RunResponse(other, chromedp.Navigate(link))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != http.StatusUnauthorized || !strings.Contains(bodyText(t, other), "already used") {
		t.Errorf("the login link opened twice: status %d, want 401 saying it was used", resp.Status)
	}

	// DNS rebinding: a loopback listener answers only loopback names.
	req, _ := http.NewRequest("GET", base+"/ui/login", nil)
	req.Host = "attacker.example:80"
	hr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	hr.Body.Close()
	if hr.StatusCode != http.StatusForbidden {
		t.Errorf("Host attacker.example on loopback: status %d, want 403", hr.StatusCode)
	}

	// The session ends after its lifetime: ask until the console shows the
	// login (every 250 ms from shortly before the earliest moment it may).
	time.Sleep(time.Until(loginStarted.Add(ttl - time.Second)))
	for {
		do(t, ctx, "approvals near the session's end", chromedp.Navigate(base+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS("#token, #apr-"+id)))
		answered := time.Now() // the console decided before this
		if strings.Contains(location(t, ctx), "/ui/login") {
			if early := loginStarted.Add(ttl).Sub(answered); early > 0 {
				t.Errorf("the session ended %s before its lifetime of %s", early.Round(time.Millisecond), ttl)
			}
			break
		}
		if time.Since(loginStarted) > ttl+30*time.Second {
			t.Fatalf("the session still works %s after the login (lifetime %s)", time.Since(loginStarted).Round(time.Second), ttl)
		}
		time.Sleep(250 * time.Millisecond)
	}
	screenshot(t, ctx, "session-expired")
	agent.mustBeState(t, key, "awaiting_approval")
}

// TestConsoleTwoBrowsersApproveAtOnce: two approvers in two browsers open
// the same request and press Approve at the same moment: the order is
// cancelled once (version 2, not 3); both pages show it succeeded, and
// exactly one of them executed it (the other shows the recorded outcome).
func TestConsoleTwoBrowsersApproveAtOnce(t *testing.T) {
	b1, b2 := newBrowser(t), newBrowser(t)
	dir := t.TempDir()
	tokens, toks := consoleTokens(t, dir)
	base := httpServer(t, filepath.Join(dir, "ledger.db"), tokens)
	agent := httpSession(t, base, toks["alice"])
	o := placeOrder(t, agent, "cust-race")
	key := newKey()
	args := cancelArgs(key, o.OrderID, 1)
	id := agent.mustHold(t, "cancel_order", args).Approval.ApprovalID

	browsers := []context.Context{b1, b2}
	for i, who := range []string{"boss", "boss2"} {
		loginWithToken(t, browsers[i], base, toks[who])
		do(t, browsers[i], "open the approval",
			chromedp.Navigate(base+"/ui/approvals/"+id),
			chromedp.WaitVisible(chromedp.CSS("#apr-"+id+" button.approve")),
			chromedp.SendKeys(chromedp.CSS("#comment-"+id), "ok by "+who),
		)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	start := make(chan struct{})
	for i := range browsers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = chromedp.Do(browsers[i],
				chromedp.Click(chromedp.CSS("#apr-"+id+" button.approve")),
				chromedp.WaitVisible(chromedp.CSS("#outcome-status")),
			)
		}()
	}
	close(start)
	wg.Wait()
	executed := 0
	for i, ctx := range browsers {
		if errs[i] != nil {
			t.Fatalf("browser %d: %v", i+1, errs[i])
		}
		if got := textOf(t, ctx, "#outcome-status"); got != "succeeded" {
			t.Errorf("browser %d: outcome %q, want succeeded\n%s", i+1, got, bodyText(t, ctx))
		}
		switch h := textOf(t, ctx, "#outcome h1"); {
		case h == "Approved: the order was cancelled":
			executed++
		case !regexp.MustCompile(`^Already decided by boss2? at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC: succeeded$`).MatchString(h):
			t.Errorf("browser %d: heading %q, want the executed approval's or the loser's (already decided by whom, when)", i+1, h)
		}
	}
	if executed != 1 {
		t.Errorf("%d browsers executed the approval, want exactly 1", executed)
	}
	if got := getOrder(t, agent, o.OrderID); got.Status != "cancelled" || got.Version != 2 {
		t.Errorf("order = %+v, want cancelled at version 2 (one execution)", got)
	}
	if replay := agent.mustSucceed(t, "cancel_order", args); !replay.Replayed {
		t.Errorf("agent retry not replayed: %s", replay)
	}
}

// TestConsoleOutcomeHeadings: the page after a decision is headed by what
// became of this approver's action, not by the operation's state alone.
// An approver who requested an operation sees no decide buttons on it,
// and one who posts a decision anyway reads that it was refused and why,
// never a heading that says Approved; an approver whose Approve runs the operation reads
// what it did; one who presses Approve on a page opened before another
// approver decided reads who decided, when, and the outcome.
func TestConsoleOutcomeHeadings(t *testing.T) {
	b1, b2 := newBrowser(t), newBrowser(t)
	dir := t.TempDir()
	tokens, toks := consoleTokens(t, dir)
	base := httpServer(t, filepath.Join(dir, "ledger.db"), tokens)
	agent := httpSession(t, base, toks["alice"])
	bossAgent := httpSession(t, base, toks["boss"]) // an approver who also asks
	o1, o2 := placeOrder(t, agent, "cust-heading-1"), placeOrder(t, bossAgent, "cust-heading-2")
	byAlice := agent.mustHold(t, "cancel_order", cancelArgs(newKey(), o1.OrderID, 1)).Approval.ApprovalID
	byBoss := bossAgent.mustHold(t, "cancel_order", cancelArgs(newKey(), o2.OrderID, 1)).Approval.ApprovalID

	loginWithToken(t, b1, base, toks["boss"])
	loginWithToken(t, b2, base, toks["boss2"])
	// boss2 opens alice's request before boss decides it.
	do(t, b2, "boss2 opens alice's request", chromedp.Navigate(base+"/ui/approvals/"+byAlice), chromedp.WaitVisible(chromedp.CSS("#apr-"+byAlice+" button.approve")))

	approve := func(ctx context.Context, who, id string) (heading, status string) {
		t.Helper()
		do(t, ctx, who+" approves "+id,
			chromedp.Navigate(base+"/ui/approvals/"+id),
			chromedp.WaitVisible(chromedp.CSS("#apr-"+id+" button.approve")),
			chromedp.Click(chromedp.CSS("#apr-"+id+" button.approve")),
			chromedp.WaitVisible(chromedp.CSS("#outcome h1")),
		)
		return textOf(t, ctx, "#outcome h1"), textOf(t, ctx, "#outcome-status")
	}
	// boss's own request shows no decide buttons and says why; a decision
	// posted anyway (a page kept from before, a hand-made form) is refused
	// under a heading that does not say Approved.
	do(t, b1, "boss opens his own request", chromedp.Navigate(base+"/ui/approvals/"+byBoss), chromedp.WaitVisible(chromedp.CSS("#apr-"+byBoss+" .own-request")))
	if n, err := chromedp.Run(b1, chromedp.Evaluate[int](`document.querySelectorAll("#apr-`+byBoss+` button").length`)); err != nil || n != 0 {
		t.Errorf("the requester sees %d buttons on his own request (%v), want none", n, err)
	}
	if got := textOf(t, b1, "#apr-"+byBoss+" .own-request"); !strings.Contains(got, "You asked for this operation") {
		t.Errorf("the requester's card says %q, want why he may not decide", got)
	}
	if _, err := chromedp.Run(b1, chromedp.Evaluate[bool](`(function(){var f=document.createElement("form");f.method="post";f.action="/ui/approvals/`+byBoss+`/decide";var i=document.createElement("input");i.name="decision";i.value="approve";f.appendChild(i);document.body.appendChild(f);f.submit();return true})()`)); err != nil {
		t.Fatalf("browser: post an approve of boss's own request: %v", err)
	}
	do(t, b1, "the answer to boss's own approve", chromedp.WaitVisible(chromedp.CSS("#outcome h1")))
	if h, st := textOf(t, b1, "#outcome h1"), textOf(t, b1, "#outcome-status"); h != "Refused: you requested this operation; another approver must decide" || st != "awaiting_approval" || strings.Contains(strings.ToLower(h), "approved") {
		t.Errorf("boss approving his own request: heading %q, status %q; want %q and awaiting_approval\n%s", h, st, "Refused: you requested this operation; another approver must decide", bodyText(t, b1))
	}
	screenshot(t, b1, "outcome-own-request")
	if h, st := approve(b1, "boss", byAlice); h != "Approved: the order was cancelled" || st != "succeeded" {
		t.Errorf("boss approving alice's request: heading %q, status %q; want \"Approved: the order was cancelled\" and succeeded\n%s", h, st, bodyText(t, b1))
	}
	// boss2 presses Approve on the page opened before boss decided.
	do(t, b2, "boss2 approves late",
		chromedp.Click(chromedp.CSS("#apr-"+byAlice+" button.approve")),
		chromedp.WaitVisible(chromedp.CSS("#outcome h1")),
	)
	late := regexp.MustCompile(`^Already decided by boss at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC: succeeded$`)
	if h := textOf(t, b2, "#outcome h1"); !late.MatchString(h) {
		t.Errorf("boss2 approving after boss: heading %q, want it to match %s\n%s", h, late, bodyText(t, b2))
	}
	screenshot(t, b2, "outcome-already-decided")
	if h, _ := approve(b2, "boss2", byBoss); h != "Approved: the order was cancelled" {
		t.Errorf("boss2 approving boss's request: heading %q, want \"Approved: the order was cancelled\"", h)
	}
	for _, o := range []string{o1.OrderID, o2.OrderID} {
		if got := getOrder(t, agent, o); got.Status != "cancelled" || got.Version != 2 {
			t.Errorf("order %s = %+v, want cancelled once (version 2)", o, got)
		}
	}
}

// TestConsoleResolveUnknown: an operation whose outcome is unknown (the
// order API committed it but the reply was lost, and its lookup is down)
// shows on the "Needs a person" page of `idemgate console`; Reconcile
// there answers that it is still unknown; the approver resolves it with
// evidence and the order system's id; the operation page then shows it
// succeeded and its audit history names the resolver and the evidence;
// the agent's retry replays it and the order API received one write.
func TestConsoleResolveUnknown(t *testing.T) {
	ctx := newBrowser(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	tokens, _ := consoleTokens(t, dir)
	api := newFakeAPI(t)
	agent := startAPIServer(t, mcpGoModern, api, serverConfig{DB: db, Tenant: aprTenant, Principal: "alice"})
	key := newKey()
	args := faOrder(key, "cust-console-unknown")
	api.Inject(fault{Kind: DropReplyAfterCommit, Match: matchCreate})
	api.SetLookupUnavailable(true)
	defer api.SetLookupUnavailable(false)
	agent.mustFail(t, "create_order", args, "outcome_unknown")
	o := api.OrderForKey(idemKey(aprTenant, key))

	base, link := consoleServer(t, db, tokens, apiArgs(api)...)
	do(t, ctx, "log in", chromedp.Navigate(link), chromedp.WaitVisible(chromedp.CSS("#who")))
	do(t, ctx, "needs a person",
		chromedp.Navigate(base+"/ui/attention"),
		chromedp.WaitVisible(chromedp.CSS(`#ops a[href="/ui/operations/`+key+`"]`)),
	)
	screenshot(t, ctx, "needs-a-person")
	do(t, ctx, "open the operation and reconcile",
		chromedp.Click(chromedp.CSS(`#ops a[href="/ui/operations/`+key+`"]`)),
		chromedp.WaitVisible(chromedp.CSS("#reconcile")),
		chromedp.Click(chromedp.CSS("#reconcile")),
		chromedp.WaitVisible(chromedp.CSS("#outcome-status")),
	)
	if got := textOf(t, ctx, "#op-state"); got != "unknown" {
		t.Fatalf("after reconcile with the lookup down: state %q, want unknown", got)
	}
	evidence := "found " + o.OrderID + " in the order system's admin screen"
	do(t, ctx, "resolve with evidence",
		chromedp.Click(chromedp.CSS(`input[name=outcome][value=succeeded]`)),
		chromedp.SendKeys(chromedp.CSS("#evidence"), evidence),
		chromedp.SendKeys(chromedp.CSS("#downstream_ref"), o.OrderID),
		chromedp.Click(chromedp.CSS("#resolve")),
		// The page before had an outcome too (the reconcile's): wait for the new state.
		chromedp.WaitVisible(chromedp.CSS("#op-state.s-succeeded")),
	)
	if got := textOf(t, ctx, "#op-state"); got != "succeeded" {
		t.Fatalf("after resolve: state %q, want succeeded\n%s", got, bodyText(t, ctx))
	}
	audit := textOf(t, ctx, "#audit")
	if !strings.Contains(audit, "boss") || !strings.Contains(audit, evidence) {
		t.Errorf("the audit history does not name the resolver and the evidence:\n%s", audit)
	}
	screenshot(t, ctx, "operation")
	if e := agent.mustSucceed(t, "create_order", args); !e.Replayed || e.orderID() != o.OrderID {
		t.Errorf("the agent's retry after the resolution: %s, want a replay of %s", e, o.OrderID)
	}
	if w := api.WritesFor(idemKey(aprTenant, key)); w != 1 {
		t.Errorf("the API received %d writes for the key, want 1", w)
	}
	do(t, ctx, "operations list", chromedp.Navigate(base+"/ui/operations?state=succeeded"), chromedp.WaitVisible(chromedp.CSS("#ops")))
	screenshot(t, ctx, "operations")
}

// TestConsoleSuspectedDuplicate: an order that repeats an earlier one
// under a new key is held as a suspected duplicate; the console heads it
// as a second order that looks like the earlier order, and shows it side
// by side with the earlier operation (its key, when, its state and its
// order), saying the two requests are identical; rejecting it runs
// nothing (the customer keeps one order).
func TestConsoleSuspectedDuplicate(t *testing.T) {
	ctx := newBrowser(t)
	dir := t.TempDir()
	tokens, toks := consoleTokens(t, dir)
	base := httpServer(t, filepath.Join(dir, "ledger.db"), tokens)
	agent := httpSession(t, base, toks["alice"])
	firstKey := newKey()
	first := agent.mustSucceed(t, "create_order", orderArgs(firstKey, "cust-dup", coffee, nil))
	key := newKey()
	id := agent.mustHold(t, "create_order", orderArgs(key, "cust-dup", coffee, nil)).Approval.ApprovalID

	loginWithToken(t, ctx, base, toks["boss"])
	card := "#apr-" + id
	do(t, ctx, "see the held duplicate", chromedp.WaitVisible(chromedp.CSS(card+" .earlier")))
	if got := textOf(t, ctx, card+" .reason"); got == "" {
		t.Errorf("no reason shown")
	}
	earlier := textOf(t, ctx, card+" .earlier")
	if !strings.Contains(earlier, firstKey) || !strings.Contains(earlier, "succeeded") || !strings.Contains(earlier, first.orderID()) {
		t.Errorf("the earlier operation is not shown with its key, state and order %s:\n%s", first.orderID(), earlier)
	}
	if got := textOf(t, ctx, card+" .total"); !strings.Contains(got, "37.00 EUR") {
		t.Errorf("total = %q, want 37.00 EUR", got)
	}
	for css, want := range map[string]string{
		card + " header .headline": "Place a second order for customer cust-dup that looks like order " + first.orderID(),
		card + " .earlier-key":     firstKey,
		card + " .earlier-order":   first.orderID(),
	} {
		if got := textOf(t, ctx, css); got != want {
			t.Errorf("%s = %q, want %q", css, got, want)
		}
	}
	if got := textOf(t, ctx, card+" .reason"); !strings.Contains(got, firstKey) {
		t.Errorf("the reason %q does not name the earlier key", got)
	}
	if got := textOf(t, ctx, card+" .same"); !strings.Contains(got, "identical") {
		t.Errorf("the card does not say what is identical: %q", got)
	}
	screenshot(t, ctx, "suspected-duplicate")
	do(t, ctx, "phone width", chromedp.EmulateViewport(390, 844), chromedp.Navigate(base+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS(card+" .earlier")))
	if bad := cutOff(t, ctx); bad != "" {
		t.Errorf("the side-by-side comparison at phone width is cut off:\n%s", bad)
	}
	do(t, ctx, "desktop width", chromedp.EmulateViewport(1100, 900), chromedp.Navigate(base+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS(card+" button.reject")))
	do(t, ctx, "reject it",
		chromedp.SendKeys(chromedp.CSS("#comment-"+id), "the customer ordered once"),
		chromedp.Click(chromedp.CSS(card+" button.reject")),
		chromedp.WaitVisible(chromedp.CSS("#outcome-status")),
	)
	if got := textOf(t, ctx, "#outcome-status"); got != "rejected" {
		t.Errorf("outcome = %q, want rejected", got)
	}
	if n := agent.orderCount(t, "cust-dup"); n != 1 {
		t.Errorf("the customer has %d orders, want 1", n)
	}
	agent.mustBeState(t, key, "rejected")
}

// TestConsoleRequeueDeadLetter: a notification the gateway refuses (400)
// is dead-lettered and listed on "Needs a person"; once the gateway is
// fixed, Requeue in the console delivers it — exactly once.
func TestConsoleRequeueDeadLetter(t *testing.T) {
	ctx := newBrowser(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	tokens, _ := consoleTokens(t, dir)
	var (
		mu         sync.Mutex
		fixed      bool
		deliveries = map[string]int{}
	)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		defer mu.Unlock()
		if !fixed {
			http.Error(w, `{"error":"recipient blocked"}`, http.StatusBadRequest)
			return
		}
		deliveries[r.Header.Get("Idempotency-Key")]++
		w.WriteHeader(http.StatusOK)
	}))
	defer gw.Close()
	agent := startServer(t, mcpGoModern, serverConfig{DB: db, Tenant: aprTenant, Principal: "alice", Args: []string{"--notify-webhook", gw.URL}})
	key := newKey()
	agent.mustSucceed(t, "send_notification", map[string]any{
		"operation_key": key, "channel": "email", "to": []string{"ops@example.com"}, "subject": "hello", "body": "your order shipped",
	})

	base, link := consoleServer(t, db, tokens, "--notify-webhook", gw.URL)
	do(t, ctx, "log in", chromedp.Navigate(link), chromedp.WaitVisible(chromedp.CSS("#who")))
	deadline := time.Now().Add(20 * time.Second)
	for {
		do(t, ctx, "needs a person", chromedp.Navigate(base+"/ui/attention"), chromedp.WaitVisible(chromedp.CSS("#dead-count")))
		if textOf(t, ctx, "#dead-count") == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refused message was not listed as dead-lettered within 20 s:\n%s", bodyText(t, ctx))
		}
		time.Sleep(300 * time.Millisecond)
	}
	if row := textOf(t, ctx, "#dead"); !strings.Contains(row, key) || !strings.Contains(row, "ops@example.com") {
		t.Errorf("the dead letter row does not show its operation and recipient:\n%s", row)
	}
	screenshot(t, ctx, "dead-letters")
	mu.Lock()
	fixed = true
	mu.Unlock()
	do(t, ctx, "requeue",
		chromedp.Click(chromedp.CSS("#dead button.requeue")),
		chromedp.WaitVisible(chromedp.CSS("#no-dead")),
	)
	if !eventually(10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(deliveries) == 1
	}) {
		t.Fatalf("the requeued message was not delivered within 10 s")
	}
	time.Sleep(time.Second) // any second delivery would arrive by now
	mu.Lock()
	for id, n := range deliveries {
		if n != 1 {
			t.Errorf("message %s delivered %d times, want once", id, n)
		}
	}
	mu.Unlock()
	do(t, ctx, "the operation's messages", chromedp.Navigate(base+"/ui/operations/"+key), chromedp.WaitVisible(chromedp.CSS("table.messages")))
	if got := textOf(t, ctx, "table.messages"); !strings.Contains(got, "delivered") {
		t.Errorf("the operation page does not show the message delivered:\n%s", got)
	}
	// The requeue is in the audit log, naming who requeued which message.
	if got := textOf(t, ctx, "#audit"); !regexp.MustCompile(`(?s)boss.*operator.*requeued.*message msg_`).MatchString(got) {
		t.Errorf("the operation's history does not show boss's requeue of the message:\n%s", got)
	}
}

// TestConsoleOverview: after an order, its replay, a mismatch under its
// key, a second customer's order and a suspected duplicate approved from
// the console, the Overview shows exactly the numbers `idemgate stats`
// prints for the tenant (read by that command from the same ledger file
// while the server runs), draws the replay in the current hour's bar,
// shows the audit chain verified at the console's start without a press
// and verifies it again on request, and reads at phone width without
// sideways scrolling. Operations filtered by customer list that
// customer's orders only.
func TestConsoleOverview(t *testing.T) {
	ctx := newBrowser(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	tokens, toks := consoleTokens(t, dir)
	base := httpServer(t, db, tokens)
	agent := httpSession(t, base, toks["alice"])

	key := newKey()
	args := orderArgs(key, "cust-ov-a", coffee, map[string]any{"notify_customer": false})
	agent.mustSucceed(t, "create_order", args)
	if e := agent.mustSucceed(t, "create_order", args); !e.Replayed {
		t.Fatalf("the retry was not a replay: %s", e)
	}
	agent.mustFail(t, "create_order", orderArgs(key, "cust-ov-b", coffee, map[string]any{"notify_customer": false}), "key_reused_with_different_request")
	agent.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-ov-b", []item{{"tea-250g", 1, 900}}, map[string]any{"notify_customer": false}))
	dupKey := newKey()
	id := agent.mustHold(t, "create_order", orderArgs(dupKey, "cust-ov-a", coffee, map[string]any{"notify_customer": false})).Approval.ApprovalID

	loginWithToken(t, ctx, base, toks["boss"])
	do(t, ctx, "approve the suspected duplicate as a new order",
		chromedp.Navigate(base+"/ui/approvals/"+id),
		chromedp.WaitVisible(chromedp.CSS("#apr-"+id+" button.approve")),
		chromedp.SendKeys(chromedp.CSS("#comment-"+id), "the customer wants two"),
		chromedp.Click(chromedp.CSS("#apr-"+id+" button.approve")),
		chromedp.WaitVisible(chromedp.CSS("#outcome-status")),
	)
	if got := textOf(t, ctx, "#outcome-status"); got != "succeeded" {
		t.Fatalf("approving the duplicate: %q, want succeeded", got)
	}

	r := runCLI(t, 30*time.Second, "stats", "--db", db, "--tenant", aprTenant, "--json")
	if r.Code != 0 {
		t.Fatalf("idemgate stats: exit %d\n%s", r.Code, r.Stderr)
	}
	var want map[string]any
	if err := json.Unmarshal([]byte(r.Stdout), &want); err != nil {
		t.Fatalf("idemgate stats --json: %v\n%s", err, r.Stdout)
	}
	if want["replays_served"] != 1.0 || want["fingerprint_mismatches_refused"] != 1.0 || want["false_dedupes"] != 1.0 || want["duplicate_side_effects"] != 0.0 {
		t.Fatalf("idemgate stats = %v, want 1 replay, 1 mismatch, 1 approved duplicate, no duplicate side effect", want)
	}

	do(t, ctx, "open the overview", chromedp.Navigate(base+"/ui/overview"), chromedp.WaitVisible(chromedp.CSS("#chart-replays")))
	for css, field := range map[string]string{
		"#n-duplicates": "duplicate_side_effects", "#n-replays": "replays_served", "#n-mismatches": "fingerprint_mismatches_refused",
		"#n-suspected": "suspected_duplicates_held", "#n-false-dedupes": "false_dedupes", "#n-unknown": "unknown_outcomes",
		"#n-unsettled": "unknown_unsettled", "#n-late": "late_replays_after_retention", "#n-executions": "executions",
	} {
		if got, w := textOf(t, ctx, css), fmt.Sprint(want[field]); got != w {
			t.Errorf("%s = %s, want %s (idemgate stats %s)", css, got, w, field)
		}
	}
	if got, w := textOf(t, ctx, "#n-amplification"), fmt.Sprintf("%.2f", want["retry_amplification"]); got != w {
		t.Errorf("retry amplification = %s, want %s", got, w)
	}
	hour := time.Now().UTC().Truncate(time.Hour).Format("Jan 2 15:00")
	bars, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#chart-replays svg rect title")).map(e => e.textContent)`))
	if err != nil || len(bars) != 1 || bars[0] != hour+": 1 replays" {
		t.Errorf("the replays chart's bars = %q (%v), want one of 1 in %s", bars, err, hour)
	}
	label, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#chart-duplicates svg").getAttribute("aria-label")`))
	if err != nil || !strings.Contains(label, "Duplicate side effects") || !strings.Contains(label, "none in this window") {
		t.Errorf("the duplicates chart's label = %q (%v)", label, err)
	}
	// The console checked the chain by itself when the server started:
	// the status shows without a press (reloaded while that check runs).
	for deadline := time.Now().Add(10 * time.Second); ; {
		if st, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.getElementById("verify-status") || {}).textContent || ""`)); strings.HasPrefix(strings.TrimSpace(st), "Intact") && strings.Contains(st, "when the console started") {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the overview shows no verification of the chain from the console's start: %q", st)
		}
		time.Sleep(200 * time.Millisecond)
		do(t, ctx, "reload the overview", chromedp.Navigate(base+"/ui/overview"), chromedp.WaitVisible(chromedp.CSS("#audit-chain")))
	}
	do(t, ctx, "verify the audit chain",
		chromedp.Click(chromedp.CSS("#verify")),
		chromedp.WaitVisible(chromedp.CSS("p.notice[role=status]")),
	)
	if got := textOf(t, ctx, "#verify-status"); !strings.HasPrefix(got, "Intact") {
		t.Errorf("the audit chain's status = %q, want Intact", got)
	}
	screenshot(t, ctx, "overview")

	do(t, ctx, "phone width", chromedp.EmulateViewport(390, 844), chromedp.Navigate(base+"/ui/overview"), chromedp.WaitVisible(chromedp.CSS("#chart-late")))
	if w, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`)); err != nil || w > 390 {
		t.Errorf("at phone width the overview is %d px wide (%v), want no sideways scrolling", w, err)
	}
	screenshot(t, ctx, "overview-phone")
	do(t, ctx, "desktop width", chromedp.EmulateViewport(1100, 900))

	do(t, ctx, "operations of one customer",
		chromedp.Navigate(base+"/ui/operations"),
		chromedp.WaitVisible(chromedp.CSS("#customer")),
		chromedp.SendKeys(chromedp.CSS("#customer"), "cust-ov-a"),
		chromedp.Submit(chromedp.CSS("#customer")),
		// The unfiltered page has #ops too: wait for the filtered one, whose
		// field the server filled in (typing sets no attribute).
		chromedp.WaitVisible(chromedp.CSS(`#customer[value="cust-ov-a"]`)),
		chromedp.WaitVisible(chromedp.CSS("#ops")),
	)
	customers, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#ops td.customer")).map(e => e.textContent)`))
	if err != nil || len(customers) != 2 || customers[0] != "cust-ov-a" || customers[1] != "cust-ov-a" {
		t.Errorf("operations of cust-ov-a: customers %q (%v), want its two orders", customers, err)
	}
	if body := bodyText(t, ctx); strings.Contains(body, "cust-ov-b") {
		t.Errorf("the customer filter lists another customer's operation:\n%s", body)
	}
	screenshot(t, ctx, "operations-customer")
}

// TestConsoleNewApprovalAppears: an approver with the approvals list open
// and nothing pending sees a new request appear by itself — the page is
// not reloaded (a value the test leaves on the window survives), the count
// goes to 1 and a status line says a request arrived.
func TestConsoleNewApprovalAppears(t *testing.T) {
	ctx := newBrowser(t)
	dir := t.TempDir()
	tokens, toks := consoleTokens(t, dir)
	base := httpServer(t, filepath.Join(dir, "ledger.db"), tokens)
	agent := httpSession(t, base, toks["alice"])
	o := placeOrder(t, agent, "cust-live")

	loginWithToken(t, ctx, base, toks["boss"])
	do(t, ctx, "nothing pending", chromedp.WaitVisible(chromedp.CSS("#none-pending")))
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.stillThisPage = 42`)); err != nil {
		t.Fatal(err)
	}
	id := agent.mustHold(t, "cancel_order", cancelArgs(newKey(), o.OrderID, 1)).Approval.ApprovalID
	do(t, ctx, "the new request appears", chromedp.WaitVisible(chromedp.CSS("#apr-"+id+" button.approve")))
	if v, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.stillThisPage || 0`)); err != nil || v != 42 {
		t.Errorf("the page was reloaded to show the new request (marker %d, %v)", v, err)
	}
	if got := textOf(t, ctx, "#pending-count"); got != "1" {
		t.Errorf("pending count = %q, want 1", got)
	}
	if got := textOf(t, ctx, "#live"); got != "1 new request arrived." {
		t.Errorf("status line = %q", got)
	}
}

// TestOutboxRequeueCLIAudited: `idemgate outbox requeue` writes who
// requeued which message, and when, to the audit log — from the command
// line, beside a running server on the same ledger file — and a requeue
// refused (the message is no longer dead-lettered) writes nothing.
func TestOutboxRequeueCLIAudited(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Error(w, `{"error":"recipient blocked"}`, http.StatusBadRequest)
	}))
	defer gw.Close()
	agent := startServer(t, mcpGoModern, serverConfig{DB: db, Tenant: aprTenant, Principal: "alice", Args: []string{"--notify-webhook", gw.URL}})
	key := newKey()
	agent.mustSucceed(t, "send_notification", map[string]any{
		"operation_key": key, "channel": "email", "to": []string{"ops@example.com"}, "subject": "hello", "body": "your order shipped",
	})
	var msgID string
	if !eventually(20*time.Second, func() bool {
		var st struct {
			Deliveries []struct {
				MessageID string `json:"message_id"`
				State     string `json:"state"`
			} `json:"deliveries"`
		}
		e := agent.mustSucceed(t, "get_operation_status", map[string]any{"operation_key": key})
		if json.Unmarshal(e.Result, &st) != nil || len(st.Deliveries) != 1 || st.Deliveries[0].State != "dead" {
			return false
		}
		msgID = st.Deliveries[0].MessageID
		return true
	}) {
		t.Fatalf("the refused message was not dead-lettered within 20 s")
	}

	r := runCLI(t, 30*time.Second, "outbox", "requeue", msgID, "--db", db, "--principal", "ops-anna")
	if r.Code != 0 || !strings.Contains(r.Stdout, "requeued "+msgID) {
		t.Fatalf("outbox requeue: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	operatorEntries := func() []map[string]any {
		t.Helper()
		out := runCLI(t, 30*time.Second, "audit", "export", "--db", db)
		if out.Code != 0 {
			t.Fatalf("audit export: exit %d\n%s", out.Code, out.Stderr)
		}
		var found []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(out.Stdout), "\n") {
			var e map[string]any
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				t.Fatalf("audit export line %q: %v", line, err)
			}
			if e["event"] == "operator" {
				found = append(found, e)
			}
		}
		return found
	}
	entries := operatorEntries()
	if len(entries) != 1 {
		t.Fatalf("%d operator entries after one requeue, want 1: %v", len(entries), entries)
	}
	e := entries[0]
	actor, _ := e["actor"].(map[string]any)
	call, _ := e["downstream_call"].(map[string]any)
	ids, _ := call["message_ids"].([]any)
	if e["decision"] != "requeued" || e["key"] != key || actor["principal"] != "ops-anna" || actor["tenant"] != aprTenant ||
		len(ids) != 1 || ids[0] != msgID || e["at"] == "" {
		t.Errorf("the requeue's audit entry = %v, want requeued of %s (key %s) by ops-anna in %s", e, msgID, key, aprTenant)
	}
	if v := runCLI(t, 30*time.Second, "audit", "verify", "--db", db); v.Code != 0 {
		t.Errorf("audit verify after the requeue: exit %d\n%s%s", v.Code, v.Stdout, v.Stderr)
	}

	// A refused requeue (no such message; no --principal) writes nothing.
	if r := runCLI(t, 30*time.Second, "outbox", "requeue", "msg_doesnotexist", "--db", db); r.Code != 2 {
		t.Errorf("requeue of an unknown message: exit %d, want 2\n%s", r.Code, r.Stderr)
	}
	if r := runCLI(t, 30*time.Second, "outbox", "requeue", msgID, "--db", db, "--principal", " "); r.Code != 2 || !strings.Contains(r.Stderr, "--principal") {
		t.Errorf("requeue with a blank --principal: exit %d, want 2 naming --principal\n%s", r.Code, r.Stderr)
	}
	if n := len(operatorEntries()); n != 1 {
		t.Errorf("%d operator entries after refused requeues, want still 1", n)
	}
}

// pageWidth is how wide the page is laid out, in CSS pixels: more than
// the viewport means the page scrolls sideways.
func pageWidth(t *testing.T, ctx context.Context) int {
	t.Helper()
	w, err := chromedp.Run(ctx, chromedp.Evaluate[int](`Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)`))
	if err != nil {
		t.Fatalf("browser: page width: %v", err)
	}
	return w
}

// activeID is the id (or, without one, the tag and class) of the element
// that has the keyboard focus.
func activeID(t *testing.T, ctx context.Context) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(function(){var a=document.activeElement; if(!a) return ""; return a.id || (a.tagName.toLowerCase()+"."+a.className)})()`))
	if err != nil {
		t.Fatalf("browser: focused element: %v", err)
	}
	return s
}

// TestConsolePhoneAndKeyboard: at a phone's width (390 px) the approvals
// page with a held update_order — whose diff carries the items before and
// after, the longest values a card shows — the operations list and one
// operation's page (record, request, history) lay out without sideways
// scrolling. Then, at desktop width and with the keyboard alone, the
// approver moves with Tab to the request's comment, types it, moves on to
// Approve and presses Enter: the change is made once and the outcome
// shown. The history with the decided card, "Needs a person" and the
// Overview read at phone width as well.
func TestConsolePhoneAndKeyboard(t *testing.T) {
	ctx := newBrowser(t)
	dir := t.TempDir()
	tokens, toks := consoleTokens(t, dir)
	base := httpServer(t, filepath.Join(dir, "ledger.db"), tokens)
	agent := httpSession(t, base, toks["alice"])
	created := newKey()
	o := resultOrder(t, agent.mustSucceed(t, "create_order", orderArgs(created, "cust-phone-and-keyboard", coffee, map[string]any{"notify_customer": false})))
	key := newKey()
	id := agent.mustHold(t, "update_order", map[string]any{"operation_key": key, "order_id": o.OrderID, "expected_version": 1, "changes": map[string]any{
		"items": []map[string]any{{"sku": "coffee-1kg", "quantity": 3, "unit_price_minor": 1850}, {"sku": "tea-earl-grey-250g", "quantity": 2, "unit_price_minor": 900}},
		"note":  "leave the parcel with the neighbour at number 12 if nobody answers the door",
	}}).Approval.ApprovalID
	card := "#apr-" + id

	loginWithToken(t, ctx, base, toks["boss"])
	do(t, ctx, "see the change", chromedp.WaitVisible(chromedp.CSS(card+" table.diff")))
	if got := textOf(t, ctx, card+" .total"); got != "73.50 EUR" {
		t.Errorf("the update's total = %q, want 73.50 EUR", got)
	}
	screenshot(t, ctx, "update-order")

	do(t, ctx, "phone width", chromedp.EmulateViewport(390, 844))
	for _, p := range []struct{ name, path, ready string }{
		{"approvals", "/ui/approvals", card + " button.approve"},
		{"operations", "/ui/operations", "#ops"},
		{"operation", "/ui/operations/" + created, "#audit"},
	} {
		do(t, ctx, p.name+" at phone width", chromedp.Navigate(base+p.path), chromedp.WaitVisible(chromedp.CSS(p.ready)))
		if w := pageWidth(t, ctx); w > 390 {
			t.Errorf("at phone width %s is %d px wide, want no sideways scrolling (at most 390)", p.path, w)
		}
		screenshot(t, ctx, p.name+"-phone")
	}
	do(t, ctx, "desktop width", chromedp.EmulateViewport(1100, 900))

	// The keyboard alone: Tab from the top of the page to the comment.
	do(t, ctx, "open the approvals", chromedp.Navigate(base+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS(card+" button.approve")))
	reached := false
	for range 60 {
		do(t, ctx, "Tab", chromedp.KeyEvent(kb.Tab))
		if activeID(t, ctx) == "comment-"+id {
			reached = true
			break
		}
	}
	if !reached {
		t.Fatalf("Tab never reached the comment of the request (stopped at %q)", activeID(t, ctx))
	}
	do(t, ctx, "type the comment", chromedp.KeyEvent("checked with the customer by phone"))
	do(t, ctx, "Tab to Approve", chromedp.KeyEvent(kb.Tab))
	if got := activeID(t, ctx); got != "button.approve" {
		t.Fatalf("after the comment Tab is on %q, want the Approve button", got)
	}
	do(t, ctx, "Enter", chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.CSS("#outcome-status")))
	if got := textOf(t, ctx, "#outcome-status"); got != "succeeded" {
		t.Fatalf("outcome of the keyboard's approve = %q, want succeeded\n%s", got, bodyText(t, ctx))
	}
	if got := getOrder(t, agent, o.OrderID); got.Version != 2 || got.TotalMinor != 7350 {
		t.Errorf("order after the approve = %+v, want version 2 with total 7350 (changed once)", got)
	}
	do(t, ctx, "the history", chromedp.Navigate(base+"/ui/history"), chromedp.WaitVisible(chromedp.CSS(card)))
	if got := textOf(t, ctx, card+" .comment"); got != "checked with the customer by phone" {
		t.Errorf("the comment typed with the keyboard = %q", got)
	}
	// The decided card in the history, and the other sections, at phone width too.
	do(t, ctx, "phone width again", chromedp.EmulateViewport(390, 844))
	for _, p := range []struct{ path, ready string }{{"/ui/history", card}, {"/ui/attention", "#dead-count"}, {"/ui/overview", "#chart-late"}} {
		do(t, ctx, p.path+" at phone width", chromedp.Navigate(base+p.path), chromedp.WaitVisible(chromedp.CSS(p.ready)))
		if w := pageWidth(t, ctx); w > 390 {
			t.Errorf("at phone width %s is %d px wide, want no sideways scrolling (at most 390)", p.path, w)
		}
	}
}

// cutOff lists the elements of the page's main part that reach past the
// viewport's sides or scroll sideways inside (a <pre> or table cut off),
// with every disclosure opened first: "" when none does.
func cutOff(t *testing.T, ctx context.Context) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(function(){
		document.querySelectorAll("main details").forEach(function(d){ d.open = true; });
		var bad = [], w = document.documentElement.clientWidth;
		document.querySelectorAll("main *").forEach(function(e){
			var r = e.getBoundingClientRect();
			if (r.width === 0 && r.height === 0) return;
			var name = e.tagName.toLowerCase() + (e.className ? "." + e.className : "");
			if (r.right > w + 0.5 || r.left < -0.5) bad.push(name + " spans " + Math.round(r.left) + ".." + Math.round(r.right) + " px");
			if (e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== "visible") bad.push(name + " scrolls sideways (" + e.scrollWidth + " in " + e.clientWidth + " px)");
		});
		return bad.join("\n");
	})()`))
	if err != nil {
		t.Fatalf("browser: measure the page: %v", err)
	}
	return s
}

// TestConsoleApproverCard: the approver reads what changes in the order's
// own words. A held update_order that raises a line's quantity from 2 to
// 5 shows one row for it (TEA-001 quantity, 2, 5), the totals before and
// after in euros with the difference, the order's id and customer on the
// card's head with the agent's user and model (from its token); a held
// cancel_order shows the agent's reason and what it cancels. At a phone's
// width (390 px), with every disclosure open, nothing is cut off and the
// page does not scroll sideways. Approving the change shows the outcome
// in words.
func TestConsoleApproverCard(t *testing.T) {
	ctx := newBrowser(t)
	dir := t.TempDir()
	tokens, toks := consoleTokens(t, dir)
	r := runCLI(t, 10*time.Second, "tokens", "add", "--tokens", tokens, "--principal", "desk-agent", "--tenant", aprTenant, "--role", "agent",
		"--on-behalf-of", "maria.k@shop.example", "--model", "claude-sonnet-4")
	if r.Code != 0 {
		t.Fatalf("tokens add: exit %d: %s", r.Code, r.Stderr)
	}
	base := httpServer(t, filepath.Join(dir, "ledger.db"), tokens)
	agent := httpSession(t, base, strings.TrimSpace(r.Stdout))
	tea := []item{{"TEA-001", 2, 1250}}
	o := resultOrder(t, agent.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-42", tea, map[string]any{"notify_customer": false})))
	change := agent.mustHold(t, "update_order", map[string]any{"operation_key": newKey(), "order_id": o.OrderID, "expected_version": 1,
		"changes": map[string]any{"items": []map[string]any{{"sku": "TEA-001", "quantity": 5, "unit_price_minor": 1250}}}}).Approval.ApprovalID
	o2 := resultOrder(t, agent.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-43", coffee, map[string]any{"notify_customer": false})))
	cancel := agent.mustHold(t, "cancel_order", cancelArgs(newKey(), o2.OrderID, 1)).Approval.ApprovalID

	loginWithToken(t, ctx, base, toks["boss"])
	card := "#apr-" + change
	do(t, ctx, "see the change", chromedp.WaitVisible(chromedp.CSS(card+" table.diff")))
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("`+card+` table.diff tbody tr").length`)); err != nil || n != 1 {
		t.Errorf("the quantity change has %d rows (%v), want one", n, err)
	}
	for css, want := range map[string]string{
		card + " table.diff tbody tr td.path":   "TEA-001 quantity",
		card + " table.diff tbody tr td.before": "2",
		card + " table.diff tbody tr td.after":  "5",
		card + " .total-before":                 "25.00 EUR",
		card + " .total":                        "62.50 EUR",
		card + " .total-diff":                   "+37.50 EUR",
		card + " header .headline":              "Change order " + o.OrderID + " for customer cust-42",
		card + " header .order-id":              o.OrderID,
		card + " header .customer":              "cust-42",
		card + " header .requester":             "desk-agent",
		card + " header .on-behalf-of":          "maria.k@shop.example",
		card + " header .model":                 "claude-sonnet-4",
		"#apr-" + cancel + " header .headline":  "Cancel order " + o2.OrderID + " for customer cust-43",
		"#apr-" + cancel + " .agent-reason":     "customer asked",
		"#apr-" + cancel + " .total":            "37.00 EUR",
	} {
		if got := textOf(t, ctx, css); got != want {
			t.Errorf("%s = %q, want %q", css, got, want)
		}
	}
	if got := textOf(t, ctx, "#apr-"+cancel+" details.lines"); !strings.Contains(got, "coffee-1kg") || !strings.Contains(got, "18.50 EUR") {
		t.Errorf("the cancel does not show the lines it cancels:\n%s", got)
	}
	screenshotOf(t, ctx, card, "approval-card")

	do(t, ctx, "phone width", chromedp.EmulateViewport(390, 844), chromedp.Navigate(base+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS(card+" button.approve")))
	if bad := cutOff(t, ctx); bad != "" {
		t.Errorf("at phone width these are cut off:\n%s", bad)
	}
	if w := pageWidth(t, ctx); w > 390 {
		t.Errorf("at phone width the approvals are %d px wide, want no sideways scrolling (at most 390)", w)
	}
	do(t, ctx, "close the disclosures", chromedp.Navigate(base+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS(card+" button.approve")))
	screenshotOf(t, ctx, card, "approval-card-phone")

	do(t, ctx, "approve the change",
		chromedp.Click(chromedp.CSS(card+" button.approve")),
		chromedp.WaitVisible(chromedp.CSS("#outcome-summary")),
	)
	if h := textOf(t, ctx, "#outcome h1"); h != "Approved: the order was changed" {
		t.Errorf("heading %q", h)
	}
	if got, want := textOf(t, ctx, "#outcome-summary"), "Order "+o.OrderID+" changed for customer cust-42: 1 line, total 62.50 EUR (version 2)"; got != want {
		t.Errorf("outcome summary %q, want %q", got, want)
	}
	if bad := cutOff(t, ctx); bad != "" {
		t.Errorf("the outcome at phone width is cut off:\n%s", bad)
	}
	screenshot(t, ctx, "outcome-phone")
}
