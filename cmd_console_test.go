package main

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"idemgate/console"
	"idemgate/ledger"
	"idemgate/server"
	"idemgate/tools"
	"idemgate/tools/toolstest"
)

// TestPrintLogin: idemgate console prints where to log in — the listener's
// address and the public URL — except that with an https public URL and a
// listener that is not loopback it prints only the public one: the
// session cookie is Secure then, a browser drops it over the listener's
// plain http, and the one code both links would carry would be spent by
// the local one. The printed one-time link logs in, once.
func TestPrintLogin(t *testing.T) {
	svc, store := toolstest.New(t, ledger.Options{}, tools.Options{})
	boss := &server.Identity{Principal: "boss", Tenant: "acme", Role: "approver"}
	urlRE := regexp.MustCompile(`(?mi)^\s+(https?://\S+)$`)
	for _, c := range []struct {
		name, listen, publicURL string
		link                    bool
		want                    []string // the addresses printed, in order
	}{
		{"loopback, no public URL", "127.0.0.1:8081", "", true, []string{"http://127.0.0.1:8081"}},
		{"loopback, https public URL", "127.0.0.1:8081", "https://gate.example.com", true, []string{"http://127.0.0.1:8081", "https://gate.example.com"}},
		{"[::1], https public URL", "[::1]:8081", "https://gate.example.com", true, []string{"http://[::1]:8081", "https://gate.example.com"}},
		{"LAN, http public URL", "10.0.0.5:8081", "http://gate.example.com:8081", true, []string{"http://10.0.0.5:8081", "http://gate.example.com:8081"}},
		{"LAN, https public URL", "10.0.0.5:8081", "https://gate.example.com", true, []string{"https://gate.example.com"}},
		{"every interface, https public URL", "0.0.0.0:8081", "https://gate.example.com/idemgate", true, []string{"https://gate.example.com/idemgate"}},
		{"LAN, https public URL, login page", "10.0.0.5:8081", "HTTPS://gate.example.com", false, []string{"HTTPS://gate.example.com"}},
		{"LAN, no public URL, login page", "10.0.0.5:8081", "", false, []string{"http://10.0.0.5:8081"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			con := console.New(console.Config{Service: svc, Store: store, PublicURL: c.publicURL})
			var link *server.Identity
			if c.link {
				link = boss
			}
			var out strings.Builder
			printLogin(&out, c.listen, c.publicURL, con, link)
			var bases, paths []string
			for _, m := range urlRE.FindAllStringSubmatch(out.String(), -1) {
				i := strings.Index(m[1], console.Prefix+"/login")
				if i < 0 {
					t.Fatalf("printed %q, not a login address:\n%s", m[1], out.String())
				}
				bases, paths = append(bases, m[1][:i]), append(paths, m[1][i:])
			}
			if strings.Join(bases, " ") != strings.Join(c.want, " ") {
				t.Errorf("printed %q, want %q:\n%s", bases, c.want, out.String())
			}
			if !c.link {
				return
			}
			// The link the person opens logs in; then it is spent.
			for i, want := range []int{http.StatusSeeOther, http.StatusUnauthorized} {
				req := httptest.NewRequest("GET", paths[0], nil)
				w := httptest.NewRecorder()
				con.ServeHTTP(w, req)
				loggedIn := false
				for _, ck := range w.Result().Cookies() {
					loggedIn = loggedIn || (ck.Name == console.CookieName && ck.Value != "")
				}
				if w.Code != want || loggedIn != (i == 0) {
					t.Errorf("opening the printed link, time %d: status %d, logged in %v; want %d, logged in only the first time (the code spent)", i+1, w.Code, loggedIn, want)
				}
			}
		})
	}
}
