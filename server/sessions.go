package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"

	"idemgate/ledger"
)

// Ledger collections of the HTTP sessions.
const (
	sessionsCollection = "http_sessions"          // id → sessionRecord (JSON)
	sessionsByToken    = "http_sessions_by_token" // token hash + "/" + id → ""
	sessionsMeta       = "http_sessions_meta"     // "count" → live sessions, decimal
)

// Session defaults.
const (
	DefaultSessionIdleTimeout  = 30 * time.Minute
	DefaultMaxSessionsPerToken = 64
)

// touchFraction: a session's last-seen time is written only when it is
// older than IdleTimeout/touchFraction, so a busy session costs one ledger
// write per tenth of the timeout, not one per request. A session therefore
// ends between 0.9 and 1 × IdleTimeout after its last request.
const touchFraction = 10

// sessionRecord is one Streamable HTTP session (protocol eras before
// 2026-07-28, which have sessions) as the ledger keeps it, so that every
// server process sharing the ledger knows it.
type sessionRecord struct {
	ID        string `json:"id"`
	TokenHash string `json:"token_sha256"` // the token that created it; no other may use it
	Principal string `json:"principal"`
	Tenant    string `json:"tenant"`
	// ClientName and ClientVersion are the clientInfo of the session's
	// initialize: self-reported, for the audit, never identity.
	ClientName    string    `json:"client_name,omitempty"`
	ClientVersion string    `json:"client_version,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
	LastSeen      time.Time `json:"last_seen"`
}

// Sessions keeps Streamable HTTP sessions in the ledger, so that several
// server processes sharing one ledger file serve any session without
// affinity: a session created by one process is known to all, and one
// ended (DELETE, idle expiry, eviction) on one is ended on all.
//
// Sessions are bound to the bearer token that created them; a request with
// another token is answered as if the session did not exist (404). Each
// token holds at most MaxPerToken sessions: a new one evicts the token's
// least recently used session (whose next request gets 404, and its client
// starts a new session, as the specification requires). Sessions idle for
// longer than IdleTimeout end. Safe for concurrent use.
type Sessions struct {
	store       ledger.Store
	idle        time.Duration
	maxPerToken int
	logger      *slog.Logger
	metrics     *Metrics
	now         func() time.Time

	// free releases the transport's in-memory state of a session that
	// this process initialized (set by NewHTTPHandler).
	free func(id string)

	mu      sync.Mutex
	local   map[string]bool // sessions initialized by this process, until they end
	watched map[string]int  // sessions with an event stream open here → streams
}

// SessionConfig configures Sessions; zero fields take the defaults.
type SessionConfig struct {
	IdleTimeout time.Duration // DefaultSessionIdleTimeout
	MaxPerToken int           // DefaultMaxSessionsPerToken
	Now         func() time.Time
}

// NewSessions returns the session registry over store. metrics may be nil.
func NewSessions(store ledger.Store, cfg SessionConfig, logger *slog.Logger, metrics *Metrics) *Sessions {
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultSessionIdleTimeout
	}
	if cfg.MaxPerToken <= 0 {
		cfg.MaxPerToken = DefaultMaxSessionsPerToken
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Sessions{store: store, idle: cfg.IdleTimeout, maxPerToken: cfg.MaxPerToken, logger: logger,
		metrics: metrics, now: cfg.Now, local: map[string]bool{}, watched: map[string]int{}, free: func(string) {}}
}

// errNoSession is returned when a session id is unknown, ended, expired or
// belongs to another token.
var errNoSession = errors.New("session not found")

func newSessionID() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "igs_" + base64.RawURLEncoding.EncodeToString(b)
}

// validSessionID bounds what is looked up: ids we mint are "igs_" and 32
// URL-safe characters.
func validSessionID(id string) bool {
	if !strings.HasPrefix(id, "igs_") || len(id) != 36 {
		return false
	}
	for _, c := range id[4:] {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Create starts a session for the token and returns it. When the token
// already holds MaxPerToken sessions, its least recently used one ends
// (evicted) in the same transaction.
func (s *Sessions) Create(ctx context.Context, tokenHash string, id Identity, clientName, clientVersion string) (*sessionRecord, error) {
	return s.createWithID(ctx, newSessionID(), tokenHash, id, clientName, clientVersion)
}

// createWithID is Create for a session id chosen beforehand (the gate
// picks it before mcp-go answers initialize, and records the session
// only once that answer is a success).
func (s *Sessions) createWithID(ctx context.Context, sid, tokenHash string, id Identity, clientName, clientVersion string) (*sessionRecord, error) {
	now := s.now().UTC()
	rec := &sessionRecord{ID: sid, TokenHash: tokenHash, Principal: id.Principal, Tenant: id.Tenant,
		ClientName: clip(clientName), ClientVersion: clip(clientVersion), CreatedAt: now, LastSeen: now}
	val, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	var evicted []string
	var count int
	err = s.store.Update(ctx, func(tx ledger.Tx) error {
		evicted = evicted[:0] // the function may run again after a failed batch
		var mine []*sessionRecord
		if err := tx.Scan(sessionsByToken, tokenHash+"/", false, func(k string, _ []byte) (bool, error) {
			r, err := getSession(tx, k[len(tokenHash)+1:])
			if err != nil {
				return false, err
			}
			if r != nil {
				mine = append(mine, r)
			}
			return true, nil
		}); err != nil {
			return err
		}
		c, err := sessionCount(tx)
		if err != nil {
			return err
		}
		// Expired sessions of the token go first, then the least recently
		// used until there is room for the new one.
		for len(mine) > 0 {
			oldest := 0
			for i, r := range mine {
				if r.LastSeen.Before(mine[oldest].LastSeen) {
					oldest = i
				}
			}
			if len(mine) < s.maxPerToken && !s.expired(mine[oldest], now) {
				break
			}
			if err := deleteSession(tx, mine[oldest]); err != nil {
				return err
			}
			evicted = append(evicted, mine[oldest].ID)
			mine = append(mine[:oldest], mine[oldest+1:]...)
			c--
		}
		if err := tx.Put(sessionsCollection, rec.ID, val); err != nil {
			return err
		}
		if err := tx.Put(sessionsByToken, tokenHash+"/"+rec.ID, []byte{}); err != nil {
			return err
		}
		count = c + 1
		return tx.Put(sessionsMeta, "count", []byte(strconv.Itoa(count)))
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.local[rec.ID] = true
	s.mu.Unlock()
	for _, e := range evicted {
		s.logger.Info("http session evicted: its token opened more than the allowed sessions", "session", e, "principal", id.Principal, "max_sessions_per_token", s.maxPerToken)
		s.forget(e)
	}
	s.metrics.sessionsNow(count)
	s.metrics.sessionsEnded("evicted", len(evicted))
	return rec, nil
}

// Lookup returns the live session id of the token, or errNoSession. It
// refreshes the session's last-seen time when that is older than a tenth
// of the idle timeout.
//
// Each request of a session costs one ledger read (and one write per
// tenth of the idle timeout). Nothing a replica verified is cached: a
// session ended on any replica (DELETE, eviction, expiry) is refused by
// every replica from its next request on (TestHTTPSessionsAcrossProcesses),
// which a cache would only promise after its lifetime. Clients of the
// 2026-07-28 era have no sessions and never get here.
func (s *Sessions) Lookup(ctx context.Context, tokenHash, id string) (*sessionRecord, error) {
	if !validSessionID(id) {
		return nil, errNoSession
	}
	var rec *sessionRecord
	err := s.store.View(ctx, func(tx ledger.Tx) error {
		var err error
		rec, err = getSession(tx, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	now := s.now().UTC()
	if rec == nil || rec.TokenHash != tokenHash || s.expired(rec, now) {
		if rec != nil && rec.TokenHash != tokenHash {
			s.logger.Warn("http session used with another token than the one that created it", "session", id)
		}
		return nil, errNoSession
	}
	if now.Sub(rec.LastSeen) > s.idle/touchFraction {
		err := s.store.Update(ctx, func(tx ledger.Tx) error {
			cur, err := getSession(tx, id)
			if err != nil || cur == nil {
				return err
			}
			cur.LastSeen = now
			b, err := json.Marshal(cur)
			if err != nil {
				return err
			}
			return tx.Put(sessionsCollection, id, b)
		})
		if err != nil {
			return nil, err
		}
		rec.LastSeen = now
	}
	return rec, nil
}

// End ends a session of the token (DELETE). It returns errNoSession when
// the token has no such session.
func (s *Sessions) End(ctx context.Context, tokenHash, id string) error {
	if !validSessionID(id) {
		return errNoSession
	}
	var count int
	found := false
	err := s.store.Update(ctx, func(tx ledger.Tx) error {
		found = false
		rec, err := getSession(tx, id)
		if err != nil || rec == nil || rec.TokenHash != tokenHash {
			return err
		}
		found = true
		if err := deleteSession(tx, rec); err != nil {
			return err
		}
		c, err := sessionCount(tx)
		if err != nil {
			return err
		}
		count = max(c-1, 0)
		return tx.Put(sessionsMeta, "count", []byte(strconv.Itoa(count)))
	})
	if err != nil {
		return err
	}
	if !found {
		return errNoSession
	}
	s.metrics.sessionsNow(count)
	s.metrics.sessionsEnded("deleted", 1)
	return nil
}

// sweepChunkSessions bounds the work of one sweep transaction.
const sweepChunkSessions = 1000

// Sweep keeps alive the sessions with an event stream open here, deletes
// expired sessions from the ledger, releases this process's memory of
// every session that ended anywhere, and returns how many it deleted.
func (s *Sessions) Sweep(ctx context.Context) (int, error) {
	if err := s.touchStreaming(ctx); err != nil {
		return 0, err
	}
	total := 0
	for {
		// Find the expired ones in a read transaction, so that a sweep
		// with nothing to do writes nothing.
		var doomed []string
		var live int
		now := s.now().UTC()
		err := s.store.View(ctx, func(tx ledger.Tx) error {
			doomed = doomed[:0]
			var err error
			if live, err = sessionCount(tx); err != nil {
				return err
			}
			return tx.Scan(sessionsCollection, "", false, func(id string, v []byte) (bool, error) {
				var r sessionRecord
				if err := json.Unmarshal(v, &r); err != nil {
					return false, err
				}
				if s.expired(&r, now) {
					doomed = append(doomed, id)
				}
				return len(doomed) < sweepChunkSessions, nil
			})
		})
		if err != nil {
			return total, err
		}
		if len(doomed) == 0 {
			s.metrics.sessionsNow(live)
			break
		}
		n, count := 0, 0
		err = s.store.Update(ctx, func(tx ledger.Tx) error {
			n = 0
			for _, id := range doomed {
				r, err := getSession(tx, id)
				if err != nil {
					return err
				}
				if r == nil || !s.expired(r, now) { // ended or used meanwhile
					continue
				}
				if err := deleteSession(tx, r); err != nil {
					return err
				}
				n++
			}
			c, err := sessionCount(tx)
			if err != nil {
				return err
			}
			count = max(c-n, 0)
			return tx.Put(sessionsMeta, "count", []byte(strconv.Itoa(count)))
		})
		if err != nil {
			return total, err
		}
		total += n
		s.metrics.sessionsNow(count)
		s.metrics.sessionsEnded("expired", n)
		for _, id := range doomed {
			s.forget(id)
		}
		if len(doomed) < sweepChunkSessions {
			break
		}
	}
	// Release what this process holds for sessions that ended elsewhere.
	s.mu.Lock()
	ids := make([]string, 0, len(s.local)+len(s.watched))
	for id := range s.local {
		ids = append(ids, id)
	}
	for id := range s.watched {
		if !s.local[id] {
			ids = append(ids, id)
		}
	}
	s.mu.Unlock()
	var gone []string
	err := s.store.View(ctx, func(tx ledger.Tx) error {
		gone = gone[:0]
		for _, id := range ids {
			v, err := tx.Get(sessionsCollection, id)
			if err != nil {
				return err
			}
			if v == nil {
				gone = append(gone, id)
			}
		}
		return nil
	})
	if err != nil {
		return total, err
	}
	for _, id := range gone {
		s.forget(id)
	}
	return total, nil
}

// touchStreaming keeps alive the sessions with an event stream open
// here: a client listening on its stream is using its session.
func (s *Sessions) touchStreaming(ctx context.Context) error {
	s.mu.Lock()
	ids := make([]string, 0, len(s.watched))
	for id := range s.watched {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	now := s.now().UTC()
	return s.store.Update(ctx, func(tx ledger.Tx) error {
		for _, id := range ids {
			r, err := getSession(tx, id)
			if err != nil {
				return err
			}
			if r == nil || s.expired(r, now) || now.Sub(r.LastSeen) <= s.idle/touchFraction {
				continue
			}
			r.LastSeen = now
			b, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if err := tx.Put(sessionsCollection, id, b); err != nil {
				return err
			}
		}
		return nil
	})
}

// Run sweeps at once and then every quarter of the idle timeout (at least every minute)
// until ctx is done.
func (s *Sessions) Run(ctx context.Context) {
	t := time.NewTicker(min(max(s.idle/4, 100*time.Millisecond), time.Minute))
	defer t.Stop()
	for {
		if n, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.logger.Warn("http session sweep", "err", err)
		} else if n > 0 {
			s.logger.Info("http session sweep", "expired", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Local returns how many sessions this process holds in memory.
func (s *Sessions) Local() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.local)
}

// forget releases this process's memory of a session, and ends its
// event streams here.
func (s *Sessions) forget(id string) {
	s.mu.Lock()
	was := s.local[id] || s.watched[id] > 0
	delete(s.local, id)
	s.mu.Unlock()
	if was {
		s.free(id)
	}
}

// watch records that an event stream of session id is open here, so that
// the sweep ends it when the session ends elsewhere; unwatch undoes it.
func (s *Sessions) watch(id string) {
	s.mu.Lock()
	s.watched[id]++
	s.mu.Unlock()
}

func (s *Sessions) unwatch(id string) {
	s.mu.Lock()
	if s.watched[id]--; s.watched[id] <= 0 {
		delete(s.watched, id)
	}
	s.mu.Unlock()
}

func (s *Sessions) expired(r *sessionRecord, now time.Time) bool {
	return now.Sub(r.LastSeen) > s.idle
}

func getSession(tx ledger.Tx, id string) (*sessionRecord, error) {
	v, err := tx.Get(sessionsCollection, id)
	if err != nil || v == nil {
		return nil, err
	}
	var r sessionRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

func deleteSession(tx ledger.Tx, r *sessionRecord) error {
	if err := tx.Delete(sessionsCollection, r.ID); err != nil {
		return err
	}
	return tx.Delete(sessionsByToken, r.TokenHash+"/"+r.ID)
}

func sessionCount(tx ledger.Tx) (int, error) {
	v, err := tx.Get(sessionsMeta, "count")
	if err != nil || v == nil {
		return 0, err
	}
	n, _ := strconv.Atoi(string(v))
	return n, nil
}

// sessionState is what the HTTP gate learnt about a request's session,
// for mcp-go's session id manager and for the tool handlers.
type sessionState struct {
	created *sessionRecord // initialize: the session just created
	rec     *sessionRecord // other requests: the session, validated
	local   bool           // a request of ours that only frees memory
}

type sessionStateKey struct{}

// sessionClient is the client name and version of the request's session,
// so that a call reaching a process that never saw the session's
// initialize is audited with them.
type sessionClient struct{ name, version string }

type sessionClientKey struct{}

// withSessionClient returns ctx carrying the session's client info.
func withSessionClient(ctx context.Context, name, version string) context.Context {
	return context.WithValue(ctx, sessionClientKey{}, sessionClient{name, version})
}

// sessionClientOf is the client info withSessionClient put on ctx.
func sessionClientOf(ctx context.Context) (string, string, bool) {
	c, ok := ctx.Value(sessionClientKey{}).(sessionClient)
	return c.name, c.version, ok
}

// sessionIDs adapts Sessions to mcp-go's session id manager: the HTTP gate
// has already created or validated the request's session (sessionState on
// the request's context); the manager hands mcp-go that verdict.
type sessionIDs struct{ s *Sessions }

// ResolveSessionIdManager implements mcpserver.SessionIdManagerResolver.
// mcp-go passes nil outside a request (its sweeper, CloseSessions): that
// only releases memory and never ends a session in the ledger.
func (m sessionIDs) ResolveSessionIdManager(r *http.Request) mcpserver.SessionIdManager {
	var st *sessionState
	if r != nil {
		st, _ = r.Context().Value(sessionStateKey{}).(*sessionState)
	}
	return &requestSessionIDs{s: m.s, r: r, st: st}
}

type requestSessionIDs struct {
	s  *Sessions
	r  *http.Request
	st *sessionState
}

// Generate returns the id of the session the gate created for this
// initialize.
func (m *requestSessionIDs) Generate() string {
	if m.st != nil && m.st.created != nil {
		return m.st.created.ID
	}
	// Not reached through the gate (which answers GET without a session
	// id 400): an id no one holds, which every later request finds unknown.
	return newSessionID()
}

// Validate reports the gate's verdict: only requests with a live session
// of their token get through the gate.
func (m *requestSessionIDs) Validate(id string) (bool, error) {
	if m.st != nil && m.st.rec != nil && m.st.rec.ID == id {
		return false, nil
	}
	return false, errNoSession
}

// Terminate ends the session in the ledger for a DELETE through the gate;
// otherwise (mcp-go's own cleanup, our memory release) it changes nothing
// there.
func (m *requestSessionIDs) Terminate(id string) (bool, error) {
	if m.r == nil || m.st == nil || m.st.local || m.st.rec == nil || m.st.rec.ID != id {
		return false, nil
	}
	err := m.s.End(m.r.Context(), m.st.rec.TokenHash, id)
	if errors.Is(err, errNoSession) {
		return false, nil // ended meanwhile: the DELETE's outcome holds
	}
	if err == nil {
		m.s.mu.Lock()
		delete(m.s.local, id) // mcp-go releases its memory itself after Terminate
		m.s.mu.Unlock()
	}
	return false, err
}
