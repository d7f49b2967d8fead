// Package toolstest gives the tests of the packages that serve the tool
// service — the MCP server, the console, the command line — one on a
// ledger file of its own.
package toolstest

import (
	"path/filepath"
	"testing"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/schemas"
	"idemgate/tools"
)

// New returns a tool service with options opts on a new bbolt ledger,
// opened with lo, in a temporary directory of t, and that ledger; both
// are closed when t ends. An empty opts.OutboxDir is a temporary
// directory of t too.
func New(t testing.TB, lo ledger.Options, opts tools.Options) (*tools.Service, *bolt.File) {
	t.Helper()
	store, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), lo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	v, err := schemas.New()
	if err != nil {
		t.Fatal(err)
	}
	if opts.OutboxDir == "" {
		opts.OutboxDir = t.TempDir()
	}
	svc, err := tools.New(store, v, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	return svc, store
}
