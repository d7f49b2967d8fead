package console

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
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
// verified only when someone presses Verify, at most once a minute per
// console (a press within a minute of the last check shows that check),
// one check at a time; its result is kept with the time it was made.

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

// overviewState is the console's part of the Overview: the tenants'
// counters and the last verification of the audit chain.
type overviewState struct {
	mu       sync.Mutex // guards counters; held while one is updated
	counters map[string]*ledger.StatsCounter

	verifyMu sync.Mutex // held while the chain is verified: one check at a time

	resultMu sync.Mutex // guards checked (a page never waits for a check)
	checked  verifyResult
}

// lastCheck is the last verification's result.
func (o *overviewState) lastCheck() verifyResult {
	o.resultMu.Lock()
	defer o.resultMu.Unlock()
	return o.checked
}

// verifyResult is the outcome of one verification of the audit chain.
type verifyResult struct {
	At      time.Time // zero: never checked by this console
	Entries int
	Took    time.Duration
	Err     string
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
}

type settledRow struct {
	How string
	N   int
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
		p.Settled = append(p.Settled, settledRow{how, n})
	}
	slices.SortFunc(p.Settled, func(a, b settledRow) int { return b.N - a.N })
	p.Charts = overviewCharts(series, win.width)
	p.Verify = c.overview.lastCheck()
	switch r.URL.Query().Get("verified") {
	case "1":
		p.Notice = "The audit chain was verified."
	case "recent":
		p.Notice = "The audit chain was verified less than a minute ago: that check is shown."
	}
	p.Now = now
	c.renderAny(w, http.StatusOK, "overview", p)
}

// verify checks the whole audit chain (ledger.Store.VerifyAudit), unless
// it was checked less than verifyEvery ago, and shows the Overview.
func (c *Console) verify(w http.ResponseWriter, r *http.Request, id Identity) {
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	window := validWindow(r.PostFormValue("window"))
	o := &c.overview
	o.verifyMu.Lock()
	last := o.lastCheck()
	recent := !last.At.IsZero() && c.cfg.Now().Sub(last.At) < verifyEvery
	if !recent {
		start := time.Now()
		n, err := c.cfg.Store.VerifyAudit(r.Context())
		res := verifyResult{At: c.cfg.Now(), Entries: n, Took: time.Since(start).Round(100 * time.Microsecond)}
		if err != nil {
			res.Err = err.Error()
			c.cfg.Logger.Error("console: the audit chain does not verify", "err", err, "principal", id.Principal, "tenant", id.Tenant)
		} else {
			c.cfg.Logger.Info("console: audit chain verified", "entries", n, "took", res.Took, "principal", id.Principal, "tenant", id.Tenant)
		}
		o.resultMu.Lock()
		o.checked = res
		o.resultMu.Unlock()
	}
	o.verifyMu.Unlock()
	q := "1"
	if recent {
		q = "recent"
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
