package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.json")
	alice := Identity{Principal: "alice", Tenant: "acme", Role: "agent"}
	token, err := AddToken(path, alice, "laptop")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if strings.Contains(string(b), token) {
		t.Fatal("the tokens file holds the token itself, not only its hash")
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("tokens file mode %v, want 0600", st.Mode().Perm())
	}
	tokens, err := LoadTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	if id, ok, err := tokens.Lookup(token); !ok || err != nil || id != alice {
		t.Errorf("Lookup(alice's token) = %+v, %v, %v", id, ok, err)
	}
	for _, bad := range []string{"", token + "x", strings.ToUpper(token), "igt_"} {
		if _, ok, _ := tokens.Lookup(bad); ok {
			t.Errorf("Lookup(%q) found an identity", bad)
		}
	}
	// A token added later is seen without reloading by hand.
	boss := Identity{Principal: "boss", Tenant: "acme", Role: "approver"}
	bossToken, err := AddToken(path, boss, "")
	if err != nil {
		t.Fatal(err)
	}
	if id, ok, _ := tokens.Lookup(bossToken); !ok || id != boss {
		t.Errorf("Lookup(a token added after loading) = %+v, %v", id, ok)
	}
	if _, err := AddToken(path, Identity{Principal: "x y", Tenant: "acme", Role: "agent"}, ""); err == nil {
		t.Error("AddToken accepted an invalid principal")
	}
	if _, err := AddToken(path, Identity{Principal: "x", Tenant: "acme", Role: "root"}, ""); err == nil {
		t.Error("AddToken accepted an unknown role")
	}
}

func TestLoadTokensRefusesBadFiles(t *testing.T) {
	for name, body := range map[string]string{
		"not JSON":      "{",
		"unknown field": `{"tokens":[{"sha256":"` + strings.Repeat("a", 64) + `","principal":"a","tenant":"t","role":"agent","admin":true}]}`,
		"short hash":    `{"tokens":[{"sha256":"abc","principal":"a","tenant":"t","role":"agent"}]}`,
		"bad role":      `{"tokens":[{"sha256":"` + strings.Repeat("a", 64) + `","principal":"a","tenant":"t","role":"god"}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tokens.json")
			os.WriteFile(path, []byte(body), 0o600)
			if _, err := LoadTokens(path); err == nil {
				t.Errorf("LoadTokens accepted %s", body)
			}
		})
	}
	if _, err := LoadTokens(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("LoadTokens accepted a missing file")
	}
}
