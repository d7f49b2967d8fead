package bolt

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
)

// TestCreatePages breaks a claim+complete commit's pages down by tree
// (PageMap) on a file of 300 records, and checks the breakdown against
// bbolt's own count: each commit's pages, attributed to trees, add up to
// TxStats.Write (the meta page included), and a map read incrementally is
// the map read from scratch. Run with -v for the breakdown.
func TestCreatePages(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	s := mustOpenPath(t, path, ledger.Options{})
	ap := &applier{}
	for range 300 {
		if _, err := s.Execute(ctx, newClaim("t1", "create_order", uuid.NewString()), ap.succeed(ledgertest.ResultOrder)); err != nil {
			t.Fatal(err)
		}
	}
	prev, err := ReadPageMap(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	sum := map[string]int64{}
	var total int64
	for i := range n {
		s0 := s.CommitStats()
		if _, err := s.Execute(ctx, newClaim("t1", "create_order", uuid.NewString()), ap.succeed(ledgertest.ResultOrder)); err != nil {
			t.Fatal(err)
		}
		s1 := s.CommitStats()
		m, err := ReadPageMap(path, prev)
		if err != nil {
			t.Fatal(err)
		}
		commits, trees := m.Written(prev)
		var pages int64
		for _, tw := range trees {
			pages += tw.Pages
			sum[tw.Owner] += tw.Pages
			if tw.Bytes < tw.Pages*4096 {
				t.Errorf("%s: %d bytes for %d pages", tw.Owner, tw.Bytes, tw.Pages)
			}
		}
		total += pages
		if commits != s1.Commits-s0.Commits || pages != s1.PageWrites-s0.PageWrites {
			t.Fatalf("create %d: %d commits, %d pages attributed (%+v); bbolt counted %d commits, %d pages",
				i, commits, pages, trees, s1.Commits-s0.Commits, s1.PageWrites-s0.PageWrites)
		}
		prev = m
	}
	for _, tree := range []string{"records", "by_time", "fp_index", "audit", "data/" + effectsCollection, "data", OwnerRoot, OwnerFreelist, OwnerMeta} {
		if sum[tree] < n {
			t.Errorf("%s: %d pages written by %d creates, want at least one each", tree, sum[tree], n)
		}
	}
	// The sweep finds records due for compaction by their first-seen
	// time: a create writes no retention entry.
	if sum["expiry"] != 0 {
		t.Errorf("expiry: %d pages written by %d creates, want none", sum["expiry"], n)
	}
	// The root bucket's headers (and the inline buckets: meta's clocks)
	// and the data bucket's fit a page each: a commit writes one of each,
	// never a split root's branch and leaves.
	for _, tree := range []string{OwnerRoot, "data", OwnerFreelist, OwnerMeta} {
		if sum[tree] != n {
			t.Errorf("%s: %d pages written by %d creates, want one each", tree, sum[tree], n)
		}
	}
	for _, tree := range slices.Sorted(maps.Keys(sum)) {
		t.Logf("%-20s %5.2f pages per create commit", tree, float64(sum[tree])/n)
	}
	t.Logf("%-20s %5.2f", "total", float64(total)/n)

	whole, err := ReadPageMap(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if whole.txid != prev.txid || !maps.EqualFunc(whole.pages, prev.pages, func(a, b pageInfo) bool {
		return a.owner == b.owner && a.span == b.span && len(a.children) == len(b.children)
	}) {
		t.Errorf("the map read incrementally (%d pages, tx %d) is not the map read whole (%d pages, tx %d)",
			len(prev.pages), prev.txid, len(whole.pages), whole.txid)
	}
	if c, trees := whole.Written(prev); c != 0 || len(trees) != 0 {
		t.Errorf("no commit between two maps: Written = %d, %+v", c, trees)
	}
}
