package bolt

import (
	"context"
	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
	"testing"
	"time"
)

// TestListPagesByPosition pages through 150 records (some sharing a
// first-seen instant) newest first while new records arrive between
// pages: each record that existed when paging began comes exactly once,
// in order, and no new one slips in behind the position.
func TestListPagesByPosition(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	o := ledgertest.Opts()
	o.Now = clock.Now
	s := mustOpen(t, o)
	ap := &applier{}
	created := map[string]bool{}
	for i := range 150 {
		d, err := s.Execute(ctx, newClaim("t1", "create_order", "fp"), ap.succeed(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		created[d.Record.Key] = true
		if _, err := s.Execute(ctx, newClaim("t2", "create_order", "fp"), ap.succeed(`{}`)); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 { // two of every three share an instant with the next
			clock.Advance(time.Millisecond)
		}
	}
	// The whole listing in one page, newest first (ties by key): what
	// paging must reproduce.
	all, err := s.List(ctx, ledger.Filter{Tenant: "t1", Limit: 1000})
	if err != nil || len(all) != 150 {
		t.Fatalf("List = %d records, %v", len(all), err)
	}
	var want []string
	for _, r := range all {
		if !created[r.Key] {
			t.Fatalf("unknown record %s", r.Key)
		}
		want = append(want, r.Key)
	}
	seen := map[string]bool{}
	var got []string
	f := ledger.Filter{Tenant: "t1", Limit: 8}
	for pages := 0; ; pages++ {
		recs, err := s.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if seen[r.Key] {
				t.Fatalf("page %d repeats %s", pages, r.Key)
			}
			seen[r.Key] = true
			got = append(got, r.Key)
		}
		if len(recs) < f.Limit {
			break
		}
		if _, err := s.Execute(ctx, newClaim("t1", "create_order", "fp"), ap.succeed(`{}`)); err != nil {
			t.Fatal(err)
		}
		f.After = ledger.ListPosition(recs[len(recs)-1])
	}
	if len(got) != len(want) {
		t.Fatalf("listed %d records, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("record %d is %s, want %s", i, got[i], want[i])
		}
	}
}

// TestPendingApprovalsPagesOldestFirst: the order is by request time over
// every pending approval of the tenant, not only over the first page's
// worth, and a page continues strictly after its position.
func TestPendingApprovalsPagesOldestFirst(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	o := ledgertest.Opts()
	o.Now = clock.Now
	s := mustOpen(t, o)
	var want []string
	for range 30 {
		c := newClaim("t1", "cancel_order", "fp")
		c.RequireApproval = true
		d, err := s.Execute(ctx, c, nil)
		if err != nil || d.Record.Approval == nil {
			t.Fatalf("held claim: %v %+v", err, d)
		}
		want = append(want, d.Record.Approval.ID)
		clock.Advance(time.Second)
	}
	var got []string
	after := ""
	for {
		recs, err := s.PendingApprovals(ctx, "t1", after, 7)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			got = append(got, r.Approval.ID)
		}
		if len(recs) < 7 {
			break
		}
		after = ledger.ApprovalPosition(recs[len(recs)-1])
	}
	if len(got) != len(want) {
		t.Fatalf("listed %d approvals, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("approval %d is %s, want %s (oldest first)", i, got[i], want[i])
		}
	}
}
