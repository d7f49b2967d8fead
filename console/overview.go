package console

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"idemgate/ledger"
)

// The Overview page: the reliability numbers of `idemgate stats` for the
// session's tenant, as totals and as small charts over time, and the
// audit chain's verification status.
//
// Cost: the numbers come from one ledger.StatsCounter per tenant, kept
// by the console and updated on each view with the audit entries appended
// since the previous view — the first view reads the whole log once (as
// `idemgate stats` does), later ones only what is new. The chain is
// verified once when the console starts (VerifyAtStart, in the
// background, for at most startVerifyTimeout: pages never wait for it),
// and again when someone presses Verify, at most once a minute per
// console (a press within a minute of the last press shows that check),
// one check at a time; the last result is kept with the time it was made.

// overviewWindows are the chart windows a page may ask for.
var overviewWindows = map[string]struct {
	width time.Duration
	n     int
	label string
}{
	"48h": {time.Hour, 48, "the last 48 hours, by hour (UTC)"},
	"30d": {24 * time.Hour, 30, "the last 30 days, by day (UTC)"},
}

// verifyEvery is how often the chain may be verified again on request.
const verifyEvery = time.Minute

// startVerifyTimeout bounds the verification made when the console starts.
const startVerifyTimeout = time.Minute

// overviewState is the console's part of the Overview: the tenants'
// counters and the last verification of the audit chain.
type overviewState struct {
	mu       sync.Mutex // guards counters; held while one is updated
	counters map[string]*ledger.StatsCounter

	verifyMu sync.Mutex // held while the chain is verified: one check at a time

	resultMu sync.Mutex // guards the fields below (a page never waits for a check)
	checked  verifyResult
	running  time.Time // when the check under way started; zero: none
	pressed  time.Time // when the last check made on request started
}

// lastCheck is the last verification's result, and when the check under
// way (if any) started.
func (o *overviewState) lastCheck() (verifyResult, time.Time) {
	o.resultMu.Lock()
	defer o.resultMu.Unlock()
	return o.checked, o.running
}

// verifyResult is the outcome of one verification of the audit chain.
type verifyResult struct {
	At time.Time // zero: never checked by this console
	// By is who asked: a principal, or "" for the console's start; ByTenant
	// is the tenant of the session that asked. The chain is every tenant's,
	// so every tenant sees the result, but only By's own tenant sees By
	// (overviewPage clears it for the others and sets ByOtherTenant).
	By            string
	ByTenant      string
	ByOtherTenant bool
	Entries       int
	Took          time.Duration
	Err           string // the chain does not verify, or could not be read
	// Unfinished: the check ended before it reached the end of the log
	// (its time bound, or a shutdown); it proved nothing.
	Unfinished bool
}

// VerifyAtStart verifies the audit chain once, as Verify now does, so the
// Overview shows the chain's status without anyone asking; a page shown
// meanwhile says a check is under way. It gives up after
// startVerifyTimeout, or when ctx is done (the Overview then says the
// check did not finish), and returns when the check has ended. The caller
// runs it in a goroutine it owns and waits for before closing the store.
func (c *Console) VerifyAtStart(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, startVerifyTimeout)
	defer cancel()
	c.checkChain(ctx, "", "")
}

// checkChain verifies the whole audit chain (ledger.Store.VerifyAudit),
// one check at a time, and keeps its result; by is who asked ("": the
// console's start) and byTenant the tenant of its session.
func (c *Console) checkChain(ctx context.Context, by, byTenant string) verifyResult {
	o := &c.overview
	o.verifyMu.Lock()
	defer o.verifyMu.Unlock()
	o.resultMu.Lock()
	o.running = c.cfg.Now()
	o.resultMu.Unlock()
	start := time.Now()
	n, err := c.cfg.Store.VerifyAudit(ctx)
	res := verifyResult{At: c.cfg.Now(), By: by, ByTenant: byTenant, Entries: n, Took: time.Since(start).Round(100 * time.Microsecond)}
	switch {
	case err != nil && ctx.Err() != nil:
		res.Unfinished = true
		c.cfg.Logger.Warn("console: the audit chain's verification did not finish", "err", err, "took", res.Took, "by", by)
	case err != nil:
		res.Err = err.Error()
		c.cfg.Logger.Error("console: the audit chain does not verify", "err", err, "by", by)
	default:
		c.cfg.Logger.Info("console: audit chain verified", "entries", n, "took", res.Took, "by", by)
	}
	o.resultMu.Lock()
	o.checked, o.running = res, time.Time{}
	o.resultMu.Unlock()
	return res
}

// overviewPage is the data of the Overview page.
type overviewPage struct {
	page
	Stats   ledger.Stats
	Settled []settledRow
	Window  string
	Label   string
	Charts  []chart
	Verify  verifyResult
	// Verifying is when the check under way started (zero: none).
	Verifying time.Time
}

type settledRow struct {
	How   string // the ledger.Settlement
	Label string // How as a person reads it
	N     int
}

// settledLabels say how an unknown outcome was settled (ledger.Settlement).
var settledLabels = map[string]string{
	string(ledger.SettledReconciledFound):               "reconciled: the order system had done it",
	string(ledger.SettledReconciledAbsentRetry):         "reconciled: not done, sent again (the API takes same-key retries)",
	string(ledger.SettledReconciledAbsentNeedsApproval): "reconciled: not done, its re-run held for approval",
	string(ledger.SettledResolvedByHand):                "resolved by a person, with evidence",
}

// tenantStats brings the tenant's counter up to date and returns its
// numbers and series.
func (c *Console) tenantStats(r *http.Request, tenant string, until time.Time, width time.Duration, n int) (ledger.Stats, []ledger.StatsBucket, error) {
	o := &c.overview
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.counters == nil {
		o.counters = map[string]*ledger.StatsCounter{}
	}
	sc := o.counters[tenant]
	if sc == nil {
		sc = ledger.NewStatsCounter(tenant)
		o.counters[tenant] = sc
	}
	err := sc.Update(r.Context(), c.cfg.Store)
	return sc.Stats(), sc.Series(until, width, n), err
}

// overviewPage shows the tenant's numbers, charts and the chain's status.
func (c *Console) overviewPage(w http.ResponseWriter, r *http.Request, id Identity) {
	window := r.URL.Query().Get("window")
	win, ok := overviewWindows[window]
	if !ok {
		window, win = "48h", overviewWindows["48h"]
	}
	now := c.cfg.Now()
	st, series, err := c.tenantStats(r, id.Tenant, now, win.width, win.n)
	if err != nil {
		c.apiError(w, r, id, err)
		return
	}
	p := overviewPage{page: page{Title: "Overview", Who: &id, Nav: "overview"}, Stats: st, Window: window, Label: win.label}
	for how, n := range st.Settled {
		label := settledLabels[how]
		if label == "" {
			label = how
		}
		p.Settled = append(p.Settled, settledRow{how, label, n})
	}
	slices.SortFunc(p.Settled, func(a, b settledRow) int {
		if a.N != b.N {
			return b.N - a.N
		}
		return strings.Compare(a.How, b.How)
	})
	p.Charts = overviewCharts(series, win.width)
	p.Verify, p.Verifying = c.overview.lastCheck()
	if p.Verify.By != "" && p.Verify.ByTenant != id.Tenant {
		// Another tenant's approver asked: its principal is not this
		// tenant's to see.
		p.Verify.By, p.Verify.ByOtherTenant = "", true
	}
	switch r.URL.Query().Get("verified") {
	case "1":
		p.Notice = "The audit chain was verified."
	case "recent":
		p.Notice = "The audit chain was verified less than a minute ago: that check is shown."
	case "running":
		p.Notice = "A check of the audit chain is under way: reload this page for its result."
	}
	p.Now = now
	c.renderAny(w, http.StatusOK, "overview", p)
}

// verify checks the whole audit chain, unless it was checked on request
// less than verifyEvery ago, and shows the Overview.
func (c *Console) verify(w http.ResponseWriter, r *http.Request, id Identity) {
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	window := validWindow(r.PostFormValue("window"))
	o := &c.overview
	now := c.cfg.Now()
	o.resultMu.Lock()
	q := "1"
	switch {
	case !o.running.IsZero():
		q = "running" // its result is as fresh as a new one's
	case !o.pressed.IsZero() && now.Sub(o.pressed) < verifyEvery && !o.checked.Unfinished:
		q = "recent"
	default:
		o.pressed = now
	}
	o.resultMu.Unlock()
	if q == "1" {
		c.checkChain(r.Context(), id.Principal, id.Tenant)
	}
	http.Redirect(w, r, Prefix+"/overview?verified="+q+"&window="+window, http.StatusSeeOther)
}

func validWindow(w string) string {
	if _, ok := overviewWindows[w]; ok {
		return w
	}
	return "48h"
}

// chart is one small bar chart, drawn as SVG by the overview template in
// a viewBox of chartW × chartH.
type chart struct {
	ID, Title, Hint string
	// Series are the one or two series drawn, as bars side by side.
	Series []chartSeries
	Bars   []chartBar
	// Label is the chart's accessible description: what it shows, the
	// window's totals and the busiest bucket.
	Label      string
	Start, End string // the first and last bucket's labels
	Max        string // the top of the scale
	Alarm      bool   // a non-zero value is a fault (duplicate side effects)
}

type chartSeries struct {
	Name, Class string
	Total       string
}

type chartBar struct {
	X, Y, W, H float64
	Class      string
	Title      string
}

const (
	chartW = 480.0
	chartH = 100.0
)

// overviewCharts draws the series of the overview from the buckets.
func overviewCharts(b []ledger.StatsBucket, width time.Duration) []chart {
	count := func(f func(ledger.Stats) int) []float64 {
		out := make([]float64, len(b))
		for i := range b {
			out[i] = float64(f(b[i].Stats))
		}
		return out
	}
	settled := func(s ledger.Stats) int {
		n := 0
		for _, v := range s.Settled {
			n += v
		}
		return n
	}
	amp := make([]float64, len(b))
	for i := range b {
		amp[i] = b[i].RetryAmplification
	}
	type series struct {
		name, class string
		v           []float64
	}
	defs := []struct {
		id, title, hint string
		s               []series
		ratio, alarm    bool
	}{
		{"duplicates", "Duplicate side effects", "must be 0: an operation executed more than once", []series{{"duplicate executions", "bad", count(func(s ledger.Stats) int { return s.DuplicateSideEffects })}}, false, true},
		{"replays", "Replays served", "retries answered from the ledger, not executed again", []series{{"replays", "a", count(func(s ledger.Stats) int { return s.ReplaysServed })}}, false, false},
		{"mismatches", "Mismatches refused", "a key reused with other arguments", []series{{"refused", "a", count(func(s ledger.Stats) int { return s.MismatchesRefused })}}, false, false},
		{"suspected", "Suspected duplicates", "held for a person, and of those approved as new orders", []series{
			{"held", "a", count(func(s ledger.Stats) int { return s.SuspectedDuplicates })},
			{"approved", "b", count(func(s ledger.Stats) int { return s.FalseDedupes })}}, false, false},
		{"unknown", "Unknown outcomes", "the order system did not say; and settlements", []series{
			{"became unknown", "bad", count(func(s ledger.Stats) int { return s.Unknown })},
			{"settled", "b", count(settled)}}, false, false},
		{"amplification", "Retry amplification", "calls per operation (1.0: nobody retried)", []series{{"calls per operation", "a", amp}}, true, false},
		{"late", "Late replays", "calls after retention, answered key_expired", []series{{"late calls", "a", count(func(s ledger.Stats) int { return s.LateReplays })}}, false, false},
	}
	var out []chart
	for _, d := range defs {
		ch := chart{ID: d.id, Title: d.title, Hint: d.hint}
		top := 0.0
		for _, s := range d.s {
			for _, v := range s.v {
				top = max(top, v)
			}
		}
		scale := niceCeil(top)
		slot := chartW / float64(len(b))
		barW := (slot - 2) / float64(len(d.s))
		busiest, busiestAt := 0.0, -1
		var totals []string
		for si, s := range d.s {
			sum := 0.0
			for i, v := range s.v {
				sum += v
				if v > busiest {
					busiest, busiestAt = v, i
				}
				h := 0.0
				if scale > 0 {
					h = v / scale * (chartH - 2)
				}
				if v > 0 && h < 2 {
					h = 2 // a non-zero value is always visible
				}
				ch.Bars = append(ch.Bars, chartBar{
					X: round1(float64(i)*slot + 1 + float64(si)*barW), Y: round1(chartH - h), W: round1(max(barW, 1)), H: round1(h),
					Class: s.class, Title: fmt.Sprintf("%s: %s %s", bucketLabel(b[i].Start, width), num(v, d.ratio), s.name),
				})
			}
			total := num(sum, d.ratio)
			if d.ratio { // a ratio over the window is not a sum: calls over operations
				calls, opsN := 0, 0
				for i := range b {
					calls += b[i].Calls
					opsN += b[i].Operations
				}
				total = "—"
				if opsN > 0 {
					total = strconv.FormatFloat(float64(calls)/float64(opsN), 'f', 2, 64)
				}
			}
			ch.Series = append(ch.Series, chartSeries{Name: s.name, Class: s.class, Total: total})
			totals = append(totals, total+" "+s.name)
			if d.alarm && sum > 0 {
				ch.Alarm = true
			}
		}
		ch.Max = num(scale, d.ratio)
		if len(b) > 0 {
			ch.Start, ch.End = bucketLabel(b[0].Start, width), bucketLabel(b[len(b)-1].Start, width)
		}
		ch.Label = fmt.Sprintf("%s, %s to %s: %s", d.title, ch.Start, ch.End, joinComma(totals))
		if busiestAt >= 0 {
			ch.Label += fmt.Sprintf("; the most, %s, in %s", num(busiest, d.ratio), bucketLabel(b[busiestAt].Start, width))
		} else {
			ch.Label += "; none in this window"
		}
		out = append(out, ch)
	}
	return out
}

// niceCeil is the scale's top: 1, 2 or 5 times a power of ten, at least v
// (1 for an empty chart).
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := 1.0
	for p*10 < v {
		p *= 10
	}
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func round1(v float64) float64 { return float64(int(v*10+0.5)) / 10 }

// num shows a count as an integer, a ratio with two decimals.
func num(v float64, ratio bool) string {
	if ratio {
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

// bucketLabel names a bucket: its hour, or its day.
func bucketLabel(t time.Time, width time.Duration) string {
	if width >= 24*time.Hour {
		return t.UTC().Format("Jan 2")
	}
	return t.UTC().Format("Jan 2 15:00")
}

func joinComma(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ", "
		}
		out += v
	}
	return out
}
