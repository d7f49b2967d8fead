package declared

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"idemgate/orders"
)

const schema = `{"type":"object","additionalProperties":false,"required":["account","amount","note"],"properties":{
	"account":{"type":"string","maxLength":40},"amount":{"type":"integer","minimum":1,"maximum":1000000},"note":{"type":"string","maxLength":100}}}`

func decl(url string) string {
	return `
[[tools]]
name = "move_money"
title = "Move money"
description = "Moves money."
input_schema = '''` + schema + `'''
id = "/id"
safe_retry = true
[tools.request]
method = "POST"
url = "` + url + `/accounts/{account}/transfers?note={note}"
headers = { Authorization = "Bearer {secret:tok}" }
body = { amount = "/amount" }
[tools.operation_key]
header = "Idempotency-Key"
[tools.lookup]
url = "` + url + `/transfers?key={operation_key}"
[tools.policy]
amount = "/amount"
approval_threshold_minor = 500
[tools.secrets]
tok = { env = "TOK" }
`
}

func env(m map[string]string) Environ {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func mustBuild(t *testing.T, text string) *Tool {
	t.Helper()
	ds, err := Parse([]byte(text), filepath.Join(t.TempDir(), "x.toml"))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := Build(ds, []string{"create_order"}, env(map[string]string{"TOK": "s3cr3t-token"}))
	if err != nil {
		t.Fatal(err)
	}
	return ts[0]
}

// TestSend: the request as declared — URL from the arguments, escaped;
// the key as its header; the body mapped; the secret in its header — and
// an answer that quotes the secret has it withheld.
func TestSend(t *testing.T) {
	var got *http.Request
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, body = r, must(io.ReadAll(r.Body))
		w.WriteHeader(201)
		io.WriteString(w, `{"id":"tr_1","echo":"s3cr3t-token"}`)
	}))
	defer srv.Close()
	tool := mustBuild(t, decl(srv.URL))
	args := json.RawMessage(`{"operation_key":"k","account":"a b/c","amount":700,"note":"x&y"}`)
	r, err := tool.Send(context.Background(), "acme", "k:1", args, "")
	if err != nil {
		t.Fatal(err)
	}
	if got.URL.EscapedPath() != "/accounts/a%20b%2Fc/transfers" || got.URL.Query().Get("note") != "x&y" {
		t.Errorf("URL %s", got.URL)
	}
	if got.Header.Get("Idempotency-Key") != "acme:k:1" || got.Header.Get("Authorization") != "Bearer s3cr3t-token" {
		t.Errorf("headers %v", got.Header)
	}
	if string(body) != `{"amount":700}` {
		t.Errorf("body %s", body)
	}
	if r.ID != "tr_1" || strings.Contains(string(r.Resource), "s3cr3t") {
		t.Errorf("result %+v", r)
	}
	f, err := tool.Facts(args)
	if err != nil || !f.HasAmount || f.Amount != 700 || f.ThresholdMinor != 500 {
		t.Errorf("facts %+v %v", f, err)
	}
}

// TestLookup: 404 is absent; a 2xx is the resource; a 503 cannot tell.
func TestLookup(t *testing.T) {
	status := 404
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		io.WriteString(w, `{"id":"tr_9"}`)
	}))
	defer srv.Close()
	tool := mustBuild(t, decl(srv.URL))
	args := json.RawMessage(`{"operation_key":"k","account":"a","amount":1}`)
	if _, err := tool.Lookup(context.Background(), "acme", "k", args); !errors.Is(err, orders.ErrAbsent) {
		t.Errorf("404: %v, want ErrAbsent", err)
	}
	status = 200
	if r, err := tool.Lookup(context.Background(), "acme", "k", args); err != nil || r.ID != "tr_9" {
		t.Errorf("200: %+v %v", r, err)
	}
	status = 503
	if _, err := tool.Lookup(context.Background(), "acme", "k", args); err == nil || errors.Is(err, orders.ErrAbsent) {
		t.Errorf("503: %v, want an error that is not absent", err)
	}
}

// TestBuildRefuses: each mistake is named with its tool and key.
func TestBuildRefuses(t *testing.T) {
	base := decl("http://api.example")
	for name, tc := range map[string]struct{ from, to, want string }{
		"host from argument": {`url = "http://api.example/accounts/{account}/transfers?note={note}"`, `url = "http://{account}/x"`, "request.url"},
		"secret in URL":      {`/transfers?key={operation_key}"`, `/transfers?key={secret:tok}"`, "a secret may not stand in a URL"},
		"unknown argument":   {`{account}/transfers`, `{acct}/transfers`, "{acct} is not an argument"},
		"optional in URL":    {`"amount","note"]`, `"amount"]`, "{note} must be a required argument"},
		"missing secret":     {`tok = { env = "TOK" }`, `tok = { env = "NOPE" }`, "NOPE is not set"},
		"two key passings":   {`header = "Idempotency-Key"`, `header = "Idempotency-Key"` + "\nnone = true", "exactly one of"},
		"GET is no effect":   {`method = "POST"`, `method = "GET"`, "request.method"},
		"builtin name":       {`name = "move_money"`, `name = "create_order"`, "built-in"},
		"open schema":        {`{"type":"object","additionalProperties":false,"required"`, `{"type":"object","required"`, "closed"},
		"bad status":         {`[tools.lookup]`, "[tools.outcome]\ndefinitive = [200]\n[tools.lookup]", "a 2xx is the answer"},
		"unknown key":        {`safe_retry = true`, `safe_retry = true` + "\nsafe_retyr = true", "unknown keys"},
	} {
		t.Run(name, func(t *testing.T) {
			text := strings.Replace(base, tc.from, tc.to, 1)
			if text == base {
				t.Fatalf("%q not in the declaration", tc.from)
			}
			ds, err := Parse([]byte(text), "x.toml")
			if err == nil {
				_, err = Build(ds, []string{"create_order"}, env(map[string]string{"TOK": "s3cr3t-token"}))
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestImport: the payments document of the e2e tests imports into a
// declaration that builds.
func TestImport(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "e2e", "testdata", "declared", "payments-openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	text, err := Import(doc, []string{"createRefund"}, "https://payments.example")
	if err != nil {
		t.Fatal(err)
	}
	ds, err := Parse([]byte(text), "imported.toml")
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	ts, err := Build(ds, nil, env(nil))
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	if ts[0].Name() != "create_refund" || !ts[0].SafeRetry() || ts[0].decl.OperationKey.Header != "Idempotency-Key" {
		t.Errorf("imported %+v", ts[0].decl)
	}
	if _, err := Import(doc, []string{"findRefund"}, "https://payments.example"); err == nil {
		t.Error("a GET was imported as a side effect")
	}
	if _, err := Import(doc, []string{"createRefund"}, "https://{x}.example"); err == nil {
		t.Error("a templated base URL was accepted")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// FuzzDeclaration: any text parsed and built either is refused with an
// error or makes a tool whose templates expand without panicking, and
// whose URL keeps the declared host whatever the arguments.
func FuzzDeclaration(f *testing.F) {
	f.Add(decl("http://api.example"), "a/b?c", int64(3))
	f.Add(`[[tools]]
name = "x"
[tools.request]
url = "http://h/{a}{b}"`, "", int64(0))
	f.Fuzz(func(t *testing.T, text, arg string, n int64) {
		ds, err := Parse([]byte(text), "fuzz.toml")
		if err != nil {
			return
		}
		ts, err := Build(ds, nil, env(map[string]string{"TOK": "tok-value"}))
		if err != nil {
			return
		}
		for _, tool := range ts {
			args := map[string]any{"account": arg, "note": arg, "amount": json.Number("1")}
			u, err := tool.url.expand(args, arg, nil, true)
			if err != nil {
				continue
			}
			if !strings.HasPrefix(u, tool.host+"/") {
				t.Fatalf("URL %q left the declared host %s", u, tool.host)
			}
		}
	})
}

// FuzzTemplate: parsing any template never panics, and a URL template
// accepted expands, for any argument, under its literal scheme and host.
func FuzzTemplate(f *testing.F) {
	f.Add("http://h.example/a/{x}?q={x}", "v/../@evil.example")
	f.Add("{x}", "")
	f.Fuzz(func(t *testing.T, tpl, arg string) {
		p, err := parseTemplate(tpl, true)
		if err != nil {
			return
		}
		u, err := p.expand(map[string]any{"x": arg}, arg, nil, true)
		if err != nil {
			return
		}
		lead := p.parts[0].literal
		if !strings.HasPrefix(u, lead) {
			t.Fatalf("%q does not start with the template's literal %q", u, lead)
		}
	})
}
