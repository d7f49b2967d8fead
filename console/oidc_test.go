package console

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// fakeSignIn is a provider that signs in whoever it is told to, once the
// code, verifier and nonce are the ones its authorization request gave.
type fakeSignIn struct {
	who                     Identity
	state, nonce, challenge string
}

func (f *fakeSignIn) Name() string { return "sso.example.com" }

func (f *fakeSignIn) AuthCodeURL(_ context.Context, state, nonce, verifier string) (string, error) {
	f.state, f.nonce, f.challenge = state, nonce, verifier
	return "https://sso.example.com/authorize?state=" + url.QueryEscape(state), nil
}

func (f *fakeSignIn) Exchange(_ context.Context, code, verifier, nonce string) (Identity, error) {
	if code != "good-code" || verifier != f.challenge || nonce != f.nonce {
		return Identity{}, errors.New("the provider did not redeem the code")
	}
	return f.who, nil
}

// TestSignInFlow: the login page offers the provider; starting a sign-in
// sends the browser there with a state it keeps in a Lax cookie; the
// callback redeems the code with that browser's verifier and nonce and
// gives an approver a session; a callback without the cookie (another
// browser), with another state, or for a non-approver makes no session.
func TestSignInFlow(t *testing.T) {
	f := &fakeSignIn{who: Identity{Principal: "boss", Tenant: "acme", Role: RoleApprover}}
	tc := newTestConsoleWith(t, testOptions{signIn: f})
	if _, body := tc.get(t, "/ui/login", nil); !strings.Contains(body, `href="/ui/signin"`) || !strings.Contains(body, "Sign in with sso.example.com") {
		t.Fatalf("the login page offers no sign-in:\n%s", body)
	}
	start := func() *http.Cookie {
		t.Helper()
		resp := tc.do("GET", "/ui/signin", nil, nil)
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "https://sso.example.com/authorize?state=") {
			t.Fatalf("start: %d %s", resp.StatusCode, resp.Header.Get("Location"))
		}
		for _, c := range resp.Cookies() {
			if c.Name == signInCookie {
				if !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Path != "/ui/signin" {
					t.Errorf("sign-in cookie %+v: want HttpOnly, SameSite=Lax, Path=/ui/signin", c)
				}
				return c
			}
		}
		t.Fatal("no sign-in cookie")
		return nil
	}
	callback := func(state, code string, ck *http.Cookie) (int, string, *http.Cookie) {
		t.Helper()
		resp := tc.do("GET", "/ui/signin/callback?state="+url.QueryEscape(state)+"&code="+code, nil, ck)
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), sessionCookie(resp)
	}

	ck := start()
	if status, body, s := callback(f.state, "good-code", nil); status != 400 || s != nil || !strings.Contains(body, "not started in this browser") {
		t.Errorf("without the cookie: %d, session %v: %s", status, s, body)
	}
	if status, _, s := callback("another-state", "good-code", ck); status != 400 || s != nil {
		t.Errorf("another state: %d, session %v", status, s)
	}
	status, body, s := callback(f.state, "good-code", ck)
	if status != 200 || s == nil || !strings.Contains(body, `url=/ui/approvals`) || !strings.Contains(body, "signed in as boss") {
		t.Fatalf("sign-in: %d, session %v: %s", status, s, body)
	}
	if status, _ := tc.get(t, "/ui/approvals", s); status != 200 {
		t.Errorf("the signed-in session opens the approvals with %d", status)
	}

	ck = start()
	if status, body, s := callback(f.state, "bad-code", ck); status != 403 || s != nil || !strings.Contains(body, "did not redeem the code") {
		t.Errorf("a code the provider does not redeem: %d, session %v: %s", status, s, body)
	}
	f.who = Identity{Principal: "alice", Tenant: "acme", Role: "agent"}
	ck = start()
	if status, body, s := callback(f.state, "good-code", ck); status != 403 || s != nil || !strings.Contains(body, "without the approver") {
		t.Errorf("an agent: %d, session %v: %s", status, s, body)
	}
}
