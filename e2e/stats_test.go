package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStats: `idemgate stats` counts what happened, each number on its
// own: one executed operation replayed twice, one fingerprint mismatch,
// one invalid call, one suspected duplicate, and no duplicate side effect.
func TestStats(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	s := startServer(t, mcpGoModern, serverConfig{DB: db})
	key := newKey()
	args := orderArgs(key, "cust-stats", coffee, nil)
	s.mustSucceed(t, "create_order", args)
	s.mustSucceed(t, "create_order", args)
	s.mustSucceed(t, "create_order", args)
	s.mustFail(t, "create_order", orderArgs(key, "cust-stats", []item{{"tea", 1, 100}}, nil), "key_reused_with_different_request")
	s.mustFail(t, "create_order", orderArgs(newKey(), "cust-stats", coffee, map[string]any{"colour": "red"}), "invalid_arguments")
	s.mustFail(t, "create_order", orderArgs(newKey(), "cust-stats", coffee, nil), "approval_required")
	s.Close() // flushes buffered audit entries

	r := runCLI(t, 20*time.Second, "stats", "--db", db, "--json")
	if r.Code != 0 {
		t.Fatalf("idemgate stats exited %d: %s", r.Code, r.Stderr)
	}
	var st struct {
		Operations           int     `json:"operations"`
		Calls                int     `json:"calls"`
		RetryAmplification   float64 `json:"retry_amplification"`
		DuplicateSideEffects int     `json:"duplicate_side_effects"`
		ReplaysServed        int     `json:"replays_served"`
		Mismatches           int     `json:"fingerprint_mismatches_refused"`
		Invalid              int     `json:"invalid_arguments_refused"`
		Suspected            int     `json:"suspected_duplicates_held"`
		Unknown              int     `json:"unknown_outcomes"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("stats output: %v\n%s", err, r.Stdout)
	}
	if st.Operations != 2 || st.ReplaysServed != 2 || st.Mismatches != 1 || st.Invalid != 1 || st.Suspected != 1 || st.DuplicateSideEffects != 0 || st.Unknown != 0 {
		t.Errorf("stats = %+v, want 2 operations, 2 replays, 1 mismatch, 1 invalid, 1 suspected, 0 duplicates, 0 unknown", st)
	}
	// 5 calls with a valid key over 2 operations.
	if st.Calls != 5 || st.RetryAmplification != 2.5 {
		t.Errorf("calls %d, amplification %.2f; want 5 and 2.50", st.Calls, st.RetryAmplification)
	}
}

// TestAuditExportAndVerify: the exported audit log is the whole hash
// chain, oldest first, and verify agrees with it.
func TestAuditExportAndVerify(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	s := startServer(t, mcpGoModern, serverConfig{DB: db})
	args := orderArgs(newKey(), "cust-audit", coffee, nil)
	s.mustSucceed(t, "create_order", args)
	s.mustSucceed(t, "create_order", args)
	s.Close()
	v := runCLI(t, 20*time.Second, "audit", "verify", "--db", db)
	if v.Code != 0 || !strings.Contains(v.Stdout, "intact") {
		t.Fatalf("audit verify: exit %d %s%s", v.Code, v.Stdout, v.Stderr)
	}
	x := runCLI(t, 20*time.Second, "audit", "export", "--db", db)
	if x.Code != 0 {
		t.Fatalf("audit export: exit %d %s", x.Code, x.Stderr)
	}
	lines := strings.Split(strings.TrimSpace(x.Stdout), "\n")
	prev := ""
	for i, line := range lines {
		var e struct {
			Seq      uint64 `json:"seq"`
			PrevHash string `json:"prev_hash"`
			Hash     string `json:"hash"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		if e.Seq != uint64(i+1) || e.PrevHash != prev {
			t.Fatalf("line %d: seq %d prev %.8s, want seq %d prev %.8s", i+1, e.Seq, e.PrevHash, i+1, prev)
		}
		prev = e.Hash
	}
	if want := fmt.Sprintf("%d entries", len(lines)); !strings.Contains(v.Stdout, want) {
		t.Errorf("verify says %q, export has %d lines", v.Stdout, len(lines))
	}
	tail := runCLI(t, 20*time.Second, "audit", "export", "--db", db, "--after", fmt.Sprint(len(lines)-1))
	if got := strings.Count(strings.TrimSpace(tail.Stdout), "\n") + 1; got != 1 {
		t.Errorf("export --after %d gave %d lines, want 1", len(lines)-1, got)
	}
}
