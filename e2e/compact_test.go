package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCompactAndAuditPrune drives the real binary: while a server holds
// the ledger, audit prune archives the old audit entries and compaction is
// refused; once the server has stopped, compaction shrinks the file, and a
// new server on the compacted ledger serves the same orders while audit
// verify proves the archive and the kept log as one chain.
func TestCompactAndAuditPrune(t *testing.T) {
	if onPostgres() {
		t.Skip("a ledger file's command")
	}
	db := filepath.Join(t.TempDir(), "ledger.db")
	s := startServer(t, mcpGoModern, serverConfig{DB: db, Tenant: aprTenant, Principal: "alice"})
	var orders []aprOrder
	for i := range 5 {
		orders = append(orders, placeOrder(t, s, "customer-"+string(rune('a'+i))))
	}
	time.Sleep(1100 * time.Millisecond) // the cutoff below is in whole seconds
	archive := filepath.Join(t.TempDir(), "audit-archive.jsonl")
	r := runCLI(t, 30*time.Second, "audit", "prune", "--db", db, "--before", time.Now().UTC().Format(time.RFC3339), "--export", archive)
	if r.Code != 0 || !strings.Contains(r.Stdout, "pruned audit entries 1-") {
		t.Fatalf("audit prune while a server runs = exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}

	r = runCLI(t, 30*time.Second, "compact", "--db", db)
	pid, _ := ownerPID(db)
	if r.Code != 1 || !strings.Contains(r.Stderr, fmt.Sprintf("its owner, process %d", pid)) || !strings.Contains(r.Stderr, "compact needs the file: stop the owner") {
		t.Fatalf("compact while a server holds the ledger = exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if got := getOrder(t, s, orders[0].OrderID); got.OrderID != orders[0].OrderID {
		t.Fatalf("order after a refused compaction: %+v", got)
	}
	s.Close()
	stopOwner(t, db) // compact needs the file to itself

	r = runCLI(t, 60*time.Second, "compact", "--db", db)
	if r.Code != 0 || !strings.Contains(r.Stdout, "compacted "+db) || !strings.Contains(r.Stdout, "pre-compact-") {
		t.Fatalf("compact = exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	r = runCLI(t, 30*time.Second, "audit", "verify", "--db", db, "--archive", archive)
	if r.Code != 0 || !strings.Contains(r.Stdout, "audit chain intact") {
		t.Fatalf("audit verify after prune and compaction = exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	s2 := startServer(t, mcpGoModern, serverConfig{DB: db, Tenant: aprTenant, Principal: "alice"})
	for _, o := range orders {
		if got := getOrder(t, s2, o.OrderID); got.OrderID != o.OrderID || got.Version != 1 {
			t.Errorf("order %s on the compacted ledger: %+v", o.OrderID, got)
		}
	}
	placeOrder(t, s2, "customer-after")
}
