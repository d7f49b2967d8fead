package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestListOrdersPagesOverTheBinary: a customer with 150 orders is listed
// completely through the real server, a page at a time with next_cursor,
// while new orders are placed between pages; a garbled or foreign cursor
// is refused with invalid_arguments. Then `idemgate ops list` pages the
// same ledger's operations with --cursor.
func TestListOrdersPagesOverTheBinary(t *testing.T) {
	s := startServer(t, mcpGoModern, serverConfig{})
	var created []string // oldest first
	place := func(i int) string {
		e := s.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-150", []item{{fmt.Sprintf("sku-%d", i), 1, 100}}, nil))
		return e.orderID()
	}
	for i := range 150 {
		created = append(created, place(i))
	}
	type page struct {
		Orders []struct {
			OrderID string `json:"order_id"`
		} `json:"orders"`
		NextCursor *string `json:"next_cursor"`
	}
	var got []string
	var firstCursor string
	extra := 0
	args := map[string]any{"customer_id": "cust-150", "limit": 40}
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("paging does not end")
		}
		e := s.mustSucceed(t, "list_orders", args)
		var p page
		if err := json.Unmarshal(e.Result, &p); err != nil {
			t.Fatal(err)
		}
		for _, o := range p.Orders {
			got = append(got, o.OrderID)
		}
		if p.NextCursor == nil {
			break
		}
		if firstCursor == "" {
			firstCursor = *p.NextCursor
		}
		extra++
		place(1000 + pages) // newer than every page: must not shift the rest
		args["cursor"] = *p.NextCursor
	}
	if len(got) != 150 {
		t.Fatalf("listed %d orders over the pages, want 150", len(got))
	}
	for i, id := range got {
		if want := created[149-i]; id != want {
			t.Fatalf("order %d of the listing is %s, want %s (newest first, no repeat, no gap)", i, id, want)
		}
	}
	s.mustFail(t, "list_orders", map[string]any{"customer_id": "cust-150", "cursor": "garbled!"}, "invalid_arguments")
	e := s.mustFail(t, "list_orders", map[string]any{"customer_id": "someone-else", "cursor": firstCursor}, "invalid_arguments")
	if !strings.Contains(e.Error.Message, "another listing") {
		t.Fatalf("foreign cursor message: %s", e.Error.Message)
	}

	// ops list pages the operations: every create so far, once each.
	cursorLine := regexp.MustCompile(`next_cursor: (\S+)`)
	seen := map[string]bool{}
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("ops list paging does not end")
		}
		a := []string{"ops", "list", "--db", s.cfg.DB, "--limit", "70", "--json"}
		if cursor != "" {
			a = append(a, "--cursor", cursor)
		}
		var out, errb bytes.Buffer
		cmd := exec.Command(idemgate, a...)
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("ops list: %v: %s", err, errb.String())
		}
		var recs []struct {
			Key string `json:"key"`
		}
		if err := json.Unmarshal(out.Bytes(), &recs); err != nil {
			t.Fatalf("ops list --json: %v: %s", err, out.String())
		}
		for _, r := range recs {
			if seen[r.Key] {
				t.Fatalf("ops list repeats %s", r.Key)
			}
			seen[r.Key] = true
		}
		m := cursorLine.FindStringSubmatch(errb.String())
		if m == nil {
			break
		}
		cursor = m[1]
	}
	if len(seen) != 150+extra {
		t.Fatalf("ops list paged %d operations, want every create: %d", len(seen), 150+extra)
	}
	var errb bytes.Buffer
	cmd := exec.Command(idemgate, "ops", "list", "--db", s.cfg.DB, "--cursor", firstCursor)
	cmd.Stderr = &errb
	if err := cmd.Run(); err == nil || !strings.Contains(errb.String(), "another listing") {
		t.Fatalf("ops list with a list_orders cursor: %v: %s", err, errb.String())
	}
}
