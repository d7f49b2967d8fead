package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"idemgate/ledger"
	"idemgate/tools"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

func ops(args []string, stdout, stderr io.Writer) error {
	const use = "usage: idemgate ops list [--tenant T] [--state S] [--limit N] [--cursor C] [--json] | idemgate ops show KEY [--tenant T] [--limit N] [--json]"
	if err := groupHelp("ops", use, args, stderr); err != nil {
		return err
	}
	if len(args) == 0 || (args[0] != "list" && args[0] != "show") {
		return usageError{errors.New(use)}
	}
	sub := args[0]
	fs := flag.NewFlagSet("ops "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	want := []string{}
	if sub == "show" {
		want = []string{"KEY"}
		setUsage(fs, "ops show KEY [flags]", "Shows one operation's record and its whole history from the audit log.")
	} else {
		setUsage(fs, "ops list [flags]", "Lists recent operations, newest first, a page at a time.")
	}
	var lf settings
	lf.register(fs)
	tenant := fs.String("tenant", env("IDEMGATE_TENANT", "default"), "tenant (\"\" with list: every tenant)")
	state := fs.String("state", "", "list only this state")
	limit := fs.Int("limit", 50, "list: at most this many records; show: the newest this many history entries (1-10000; show's default 1000)")
	asJSON := fs.Bool("json", false, "print JSON")
	cursor := fs.String("cursor", "", "list: continue after the page that printed this next_cursor (same --tenant and --state)")
	pos, err := parseCommand(fs, args[1:], want...)
	if err != nil {
		return err
	}
	var key string
	if sub == "show" {
		key = pos[0]
	}
	if sub == "show" && !flagSet(fs, "limit") {
		*limit = 1000
	}
	if *limit < 1 || *limit > 10000 {
		return usageError{fmt.Errorf("--limit must be 1-10000, got %d", *limit)}
	}
	if err := lf.inOwner(fs, stdout, stderr, []string{"ops", sub}, pos...); err != nil {
		return err
	}
	store, err := lf.openReadOnly()
	if err != nil {
		return err
	}
	defer store.Close()
	ctx := context.Background()
	if sub == "show" {
		return opsShow(ctx, store, *tenant, key, *limit, *asJSON, stdout)
	}
	query := []string{"ops list", *tenant, *state}
	f := ledger.Filter{Tenant: *tenant, State: ledger.State(*state), Limit: *limit + 1}
	if *cursor != "" {
		pos, err := tools.DecodeCursor(*cursor, query)
		if err != nil {
			return usageError{fmt.Errorf("--cursor: %w", err)}
		}
		f.After = string(pos)
	}
	recs, err := store.List(ctx, f)
	if err != nil {
		return err
	}
	// More records follow: say how to list them, on stderr so the table
	// or the JSON array on stdout stays as it was.
	if len(recs) > *limit {
		recs = recs[:*limit]
		defer fmt.Fprintf(stderr, "next_cursor: %s  (more operations follow: pass --cursor %[1]s with the same --tenant and --state)\n",
			tools.EncodeCursor(query, []byte(ledger.ListPosition(recs[len(recs)-1]))))
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(recs)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "FIRST SEEN\tTENANT\tKEY\tTOOL\tSTATE\tATTEMPTS\tSUMMARY")
	for _, r := range recs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.FirstSeenAt.UTC().Format(time.RFC3339), r.Tenant, r.Key, r.Tool, r.State, r.Attempts, r.Summary)
	}
	return w.Flush()
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// opsHistory is `ops show --json`: the record (null when there is none any
// more, or never was) and its audit history, oldest first.
type opsHistory struct {
	Tenant string              `json:"tenant"`
	Key    string              `json:"operation_key"`
	Record *ledger.Record      `json:"record"`
	Total  int                 `json:"history_total"` // entries in all; History holds the newest --limit
	Hist   []ledger.AuditEntry `json:"history"`
}

// opsShow prints one operation: its record and every audit entry of its
// key — each call, replay and refusal with who, when and what was
// answered, and each state transition.
func opsShow(ctx context.Context, store ledger.Store, tenant, key string, limit int, asJSON bool, stdout io.Writer) error {
	rec, err := store.Get(ctx, tenant, key)
	if errors.Is(err, ledger.ErrNotFound) {
		rec, err = nil, nil
	}
	if err != nil {
		return err
	}
	hist, total, err := store.AuditForKey(ctx, tenant, key, limit)
	if err != nil {
		return err
	}
	if rec == nil && total == 0 {
		return fmt.Errorf("no operation %q in tenant %q, and no call with that key in the audit log", key, tenant)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(opsHistory{Tenant: tenant, Key: key, Record: rec, Total: total, Hist: hist})
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "operation\t%s\n", key)
	fmt.Fprintf(w, "tenant\t%s\n", tenant)
	if rec == nil {
		fmt.Fprintf(w, "record\tnone (never recorded, or deleted after its retention)\n")
	} else {
		fmt.Fprintf(w, "tool\t%s\n", rec.Tool)
		fmt.Fprintf(w, "state\t%s (attempts %d)%s\n", rec.State, rec.Attempts, map[bool]string{true: ", tombstone: result no longer kept"}[rec.Tombstone])
		fmt.Fprintf(w, "requested by\t%s\n", rec.Principal)
		fmt.Fprintf(w, "first seen\t%s\n", stamp(rec.FirstSeenAt))
		if !rec.CompletedAt.IsZero() {
			fmt.Fprintf(w, "completed\t%s\n", stamp(rec.CompletedAt))
		}
		if rec.Summary != "" {
			fmt.Fprintf(w, "summary\t%s\n", rec.Summary)
		}
		if rec.Error != nil {
			fmt.Fprintf(w, "error\t%s: %s\n", rec.Error.Code, oneLine(rec.Error.Message, 120))
		}
		if rec.Downstream != "" {
			fmt.Fprintf(w, "downstream\t%s\n", rec.Downstream)
		}
		if a := rec.Approval; a != nil {
			fmt.Fprintf(w, "approval\t%s %s (%s)%s\n", a.ID, a.Status, a.Rule, map[bool]string{true: " by " + a.DecidedBy}[a.DecidedBy != ""])
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nhistory: %d entries", total)
	if len(hist) < total {
		fmt.Fprintf(stdout, ", the newest %d shown (--limit)", len(hist))
	}
	fmt.Fprintln(stdout)
	w = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SEQ\tAT\tEVENT\tWHO\tMODEL\tSESSION\tREQUEST\tWHAT\tANSWER\tDETAIL")
	for _, e := range hist {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Seq, stamp(e.At), e.Event, who(e.Actor), model(e.Actor),
			orDash(tail(e.Actor.SessionID, 12)), orDash(oneLine(e.Actor.RequestID, 16)), what(e), answer(e), detail(e))
	}
	return w.Flush()
}

// tail is the last n runes of s, marked "…" when cut: session ids differ
// at their end, not at their common prefix.
func tail(s string, n int) string {
	s = oneLine(s, len(s)+1)
	if r := []rune(s); len(r) > n {
		return "…" + string(r[len(r)-n:])
	}
	return s
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine makes s fit a table cell: no tabs or newlines, at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// who is the principal and the user it acts for; what the client stated
// is marked as such.
func who(a ledger.Actor) string {
	s := a.Principal
	if a.OnBehalfOf != "" {
		s += " for " + oneLine(a.OnBehalfOf, 40)
	}
	if cs := a.ClientStated; cs != nil && cs.OnBehalfOf != "" {
		s += " (client says for " + oneLine(cs.OnBehalfOf, 40) + ")"
	}
	return orDash(s)
}

func model(a ledger.Actor) string {
	s := oneLine(a.Model, 40)
	if cs := a.ClientStated; cs != nil && cs.Model != "" {
		if s != "" {
			s += " "
		}
		s += "(client says " + oneLine(cs.Model, 40) + ")"
	}
	return orDash(s)
}

// what is what the entry records: the ledger's decision, the transition,
// or the answer's status. A call entry that carries its answer (a replay's
// one entry, where builds before wrote a call and an answer) shows the
// status it answered.
func what(e ledger.AuditEntry) string {
	var s string
	switch e.Event {
	case ledger.EventTransition:
		s = oneLine(string(e.Decision), 60) + ": " + orDash(string(e.StateBefore)) + " → " + string(e.StateAfter)
	case ledger.EventAnswer:
		s = string(e.StateAfter)
		if e.Replayed {
			s += " (replayed)"
		}
	default:
		s = string(e.Decision)
		if e.Event == ledger.EventCall && e.ResponseSHA256 != "" && e.StateAfter != "" {
			s += ": " + string(e.StateAfter)
		}
	}
	if e.ErrorCode != "" && e.Event != ledger.EventAnswer {
		s += " " + e.ErrorCode
	}
	return s
}

// answer is what the client was sent: error code, digest, duration.
func answer(e ledger.AuditEntry) string {
	if e.ResponseSHA256 == "" {
		return "-"
	}
	s := ""
	if e.Event == ledger.EventAnswer && e.ErrorCode != "" {
		s = e.ErrorCode + " "
	}
	s += "sha256:" + e.ResponseSHA256[:min(12, len(e.ResponseSHA256))]
	if e.DurationMS > 0 {
		s += fmt.Sprintf(" %.1fms", e.DurationMS)
	}
	return s
}

// detail is the policy check, the approval and the downstream call.
func detail(e ledger.AuditEntry) string {
	var parts []string
	if e.PolicyAction != "" {
		parts = append(parts, "policy "+e.PolicyAction+" ("+e.PolicyRule+")")
	}
	if e.ApprovalID != "" {
		a := "approval " + e.ApprovalID + " " + e.ApprovalStatus
		if e.Approver != "" {
			a += " by " + e.Approver
		}
		parts = append(parts, a)
	}
	if c := e.Call; c != nil {
		d := c.System
		if c.Method != "" {
			d += " " + c.Method + " " + c.Path
			if c.Status != 0 {
				d += fmt.Sprintf(" → %d", c.Status)
			}
		}
		if c.Failure != "" {
			d += " " + c.Failure
		}
		if c.OrderID != "" {
			d += fmt.Sprintf(" order %s v%d", c.OrderID, c.Version)
		}
		if len(c.MessageIDs) > 0 {
			d += " messages " + strings.Join(c.MessageIDs, ",")
		}
		d += fmt.Sprintf(" (attempt %d, %.1fms)", c.Attempt, c.DurationMS)
		parts = append(parts, d)
	}
	if e.Event == ledger.EventCall && e.Is(ledger.AuditRefused) && e.Detail != "" {
		parts = append(parts, oneLine(e.Detail, 80))
	}
	return orDash(strings.Join(parts, "; "))
}
