package server

import (
	"slices"
	"testing"
)

func TestOrigins(t *testing.T) {
	if got, want := DefaultOrigins("127.0.0.1:8080"), []string{"http://127.0.0.1:8080", "http://localhost:8080", "http://127.0.0.1:8080", "http://[::1]:8080"}; !slices.Equal(got, want) {
		t.Errorf("DefaultOrigins(127.0.0.1:8080) = %v, want %v", got, want)
	}
	if got, want := DefaultOrigins("mcp.internal:9000"), []string{"http://mcp.internal:9000"}; !slices.Equal(got, want) {
		t.Errorf("DefaultOrigins(mcp.internal:9000) = %v, want %v", got, want)
	}
	if got := DefaultOrigins(":8080"); !slices.Contains(got, "http://localhost:8080") {
		t.Errorf("DefaultOrigins(:8080) = %v, want the loopback names", got)
	}
	for _, bad := range []string{"*", "app.example.com", "https://app.example.com/path", "ftp://x", "https://u:p@x.example", "https://x.example?q=1"} {
		if _, err := ParseOrigins([]string{bad}); err == nil {
			t.Errorf("ParseOrigins(%q): no error", bad)
		}
	}
	o, err := ParseOrigins([]string{"https://App.Example.com", " http://127.0.0.1:8080 ", "http://[::1]:80"})
	if err != nil {
		t.Fatal(err)
	}
	for origin, want := range map[string]bool{
		"":                               true,
		"https://app.example.com":        true,
		"https://app.example.com:443":    true,
		"HTTPS://APP.EXAMPLE.COM":        true,
		"http://app.example.com":         false,
		"https://app.example.com.evil.x": false,
		"http://127.0.0.1:8080":          true,
		"http://127.0.0.1:8081":          false,
		"http://[::1]":                   true,
		"null":                           false,
		"http://evil.example":            false,
	} {
		if got := o.Allowed(origin); got != want {
			t.Errorf("Allowed(%q) = %v, want %v", origin, got, want)
		}
	}
}

// TestOriginOf: the origin of a URL is its scheme and host, lower-cased,
// without a default port or the path; what is not an absolute http(s) URL
// has none.
func TestOriginOf(t *testing.T) {
	for in, want := range map[string]string{
		"https://gate.example.com":            "https://gate.example.com",
		"https://Gate.Example.com:443/ui":     "https://gate.example.com",
		"https://example.com/idemgate":        "https://example.com",
		"http://gate.example.com:8081":        "http://gate.example.com:8081",
		"http://[::1]:8080/":                  "http://[::1]:8080",
		"HTTP://127.0.0.1:80/path?ignored=no": "http://127.0.0.1",
	} {
		if got, err := OriginOf(in); err != nil || got != want {
			t.Errorf("OriginOf(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "gate.example.com", "/ui", "ftp://gate.example.com", "https://"} {
		if got, err := OriginOf(bad); err == nil {
			t.Errorf("OriginOf(%q) = %q, want an error", bad, got)
		}
	}
}
