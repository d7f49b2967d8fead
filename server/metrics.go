package server

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"idemgate/ledger"
	"idemgate/outbox"
	"idemgate/tools"
)

// Metrics are the numbers DESIGN §7 asks for, each on its own, for
// Prometheus. Ledger counters come from the audit entries this process
// writes (ledger.Options.Observe), so they count exactly what `idemgate
// stats` counts from the log; with several processes on one ledger,
// Prometheus sums their series. Duplicate side effects need the whole
// history of a key and are reported by `idemgate stats`, not here.
type Metrics struct {
	reg *prometheus.Registry

	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec

	ledgerCalls, operations, executions, replays, mismatches, invalid,
	suspected, lateReplays, unknown prometheus.Counter
	settled *prometheus.CounterVec

	sessions    prometheus.Gauge
	sessionsEnd *prometheus.CounterVec

	authFailures, authPausedReqs *prometheus.CounterVec
	oauthRefusals                *prometheus.CounterVec
	busy                         *prometheus.CounterVec
}

// NewMetrics registers the metrics (and the Go runtime's) in a registry
// of their own.
func NewMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "idemgate", Name: name, Help: help})
		reg.MustRegister(c)
		return c
	}
	m := &Metrics{
		reg: reg,
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "idemgate", Name: "tool_calls_total",
			Help: "Tool calls answered, by tool, resulting status and error code."}, []string{"tool", "status", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "idemgate", Name: "tool_call_duration_seconds",
			Help: "Time to answer a tool call.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}, []string{"tool"}),
		ledgerCalls: f("ledger_calls_total", "Calls with an operation key answered by the ledger (retry amplification = this / operations_total)."),
		operations:  f("operations_total", "Operations first seen (new operation keys claimed or held)."),
		executions:  f("executions_total", "Operations that reached succeeded."),
		replays:     f("replays_served_total", "Duplicates answered from a saved result."),
		mismatches:  f("fingerprint_mismatches_total", "Calls refused because the key belongs to a different request."),
		invalid:     f("invalid_arguments_total", "Calls refused before the ledger for invalid arguments."),
		suspected:   f("suspected_duplicates_total", "New keys held for approval because the same request ran moments ago."),
		lateReplays: f("late_replays_total", "Replays after retention, answered key_expired instead of running again."),
		unknown:     f("unknown_outcomes_total", "Operations whose outcome became unknown."),
		settled: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "idemgate", Name: "unknown_settled_total",
			Help: "Unknown outcomes settled, by how."}, []string{"how"}),
	}
	m.sessions = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "idemgate", Name: "http_sessions",
		Help: "Live Streamable HTTP sessions in the ledger (all processes sharing it), as this process last counted them."})
	m.sessionsEnd = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "idemgate", Name: "http_sessions_ended_total",
		Help: "Streamable HTTP sessions this process ended, by why: deleted (DELETE), expired (idle), evicted (over the per-token cap)."}, []string{"reason"})
	m.authFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "idemgate", Name: "auth_failures_total",
		Help: "Failed authentications, by kind: bearer (a wrong token on /mcp), console_login (a wrong token or login link at the console)."}, []string{"kind"})
	m.authPausedReqs = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "idemgate", Name: "auth_paused_total",
		Help: "Requests refused with 429 before their credential was checked, because their source failed to authenticate too often, by kind."}, []string{"kind"})
	m.oauthRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "idemgate", Name: "oauth_refusals_total",
		Help: "OAuth access tokens refused, by reason (docs/oauth.md): malformed, algorithm, unknown_issuer, bad_signature, wrong_audience, expired, not_yet_valid, inactive, insufficient_scope, tenant, claims, issuer_unreachable."}, []string{"reason"})
	for _, reason := range refusalReasons {
		m.oauthRefusals.WithLabelValues(reason)
	}
	m.busy = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "idemgate", Name: "http_busy_refused_total",
		Help: "HTTP requests answered 503 with Retry-After before they were read or served, by why: connections (the server was at its connection capacity), message_budget (large bodies being served already held the budget)."}, []string{"reason"})
	for _, reason := range []string{BusyConnections, BusyMessageBudget} {
		m.busy.WithLabelValues(reason)
	}
	for _, kind := range []string{AuthBearer, AuthConsoleLogin} {
		m.authFailures.WithLabelValues(kind)
		m.authPausedReqs.WithLabelValues(kind)
	}
	reg.MustRegister(m.calls, m.duration, m.settled, m.sessions, m.sessionsEnd, m.authFailures, m.authPausedReqs, m.oauthRefusals, m.busy)
	return m
}

// authFailed counts one failed authentication of kind.
func (m *Metrics) authFailed(kind string) {
	if m != nil {
		m.authFailures.WithLabelValues(kind).Inc()
	}
}

// oauthRefused counts one refused OAuth access token.
func (m *Metrics) oauthRefused(reason string) {
	if m != nil {
		m.oauthRefusals.WithLabelValues(reason).Inc()
	}
}

// authPaused counts one request of kind refused because its source is
// paused.
func (m *Metrics) authPaused(kind string) {
	if m != nil {
		m.authPausedReqs.WithLabelValues(kind).Inc()
	}
}

// Reasons of idemgate_http_busy_refused_total.
const (
	BusyConnections   = "connections"
	BusyMessageBudget = "message_budget"
)

// busyRefused counts one request refused with 503 for reason.
func (m *Metrics) busyRefused(reason string) {
	if m != nil {
		m.busy.WithLabelValues(reason).Inc()
	}
}

// sessionsNow sets the live session count.
func (m *Metrics) sessionsNow(n int) {
	if m != nil {
		m.sessions.Set(float64(n))
	}
}

// sessionsEnded counts n sessions ended for reason.
func (m *Metrics) sessionsEnded(reason string, n int) {
	if m != nil && n > 0 {
		m.sessionsEnd.WithLabelValues(reason).Add(float64(n))
	}
}

// watchSessionMemory publishes how many sessions this process holds in
// memory (f is read at each scrape).
func (m *Metrics) watchSessionMemory(f func() int) {
	if m == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "idemgate", Name: "http_sessions_in_memory",
		Help: "Streamable HTTP sessions this process holds in memory (initialized here and not yet ended)."},
		func() float64 { return float64(f()) }))
}

// WatchDatabase publishes what a PostgreSQL ledger's stats report (read
// at each scrape): its round trips to the database and the transactions
// the database refused for a conflict with a concurrent one (and which
// were run again). See postgres.DB.Stats.
func (m *Metrics) WatchDatabase(stats func() (roundTrips, conflicts int64)) {
	if m == nil || stats == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "idemgate", Name: "postgres_round_trips_total",
		Help: "Exchanges of this process with the PostgreSQL ledger (a statement, or statements sent together in one batch)."},
		func() float64 { rt, _ := stats(); return float64(rt) }))
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "idemgate", Name: "postgres_conflicts_total",
		Help: "Write transactions of this process that PostgreSQL refused for a conflict with a concurrent one (serialization failure or deadlock); each was run again."},
		func() float64 { _, c := stats(); return float64(c) }))
}

// WatchSegments publishes the state of the segments outbox of this
// process (read at each scrape): torn tails its sink cut off and kept
// aside, and whether a damaged line stops its deliveries. See
// outbox.SegmentSink.
func (m *Metrics) WatchSegments(s *outbox.SegmentSink) {
	if m == nil || s == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "idemgate", Name: "outbox_segment_torn_tails_total",
		Help: "Unterminated last lines of the newest outbox segment this process cut off and kept aside (<segment>.torn-*): a crash's torn write, or a line cut after its delivery was recorded (see the log and idemgate check)."},
		func() float64 { return float64(s.TornTails()) }))
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "idemgate", Name: "outbox_segment_damaged",
		Help: "1 while a damaged line in the outbox segments stops this process's deliveries (messages stay queued; see the log and idemgate check), else 0."},
		func() float64 {
			if s.Damaged() {
				return 1
			}
			return 0
		}))
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// observeCall counts one answered tool call.
func (m *Metrics) observeCall(tool string, resp *tools.Response, took time.Duration) {
	if m == nil {
		return
	}
	code := ""
	if resp.Error != nil {
		code = resp.Error.Code
	}
	m.calls.WithLabelValues(tool, string(resp.Status), code).Inc()
	m.duration.WithLabelValues(tool).Observe(took.Seconds())
}

// ObserveAudit counts one audit entry; it is ledger.Options.Observe.
func (m *Metrics) ObserveAudit(e ledger.AuditEntry) {
	switch e.Event {
	case ledger.EventCall:
		if e.Is(ledger.AuditRefused) {
			if e.ErrorCode == string(ledger.CodeInvalidArguments) {
				m.invalid.Inc()
			}
			return
		}
		if e.Key == "" {
			return
		}
		m.ledgerCalls.Inc()
		switch ledger.DecisionKind(e.Decision) {
		case ledger.DecisionReplay:
			m.replays.Inc()
		case ledger.DecisionMismatch:
			m.mismatches.Inc()
		case ledger.DecisionExpired:
			m.lateReplays.Inc()
		}
	case ledger.EventTransition:
		if e.StateBefore == "" {
			m.operations.Inc()
		}
		if e.StateBefore == "" || e.StateBefore == ledger.StateRetryable {
			m.ledgerCalls.Inc()
		}
		if e.Is(ledger.AuditSuspectedDuplicate) {
			m.suspected.Inc()
		}
		if e.StateAfter == ledger.StateSucceeded && e.StateBefore != ledger.StateSucceeded {
			m.executions.Inc()
		}
		if e.StateAfter == ledger.StateUnknown && e.StateBefore != ledger.StateUnknown {
			m.unknown.Inc()
		}
		if e.StateBefore == ledger.StateUnknown && e.StateAfter != ledger.StateUnknown {
			m.settled.WithLabelValues(string(e.SettledHow())).Inc()
		}
	}
}
