// Package postgres is the ledger's PostgreSQL backend: one database shared
// by every replica (`idemgate serve --http` on several machines) and every
// command, through a pgx connection pool. The rules are in package ledger;
// this package stores bytes.
//
// # Storage
//
// Every collection is a range of one table, idemgate_kv (collection, key,
// value) with primary key (collection, key): bytea keys are ordered
// bytewise, so Get is an index lookup and a cursor walk is an ordered
// index scan, fetched a page at a time. The downstreams' collections
// (BTx.Data) live in the same table under "data:"+name, and
// idemgate_collections records which exist.
//
// # Transactions and the atomic claim
//
// Update is a READ COMMITTED transaction of its own that locks what it
// touches (strict two-phase locking on advisory locks, see "Locks" below):
// the first read of a key takes the key's lock in the same round trip,
// before the row is read, and every write takes it before COMMIT; locks
// are released only when the transaction ends. So a read-check-write (the
// claim: read the key's record, write in_progress) is never interleaved
// with another of the same key, on any replica — what makes a claim
// exactly-once — and committed Updates have the effect of running one
// after the other. Updates that touch no key in common do not wait for
// each other: the ledger keeps no key that every write transaction writes
// (on this Concurrent backend its audit entries are journaled and chained
// by its sealer, see ledger.Concurrent; its clocks are registers that
// only grow). Two that wait for each other's locks (a deadlock) are found
// by the server, which refuses one (40P01); it is run again.
//
// An Update's round trips: its first goes with BEGIN, the lock of its
// commit marker and the ledger's clocks; each read of a key not read
// before is one (lock and row together), and keys prefetched
// (ledger.Prefetcher) are read with the next; its writes, the commit
// marker, the change notices and COMMIT are the last one. A create is 3
// in all, 3.2 with the background work counted (counted by Stats; see
// SCALING.md). View is a REPEATABLE READ READ ONLY transaction, begun with
// its first read: one snapshot for its whole duration, taking no lock,
// never blocked by writers.
//
// A transient failure before COMMIT was sent (the connection lost, the
// server restarting, a deadlock) is a rollback, and the transaction is
// run again for up to 15 s, so replicas ride out a database restart; so
// is a batch whose statements the server refused before its COMMIT. A
// connection lost during COMMIT leaves the outcome unknown to the client,
// so every write transaction also writes a row of its own
// (idemgate_commits, a random id, batched with its writes: no extra round
// trip) and holds an advisory lock named by that id from its first
// statement; when COMMIT fails, the backend takes that lock on a new
// connection — granted only once the old transaction has ended, one way
// or the other — and reads the row back: present, the transaction
// committed and Update succeeds; absent, it did not and is run again.
// Only when the database cannot be reached for 15 s is the outcome
// reported as unknown (an error). Rows older than ten minutes are
// deleted.
//
// No session may hold its transaction open for long: every connection
// starts with an idle-in-transaction timeout (the server ends a session
// that sits in its transaction without a statement — a replica frozen
// mid-transaction — and its row locks with it), a lock timeout, a statement
// timeout and TCP keepalives (sessionBounds), and a statement whose answer
// does not come within stallTimeout is abandoned, its connection closed,
// and its transaction run again (or read back, when it was the COMMIT).
//
// # Clock
//
// The backend implements ledger.Clock: the ledger's time is the database
// server's clock (clock_timestamp()), not the replica's, sampled at open
// and every ClockResync, corrected by half the round trip, and carried
// between samples by this process's monotonic clock. Replicas on machines
// whose clocks drift therefore agree on leases, approval TTLs and
// retention to within a round trip.
//
// # Schema
//
// The schema is versioned (idemgate_schema_version) and migrated by Open
// (and `idemgate migrate`) under an advisory lock; a database migrated by a
// newer build is refused with ledger.ErrSchemaVersion.
//
// # Change notices
//
// The backend implements ledger.Notifier, so a duplicate waiting on a
// record running in another replica is woken by that replica's commit:
// a write transaction that changes records a waiter marked watched sends
// a NOTIFY per such record and removes the marks (one statement, in the
// batch before COMMIT, after its write locks; delivered at commit, and
// only if it commits; a transaction that changes no watched record sends
// none, and so stays out of the lock PostgreSQL takes on the whole
// database's notification queue in every notifying commit), and each
// process keeps one LISTEN connection that fans notices out to its
// waiters, reconnecting — and waking every waiter to re-read — when it
// is lost (notify.go). Background work
// (delivery claims, sweeps) is shared between replicas by rows in the
// ledger, the same on every backend (outbox claims, ledger.TakeTask),
// not by row or advisory locks, which last no longer than a transaction
// or a connection and would have to be held across network calls.
package postgres

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	neturl "net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"idemgate/ledger"
)

// DB is a ledger kept in a PostgreSQL database: the ledger's rules
// (ledger.Ledger, which implements ledger.Store) over this package's
// backend.
type DB struct {
	*ledger.Ledger
	be *backend
}

// IsURL reports whether db names a PostgreSQL database (a postgres:// or
// postgresql:// URL) rather than a ledger file.
func IsURL(db string) bool {
	return strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://")
}

// Redacted is db with a URL's password replaced by "xxxxx", for logs; a
// ledger file's path is returned as it is.
func Redacted(db string) string {
	if !IsURL(db) {
		return db
	}
	u, err := neturl.Parse(db)
	if err != nil {
		return "postgres://…"
	}
	return u.Redacted()
}

// ErrReadOnly is returned by every write of a ledger opened with
// OpenReadOnly.
var ErrReadOnly = errors.New("postgres: the ledger was opened read-only")

// ErrCommitUnknown is returned by a write whose COMMIT failed (the
// connection lost while it was sent) when whether it committed could not
// be read back within the retry window (the database unreachable): the
// transaction committed as a whole or not at all, and a read once the
// database is back tells which.
var ErrCommitUnknown = errors.New("postgres: COMMIT failed and whether the transaction committed could not be read back: its outcome is unknown")

// ClockResync is how often the backend samples the database's clock.
const ClockResync = 10 * time.Second

// openTimeout bounds connecting and migrating at open.
const openTimeout = 30 * time.Second

// Open opens the ledger in the database at url for reading and writing,
// first applying the schema migrations it lacks (under an advisory lock;
// a new database gets the whole schema). A schema newer than this build
// is refused with ledger.ErrSchemaVersion.
func Open(url string, opts ledger.Options) (*DB, error) {
	return open(url, opts, true, false)
}

// OpenExisting is Open for a database that already holds a ledger: one
// with no idemgate schema is refused with ErrNotMigrated, and nothing is
// created (the commands that change a ledger but should never start one).
func OpenExisting(url string, opts ledger.Options) (*DB, error) {
	return open(url, opts, false, false)
}

// OpenReadOnly opens an existing ledger for reading only: nothing is
// migrated or written; every write returns ErrReadOnly and the audit
// entries of reads are dropped.
func OpenReadOnly(url string, opts ledger.Options) (*DB, error) {
	return open(url, opts, false, true)
}

func open(url string, opts ledger.Options, mayMigrate, readOnly bool) (*DB, error) {
	be, err := openBackend(url, mayMigrate, readOnly)
	if err != nil {
		return nil, err
	}
	return &DB{Ledger: ledger.New(be, opts), be: be}, nil
}

// OpenBackend opens the database at url as a bare ledger.Backend,
// migrated like Open (ledger.New puts the ledger's rules on it; Open does
// both). For tests of the backend alone.
func OpenBackend(url string) (ledger.Backend, error) {
	return openBackend(url, true, false)
}

func openBackend(url string, mayMigrate, readOnly bool) (*backend, error) {
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	pool, err := newPool(ctx, url)
	if err != nil {
		return nil, err
	}
	be := &backend{pool: pool, readOnly: readOnly, known: map[string]bool{}, stop: make(chan struct{}), stall: stallTimeout, local: systemClock(), log: slog.Default()}
	if err := be.init(ctx, mayMigrate); err != nil {
		pool.Close()
		return nil, err
	}
	go be.clockLoop()
	return be, nil
}

// sessionBounds are the server settings every connection starts with
// (unless the URL sets them: any other URL parameter is a setting too),
// so that no session can stall the others for long:
//
//   - idle_in_transaction_session_timeout: the server ends a session that
//     sits in an open transaction without sending a statement (a replica
//     frozen, or its network gone, between two statements), and with it
//     the row locks it held. No transaction here waits between
//     statements for anything but this process's own code.
//   - lock_timeout: a statement gives up waiting for a lock (a row that
//     a concurrent transaction writes, a commit marker) after this; longer than the idle timeout, so a waiter outlasts
//     a frozen holder. The transaction did not commit; past the retry
//     window (retryFor) the write fails, with nothing written.
//   - statement_timeout: a statement (lock wait included) is cancelled
//     after this; no statement of the ledger's comes near it (migrations,
//     which may, run without it).
//   - tcp_keepalives_*: the server probes a connection that has been quiet
//     for 15 s and drops it after three unanswered probes 5 s apart, so a
//     replica whose machine died frees its connections in about 30 s.
var sessionBounds = map[string]string{
	"idle_in_transaction_session_timeout": "10s",
	"lock_timeout":                        "20s",
	"statement_timeout":                   "30s",
	"tcp_keepalives_idle":                 "15s",
	"tcp_keepalives_interval":             "5s",
	"tcp_keepalives_count":                "3",
}

// The replica's side of the same bounds: TCP keepalive probes on every
// connection (the same schedule as the server's), and stallTimeout, after
// which a statement that has had no answer is abandoned and its connection
// closed — the server answers every statement within statement_timeout,
// so a longer silence means the network or the server is gone (keepalives
// cannot tell when a middlebox keeps the TCP connection alive).
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

const stallTimeout = time.Minute

// errStalled is returned (wrapped) for a statement abandoned after the
// backend's stall timeout; transient counts it as a lost connection.
var errStalled = errors.New("no answer from the database in time: the connection is taken to be lost")

// bounded runs one exchange with the database, f, under the backend's
// stall timeout; an answer that did not come in time (while ctx itself
// is live) is errStalled.
func (b *backend) bounded(ctx context.Context, f func(context.Context) error) error {
	b.roundTrips.Add(1)
	sctx, cancel := context.WithTimeout(ctx, b.stall)
	defer cancel()
	err := f(sctx)
	if err != nil && sctx.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("%w (%v)", errStalled, err)
	}
	return err
}

// defaultMaxConns bounds a process's connections unless the URL sets
// pool_max_conns: each running Update holds one, so this is how many of a
// replica's write transactions run at once (and how many connections
// each replica adds to the server's max_connections, 100 by default).
const defaultMaxConns = 16

// newPool connects to url and checks the connection.
func newPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: the --db URL is not a valid PostgreSQL connection string: %v", redact(err))
	}
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = defaultMaxConns
	}
	if cfg.ConnConfig.ConnectTimeout == 0 { // unless the URL sets connect_timeout
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	// pgx applies ConnectTimeout to the whole connect; the dialer adds the
	// keepalive probes.
	cfg.ConnConfig.DialFunc = (&net.Dialer{KeepAliveConfig: keepAlive}).DialContext
	for k, v := range sessionBounds {
		if _, set := cfg.ConnConfig.RuntimeParams[k]; !set {
			cfg.ConnConfig.RuntimeParams[k] = v
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, connError(err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, connError(err)
	}
	return pool, nil
}

// redact drops the URL from a parse error (pgx quotes it, password and
// all) and keeps the reason.
func redact(err error) string {
	s := err.Error()
	if i := strings.Index(s, "://"); i >= 0 {
		reason := ""
		if j := strings.LastIndex(s, "`: "); j > i {
			reason = ": " + s[j+3:]
			if k := strings.Index(reason, "://"); k >= 0 { // the reason quotes it again
				reason = ""
			}
		}
		return "cannot parse it (the URL is not repeated here: it may hold a password)" + reason
	}
	return s
}

func connError(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("postgres: %w", err)
}

// backend implements ledger.Backend and ledger.Clock on a pool.
type backend struct {
	pool     *pgxpool.Pool
	readOnly bool
	stall    time.Duration // stallTimeout (shorter in tests)

	mu          sync.Mutex
	closed      bool
	known       map[string]bool // data collections known to exist (committed)
	local       localClock      // this process's clocks (systemClock; tests replace it)
	dbAt        time.Time       // the database's clock at the last sample
	dbAtElapsed time.Duration   // local.elapsed() at that instant
	skewed      bool            // the last sample found the wall clock off by more than maxSkew
	log         *slog.Logger

	stop     chan struct{}
	stopOnce sync.Once
	listen   listener // the LISTEN connection (notify.go)

	conflicts  int64        // transactions refused for a conflict (under mu)
	roundTrips atomic.Int64 // exchanges with the database (bounded)
}

var (
	_ ledger.Backend = (*backend)(nil)
	_ ledger.Clock   = (*backend)(nil)
)

func (b *backend) init(ctx context.Context, mayMigrate bool) error {
	if mayMigrate {
		if _, _, err := migrate(ctx, b.pool); err != nil {
			return err
		}
	} else {
		v, err := currentVersion(ctx, b.pool)
		if err != nil {
			return err
		}
		if v == 0 {
			return fmt.Errorf("%w: run `idemgate migrate --db URL` (or `idemgate serve`) first", ErrNotMigrated)
		}
		if v > SchemaVersion() {
			return newerSchema(v)
		}
		if v < SchemaVersion() && !b.readOnly {
			if _, _, err := migrate(ctx, b.pool); err != nil {
				return err
			}
		} else if v < SchemaVersion() {
			return fmt.Errorf("%w: the database's idemgate schema is version %d, this build needs %d: run `idemgate migrate --db URL`", ledger.ErrSchemaVersion, v, SchemaVersion())
		}
	}
	if err := b.syncClock(ctx); err != nil {
		return err
	}
	if b.readOnly {
		return nil
	}
	return b.Update(ctx, func(tx ledger.BTx) error { return ledger.Upgrade(tx) })
}

// localClock is this process's own time, as the backend reads it
// between samples of the database's clock: elapsed, a monotonic count
// since an arbitrary origin (steady, never stepped), which carries the
// ledger's time from one sample to the next; and wall, the wall clock
// (NTP or an operator may step it at any moment), read only to warn when
// it is far off the database's. Tests replace both.
type localClock struct {
	wall    func() time.Time
	elapsed func() time.Duration
}

func systemClock() localClock {
	origin := time.Now() // carries Go's monotonic clock reading: time.Since measures with it
	return localClock{wall: time.Now, elapsed: func() time.Duration { return time.Since(origin) }}
}

// maxSkew is how far this machine's wall clock may be off the database's
// before a sample logs a warning: the ledger does not use it, but a
// clock that far off breaks whatever else on the machine trusts it (and
// usually means its time synchronisation is broken).
const maxSkew = 5 * time.Second

// syncClock samples the database's clock: the sample, taken halfway
// through the query's round trip by the monotonic clock, is the anchor
// Now counts from.
func (b *backend) syncClock(ctx context.Context) error {
	b.mu.Lock()
	local := b.local
	b.mu.Unlock()
	e0 := local.elapsed()
	var db time.Time
	if err := b.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&db); err != nil {
		return connError(err)
	}
	e1 := local.elapsed()
	at := e0 + (e1-e0)/2
	skew := local.wall().Sub(db.Add(e1 - at)) // this machine's wall clock minus the database's, now
	b.mu.Lock()
	b.dbAt, b.dbAtElapsed = db, at
	warn := !b.skewed && (skew > maxSkew || skew < -maxSkew)
	b.skewed = skew > maxSkew || skew < -maxSkew
	b.mu.Unlock()
	if warn {
		b.log.Warn("this machine's clock is far off the PostgreSQL server's; the ledger keeps the database's time, but check the machine's time synchronisation",
			"machine_minus_database", skew.Round(time.Millisecond).String())
	}
	return nil
}

func (b *backend) clockLoop() {
	t := time.NewTicker(ClockResync)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			b.syncClock(ctx) // on failure the last sample stays: the monotonic clock carries it
			if !b.readOnly {
				b.pool.Exec(ctx, "DELETE FROM idemgate_commits WHERE at < now() - make_interval(secs => $1)", commitsKept.Seconds())
			}
			cancel()
		}
	}
}

// Now implements ledger.Clock: the database's clock as last sampled,
// plus the monotonic time elapsed since the sample. The machine's wall
// clock plays no part: a step of it (NTP, an operator) is never
// believed, and between samples the time moves only as fast as the
// monotonic clock. That clock stops while the machine is suspended, so a
// replica resumed from a suspended VM runs behind the database by the
// suspension until its next sample (at most ClockResync); a lease it
// writes meanwhile ends that much sooner for the other replicas, and is
// handled as any lapsed lease (fencing by generation refuses the late
// completion).
func (b *backend) Now() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dbAt.Add(b.local.elapsed() - b.dbAtElapsed)
}

func (b *backend) ReadOnly() bool { return b.readOnly }

func (b *backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	b.stopOnce.Do(func() { close(b.stop) })
	b.stopListening()
	b.pool.Close()
	return nil
}

func (b *backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// retryFor bounds how long a transaction is retried after transient
// failures (a database restart takes a few seconds).
const retryFor = 15 * time.Second

// retry runs attempt until it succeeds, fails for good, or retryFor has
// passed; attempt reports whether its failure is safe to retry.
//
// After a deadlock or serialization failure (conflict) it waits a random
// few milliseconds, more after each conflict in a row, so that
// transactions that collided do not collide again; after any other
// transient failure (the database restarting) it backs off from 20 ms to
// a second.
func (b *backend) retry(ctx context.Context, attempt func() (bool, error)) error {
	deadline := time.Now().Add(retryFor)
	wait := 20 * time.Millisecond
	conflicts := 0
	for {
		again, err := attempt()
		pause := wait
		if conflict(err) {
			conflicts++
			pause = time.Duration(rand.Int64N(int64(min(conflicts, 16)) * int64(2*time.Millisecond)))
			b.mu.Lock()
			b.conflicts++
			b.mu.Unlock()
		}
		if err == nil || !again || b.isClosed() || ctx.Err() != nil || time.Now().Add(pause).After(deadline) {
			return err
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return err
		}
		if !conflict(err) {
			wait = min(2*wait, time.Second)
		}
	}
}

// conflict reports whether err is the server's refusal of a transaction
// that collided with a concurrent one (a serialization failure or a
// deadlock): it did not commit, and may when run again.
func conflict(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// Stats reports this process's exchanges with the database (round
// trips: a statement, or a batch of them sent together) and how many of
// its transactions the database refused for a conflict with a concurrent
// one (each was run again), since it opened the ledger.
func (d *DB) Stats() (roundTrips, conflicts int64) {
	d.be.mu.Lock()
	defer d.be.mu.Unlock()
	return d.be.roundTrips.Load(), d.be.conflicts
}

// Update implements ledger.Backend (see the package documentation): one
// transaction of its own, locking the keys it touches. A transaction that
// failed before COMMIT was sent for a transient reason (a deadlock with a
// concurrent Update, the connection lost, the server restarting) did not
// commit, and is run again (fn with it, as the interface allows) for up
// to retryFor; a failure of the last round trip, which carries COMMIT, is
// read back, never guessed at, unless the server answered it with an
// error (then it certainly did not commit).
func (b *backend) Update(ctx context.Context, fn func(ledger.BTx) error) error {
	if b.isClosed() {
		return ledger.ErrClosed
	}
	if b.readOnly {
		return ErrReadOnly
	}
	return b.retry(ctx, func() (bool, error) { return b.update(ctx, fn) })
}

// Concurrent implements ledger.Concurrent: Updates of different keys run
// in parallel (the ledger then journals its audit entries).
func (b *backend) Concurrent() bool { return true }

// update runs fn in one transaction; retry reports whether it failed
// before COMMIT for a transient reason. fn's own error is returned as is,
// after a rollback.
func (b *backend) update(ctx context.Context, fn func(ledger.BTx) error) (retry bool, err error) {
	var c *pgxpool.Conn
	actx, cancel := context.WithTimeout(ctx, b.stall)
	c, err = b.pool.Acquire(actx)
	cancel()
	if err != nil {
		return transient(err), b.txError(err)
	}
	defer c.Release() // the pool closes a broken connection
	tx := &btx{b: b, ctx: ctx, conn: c, opts: pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, writable: true, marker: uuid.NewString()}
	tx.prelude()
	committed := false
	defer func() {
		if !committed && tx.pt != nil {
			b.rollback(ctx, tx.pt)
		}
	}()
	ferr := fn(tx)
	if tx.err != nil { // a failed read may have misled fn: its error is not the cause
		return transient(tx.err), b.txError(tx.err)
	}
	if ferr != nil {
		return false, ferr
	}
	// The last round trip: the remaining writes, the commit marker and
	// COMMIT, together.
	tx.final = true
	if err := tx.flush(); err != nil {
		if refused(err) { // the server refused a statement or COMMIT: not committed
			return transient(err), b.txError(err)
		}
		// The outcome is unknown: read it back rather than guess, on
		// another connection (this one is suspect).
		did, known := b.readBack(ctx, tx.marker)
		switch {
		case !known:
			return false, fmt.Errorf("%w: %w", ErrCommitUnknown, err)
		case !did:
			return true, b.txError(err) // certainly not committed: run it again
		}
	}
	committed = true
	b.mu.Lock()
	for _, n := range tx.created {
		b.known[n] = true
	}
	b.mu.Unlock()
	return false, nil
}

// refused reports whether err is the server's refusal of a statement of
// the transaction (an ERROR), which rolls it back. A FATAL or PANIC ends
// the session, and may follow a COMMIT that succeeded: a server shutting
// down sends one to a session waiting for its client's next message, so
// the COMMIT's own answer and the end of the session arrive together.
func refused(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	severity := pe.SeverityUnlocalized
	if severity == "" { // a server older than 9.6
		severity = pe.Severity
	}
	return severity == "ERROR"
}

// exchange sends batch in t, beginning the transaction with it when
// nothing was sent yet: BEGIN, the commit marker's lock and the reads
// Prefetch asked for (the prelude's among them) go first, in the same
// round trip. Later round trips carry the reads asked for since, unless
// they carry COMMIT. Within the stall timeout.
func (t *btx) exchange(batch *pgx.Batch) error {
	marker := t.pt == nil && t.writable // the round trip that begins an Update
	if marker || len(t.ahead) > 0 && !t.final {
		ahead := &pgx.Batch{}
		t.queueAhead(ahead, marker)
		batch.QueuedQueries = append(ahead.QueuedQueries, batch.QueuedQueries...)
	}
	err := t.b.bounded(t.ctx, func(ctx context.Context) error {
		if t.pt != nil {
			return t.pt.SendBatch(ctx, batch).Close()
		}
		full := &pgx.Batch{}
		full.BeginTx(t.opts)
		full.QueuedQueries = append(full.QueuedQueries, batch.QueuedQueries...)
		br := t.conn.SendBatch(ctx, full)
		t.pt = br.Tx()
		return br.Close()
	})
	if err != nil {
		t.fail(err)
	}
	return err
}

// prelude asks, as an Update begins, for what its first round trip reads
// besides its own: the ledger's meta keys that most write transactions
// read (ledger.WriteMetaKeys: its clocks, read without a lock, see
// isClockKey). That round trip also takes the commit marker's lock
// (which a read-back waits for, see readBack) with its others
// (queueAhead).
func (t *btx) prelude() {
	t.Prefetch(ledger.MetaCollection, ledger.WriteMetaKeys()...)
}

// queueSelect queues the statement that reads keys, keys[i] of
// collection colls[i]; their rows (or their absence) are remembered in
// t, unless t knows a key already.
func (t *btx) queueSelect(batch *pgx.Batch, colls []string, keys [][]byte) {
	batch.Queue(`SELECT u.c, u.k, kv.value FROM unnest($1::text[], $2::bytea[]) AS u(c, k)
		JOIN idemgate_kv AS kv ON kv.collection = u.c AND kv.key = u.k`, colls, keys).Query(func(rows pgx.Rows) error {
		type row struct{ coll, key string }
		found := map[row][]byte{}
		for rows.Next() {
			var c string
			var k, v []byte
			if err := rows.Scan(&c, &k, &v); err != nil {
				return err
			}
			if v == nil {
				v = []byte{}
			}
			found[row{c, string(k)}] = v
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for i, k := range keys {
			coll := colls[i]
			if _, known := t.cache[coll][string(k)]; known {
				// Written in this round trip, after this read (a flush
				// that carried prefetched reads): the write is newer.
				continue
			}
			if v, ok := found[row{coll, string(k)}]; ok {
				t.remember(coll, string(k), &v)
			} else {
				t.remember(coll, string(k), nil)
			}
		}
		return nil
	})
}

// Prefetch is the buckets' (ledger.Prefetcher): the reads of keys of
// coll that the transaction neither wrote nor read yet go with its next
// round trip, locks and all (unless that one carries COMMIT and is not
// the Update's first, see exchange).
func (t *btx) Prefetch(coll string, keys ...[]byte) {
	for _, k := range keys {
		if _, ok := t.pending[coll][string(k)]; ok {
			continue
		}
		if _, ok := t.cache[coll][string(k)]; ok {
			continue
		}
		if t.ahead == nil {
			t.ahead = map[string][][]byte{}
		}
		t.ahead[coll] = append(t.ahead[coll], bytes.Clone(k))
	}
}

// queueAhead queues the reads Prefetch asked for: their locks (and, when
// the round trip begins an Update, its commit marker's) in one statement,
// then their values in another.
func (t *btx) queueAhead(batch *pgx.Batch, marker bool) {
	var r lockRequest
	if marker {
		r.marker = []int64{markerLockKey(t.marker)}
	}
	var colls []string
	var keys [][]byte
	for _, coll := range slices.Sorted(maps.Keys(t.ahead)) {
		t.wantLocks(&r, coll, t.ahead[coll], false)
		for _, k := range t.ahead[coll] {
			colls, keys = append(colls, coll), append(keys, k)
		}
	}
	r.queue(batch)
	if len(keys) > 0 {
		t.queueSelect(batch, colls, keys)
	}
	t.ahead = nil
}

// isAhead reports whether key of coll waits in t.ahead.
func (t *btx) isAhead(coll string, key []byte) bool {
	return slices.ContainsFunc(t.ahead[coll], func(k []byte) bool { return bytes.Equal(k, key) })
}

// markerLockKey is the advisory lock key of a transaction's commit marker.
func markerLockKey(marker string) int64 {
	id, err := uuid.Parse(marker)
	if err != nil {
		return 0
	}
	return int64(binary.BigEndian.Uint64(id[:8]))
}

// readBack learns whether the transaction that wrote marker committed,
// after its COMMIT failed: it takes the marker's advisory lock (which
// that transaction holds until it ends, committed or rolled back) and
// looks for the marker. known is false when the database could not be asked within
// retryFor.
func (b *backend) readBack(ctx context.Context, marker string) (committed, known bool) {
	ctx = context.WithoutCancel(ctx)
	deadline := time.Now().Add(retryFor)
	for wait := 20 * time.Millisecond; time.Now().Before(deadline) && !b.isClosed(); wait = min(2*wait, time.Second) {
		// Each attempt is bounded by the deadline: a connection that
		// stalls must not hold the answer up for longer.
		actx, cancel := context.WithDeadline(ctx, deadline)
		err := pgx.BeginFunc(actx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(actx, "SELECT pg_advisory_xact_lock($1)", markerLockKey(marker)); err != nil {
				return err
			}
			return tx.QueryRow(actx, "SELECT EXISTS (SELECT 1 FROM idemgate_commits WHERE id = $1)", marker).Scan(&committed)
		})
		cancel()
		if err == nil {
			return committed, true
		}
		time.Sleep(wait)
	}
	return false, false
}

// rollback ends a transaction that will not commit, within a few seconds:
// on a connection that stalls, pgx closes the connection instead (the
// server then rolls back, or ends the session when it sits idle in the
// transaction).
func (b *backend) rollback(ctx context.Context, pt pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(b.stall, 5*time.Second))
	defer cancel()
	pt.Rollback(rctx)
}

// commitsKept is how long the idemgate_commits rows are kept (a read-back
// happens within retryFor of its COMMIT).
const commitsKept = 10 * time.Minute

// transient reports whether err is a failure after which the transaction
// certainly did not commit and may succeed when run again: the
// connection failed or stalled (the server rolls back a transaction whose
// connection is gone, and ends one left idle), the server is shutting
// down or starting or ended the session, a lock wait timed out, or a
// serialization failure or deadlock. (A failed COMMIT is not judged
// here: it is read back.)
func transient(err error) bool {
	if errors.Is(err, errStalled) {
		return true
	}
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "40001", "40P01", "57P01", "57P02", "57P03", "08000", "08003", "08006", "08001", "08004",
			"55P03", // lock_not_available: lock_timeout ran out
			"25P03": // idle_in_transaction_session_timeout ended the session
			return true
		}
		return false
	}
	return true // not an answer of the server: the connection failed
}

// View implements ledger.Backend: one snapshot, read only. It is run
// again after a transient failure (a read changes nothing).
func (b *backend) View(ctx context.Context, fn func(ledger.BTx) error) error {
	if b.isClosed() {
		return ledger.ErrClosed
	}
	return b.retry(ctx, func() (bool, error) { return b.view(ctx, fn) })
}

// ReadCommitted implements ledger.PointReader: one statement, in no
// transaction, under the stall timeout; run again after a transient
// failure, as a View is.
func (b *backend) ReadCommitted(ctx context.Context, coll string, key []byte) ([]byte, error) {
	if b.isClosed() {
		return nil, ledger.ErrClosed
	}
	var v []byte
	err := b.retry(ctx, func() (bool, error) {
		v = nil
		err := b.bounded(ctx, func(ctx context.Context) error {
			return b.pool.QueryRow(ctx, "SELECT value FROM idemgate_kv WHERE collection = $1 AND key = $2", coll, key).Scan(&v)
		})
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return false, nil
		case err != nil:
			return transient(err), b.txError(err)
		case v == nil:
			v = []byte{}
		}
		return false, nil
	})
	return v, err
}

func (b *backend) view(ctx context.Context, fn func(ledger.BTx) error) (bool, error) {
	actx, cancel := context.WithTimeout(ctx, b.stall)
	c, err := b.pool.Acquire(actx)
	cancel()
	if err != nil {
		return transient(err), b.txError(err)
	}
	defer c.Release()
	tx := &btx{b: b, ctx: ctx, conn: c, opts: pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}}
	defer func() {
		if tx.pt != nil {
			b.rollback(ctx, tx.pt)
		}
	}()
	ferr := fn(tx)
	if tx.err != nil {
		return transient(tx.err), b.txError(tx.err)
	}
	return false, ferr
}

func (b *backend) txError(err error) error {
	if err == nil {
		return nil
	}
	if b.isClosed() {
		return ledger.ErrClosed
	}
	return connError(err)
}

var errViewWrite = errors.New("postgres: write in a read-only transaction")

// btx is one transaction. Writes are kept in pending and sent in one batch
// before a cursor query on their collection and before COMMIT; Get reads
// pending first. The first query error sticks: the transaction then fails.
//
// Rows read by Get are remembered (cache), and so is the last row of a
// collection once a cursor asked for it (tails); both are kept up to date
// as pending writes are sent. What is remembered stays true for the whole
// transaction: a View and an Update each read one snapshot.
type btx struct {
	b        *backend
	ctx      context.Context
	conn     *pgxpool.Conn // the connection the transaction runs on
	opts     pgx.TxOptions // how it begins (exchange)
	pt       pgx.Tx        // nil until its first round trip began it
	writable bool
	err      error
	pending  map[string]map[string]*[]byte   // collection → key → value (nil: deleted)
	created  []string                        // data collections created here
	marker   string                          // an Update's idemgate_commits row, written by the final flush
	final    bool                            // the next flush is the one before COMMIT
	notices  []string                        // NOTIFY payloads the final flush sends (notify.go)
	cache    map[string]map[string]cachedRow // collection → key → the row in the database (see btx)
	cached   int                             // entries in cache, at most maxCached
	tails    map[string]tail                 // collection → its last row in the database, when known
	ahead    map[string][][]byte             // collection → keys whose reads go with the next round trip (Prefetch)
	// An Update's locks (see wantLocks): keys, and collections held
	// shared and exclusively.
	locked       map[int64]lockMode
	collS, collX map[string]bool
}

// cachedRow is a row of the database as this transaction knows it
// (present false: no such key).
type cachedRow struct {
	v       []byte
	present bool
}

// tail is the last row of a collection in the database (k nil: none).
type tail struct{ k, v []byte }

// maxCached bounds the rows a transaction remembers (a View walking a
// large collection with Get must not hold it all in memory).
const maxCached = 4096

// remember notes that key's row in the database is v (nil: absent), as
// read or just written. An entry already there is always updated; a new
// one only while there is room.
func (t *btx) remember(coll, key string, v *[]byte) {
	m := t.cache[coll]
	if _, ok := m[key]; !ok && t.cached >= maxCached {
		return
	}
	if m == nil {
		if t.cache == nil {
			t.cache = map[string]map[string]cachedRow{}
		}
		m = map[string]cachedRow{}
		t.cache[coll] = m
	}
	if _, ok := m[key]; !ok {
		t.cached++
	}
	if v == nil {
		m[key] = cachedRow{}
	} else {
		m[key] = cachedRow{v: *v, present: true}
	}
}

// wrote updates what the transaction remembers after sending a write.
func (t *btx) wrote(coll, key string, v *[]byte) {
	t.remember(coll, key, v)
	tl, known := t.tails[coll]
	if !known {
		return
	}
	switch {
	case v != nil && (tl.k == nil || key >= string(tl.k)):
		t.tails[coll] = tail{k: []byte(key), v: *v}
	case v == nil && tl.k != nil && key == string(tl.k):
		delete(t.tails, coll) // the row before it is not known
	}
}

func (t *btx) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

func (t *btx) Bucket(name []byte) ledger.Bucket {
	return &bucket{tx: t, coll: string(name)}
}

func (t *btx) Data(name string, create bool) (ledger.Bucket, error) {
	coll := "data:" + name
	t.b.mu.Lock()
	known := t.b.known[coll]
	t.b.mu.Unlock()
	if !known && !containsStr(t.created, coll) {
		var exists bool
		batch := &pgx.Batch{}
		batch.Queue("SELECT EXISTS (SELECT 1 FROM idemgate_collections WHERE name = $1)", coll).QueryRow(func(row pgx.Row) error { return row.Scan(&exists) })
		if err := t.exchange(batch); err != nil {
			return nil, connError(err)
		}
		switch {
		case exists:
			t.b.mu.Lock()
			t.b.known[coll] = true
			t.b.mu.Unlock()
		case !create:
			return nil, nil
		case !t.writable:
			return nil, errViewWrite
		default:
			batch := &pgx.Batch{}
			batch.Queue("INSERT INTO idemgate_collections (name) VALUES ($1) ON CONFLICT DO NOTHING", coll)
			if err := t.exchange(batch); err != nil {
				return nil, connError(err)
			}
			t.created = append(t.created, coll)
		}
	}
	return &bucket{tx: t, coll: coll}, nil
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// flush sends the pending writes (of colls, or of every collection when
// none is named) in one batch of multi-row statements: the puts as one
// upsert of parallel arrays, the deletes as one statement per collection
// (key = ANY, an index scan whatever the table's size; a join with the
// arrays could be planned as a scan of the whole table), split by
// rowChunks. A statement per row cost PostgreSQL and this process a
// statement's overhead for each of the some twenty rows of a create. The
// pending writes hold one value per key, so no statement touches a row
// twice and their order does not matter.
func (t *btx) flush(colls ...string) error {
	if t.err != nil {
		return t.err
	}
	batch := &pgx.Batch{}
	t.queueFlush(batch, colls...)
	if batch.Len() == 0 {
		return nil
	}
	return t.exchange(batch)
}

// queueFlush queues flush's statements in batch: the locks of the keys
// written, the writes and, in the final flush, the journal's entries
// under the transaction's order, the commit marker, the notices and
// COMMIT.
func (t *btx) queueFlush(batch *pgx.Batch, colls ...string) {
	if len(t.pending) == 0 && !t.final {
		return
	}
	if len(colls) == 0 {
		for c := range t.pending {
			colls = append(colls, c)
		}
	}
	// Collections and keys in order: two transactions whose statements
	// write rows in common (the ledger's clocks, written without a key
	// lock) write them in the same order, so they never wait for each
	// other's row locks in a cycle.
	slices.Sort(colls)
	// Every lock the writes need first, in one order (sorted by lock id)
	// whichever transaction sends them: two flushes never wait for each
	// other in a cycle.
	var locks lockRequest
	for _, c := range colls {
		if c == ledger.JournalCollection && !t.final {
			continue
		}
		keys := make([][]byte, 0, len(t.pending[c]))
		for k := range t.pending[c] {
			keys = append(keys, []byte(k))
		}
		t.wantLocks(&locks, c, keys, true)
	}
	locks.queue(batch)
	var puts, maxima, journal rowChunks
	for _, c := range colls {
		if c == ledger.JournalCollection && !t.final {
			continue // its entries take their order last (below)
		}
		var dels rowChunks
		for _, k := range slices.Sorted(maps.Keys(t.pending[c])) {
			v := t.pending[c][k]
			t.wrote(c, k, v)
			switch {
			case v == nil:
				dels.add(c, []byte(k), nil)
			case c == ledger.MetaCollection && isClockKey(k):
				maxima.add(c, []byte(k), v)
			case c == ledger.JournalCollection:
				journal.add(c, []byte(k), v)
			default:
				puts.add(c, []byte(k), v)
			}
		}
		for _, ch := range dels {
			batch.Queue("DELETE FROM idemgate_kv WHERE collection = $1 AND key = ANY($2::bytea[])", c, ch.keys)
		}
		delete(t.pending, c)
	}
	for _, ch := range puts {
		batch.Queue(`INSERT INTO idemgate_kv (collection, key, value) SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[])
			ON CONFLICT (collection, key) DO UPDATE SET value = EXCLUDED.value`, ch.colls, ch.keys, ch.values)
	}
	for _, ch := range maxima { // the ledger's clocks only grow (see isClockKey)
		batch.Queue(`INSERT INTO idemgate_kv (collection, key, value) SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[])
			ON CONFLICT (collection, key) DO UPDATE SET value = GREATEST(idemgate_kv.value, EXCLUDED.value)`, ch.colls, ch.keys, ch.values)
	}
	for i, ch := range journal {
		// The transaction's order replaces the 8 bytes the ledger put
		// first in each key (see ledger.JournalCollection): taken now,
		// after every lock the transaction takes, so a transaction that
		// read this one's writes takes a greater one.
		order := "currval('idemgate_journal_order')"
		if i == 0 {
			order = "nextval('idemgate_journal_order')"
		}
		batch.Queue(`INSERT INTO idemgate_kv (collection, key, value)
			SELECT $1, int8send(o.n) || substr(j.k, 9), j.v FROM (SELECT `+order+` AS n) AS o, unnest($2::bytea[], $3::bytea[]) AS j(k, v)`,
			ledger.JournalCollection, ch.keys, ch.values)
	}
	if t.final && len(t.pending) == 0 { // the final flush
		batch.Queue("INSERT INTO idemgate_commits (id) VALUES ($1)", t.marker)
		t.queueNotices(batch)
		batch.Queue("COMMIT")
	}
}

// Locks. An Update holds, until it ends, an exclusive advisory lock on
// every key it reads or writes (a shared one on a key of the meta
// collection it only reads), and a shared one on each collection it
// touches; a cursor takes its collection exclusively (a range read: no
// key of it may change until the transaction ends; not in the ledger's
// swept indexes, see ledger.SweptCollections). The locks a round trip
// takes are sorted (collections, then keys), so two transactions' final
// round trips never wait for each other in a cycle. Locks
// are only ever added, never released early (strict two-phase locking),
// so committed Updates have the effect of running one after the other in
// the order of their commits; two that wait for each other (a deadlock)
// are found by the server, one of them is refused (40P01) and run again.
// Transactions that touch no key in common never wait for each other.
//
// Two kinds of keys take no lock. The ledger's clocks (isClockKey) are
// read with BEGIN, unlocked, and written as registers that only grow
// (GREATEST), so concurrent writers never move them back. The audit
// journal's keys are the writing transaction's own (its order), read only
// by the sealer, which sees a transaction's entries once it has committed.
//
// A transaction holds a lock per key it touches: a create about twenty, a
// deliverer's record of a full pass (500 messages) about 1 500.
// PostgreSQL's lock table holds max_locks_per_transaction (64) ×
// max_connections (100) by default, shared by every session: enough for
// a few replicas' deliverers at once; docs/postgres.md says when to raise
// it.

// lockID is the advisory lock of a collection (key nil) or of one key of
// it: a 64-bit FNV-1a hash of both, told apart by a leading byte.
func lockID(coll string, key []byte) int64 {
	h := fnv.New64a()
	if key == nil {
		h.Write([]byte{'c'})
		h.Write([]byte(coll))
	} else {
		h.Write([]byte{'k'})
		h.Write([]byte(coll))
		h.Write([]byte{0})
		h.Write(key)
	}
	return int64(h.Sum64())
}

// unlocked reports whether coll's keys are written without locks (the
// audit journal).
func unlocked(coll string) bool { return coll == ledger.JournalCollection }

// isClockKey reports whether key (of the meta collection) is one of the
// ledger's clocks: 8-byte big-endian times that only grow.
func isClockKey(key string) bool { return ledger.ClockKey([]byte(key)) }

// wantLocks adds to r the locks of keys of coll the transaction does
// not hold yet (a write's exclusive ones, or a read's), and notes them as
// held: they are, once r's statements have run.
func (t *btx) wantLocks(r *lockRequest, coll string, keys [][]byte, write bool) {
	if !t.writable || unlocked(coll) || t.collX[coll] {
		return
	}
	if coll == ledger.MetaCollection {
		keys = slices.DeleteFunc(slices.Clone(keys), func(k []byte) bool { return isClockKey(string(k)) })
	}
	// The meta collection's few ledger-wide keys (the retention walk's
	// place, the audit index's watermark) are read by many transactions
	// and written by one background task at a time: a read takes them
	// shared. Every other key is taken exclusively by its first read, so
	// that a read-modify-write (the claim) never has to upgrade.
	mode := lockExclusive
	if !write && coll == ledger.MetaCollection {
		mode = lockShared
	}
	if t.locked == nil {
		t.locked, t.collS, t.collX = map[int64]lockMode{}, map[string]bool{}, map[string]bool{}
	}
	n := 0
	for _, k := range keys {
		id := lockID(coll, k)
		if t.locked[id] >= mode {
			continue
		}
		t.locked[id] = mode
		n++
		if mode == lockShared {
			r.shared = append(r.shared, id)
		} else {
			r.exclusive = append(r.exclusive, id)
		}
	}
	if n > 0 && !t.collS[coll] {
		r.collections = append(r.collections, lockID(coll, nil))
		t.collS[coll] = true
	}
}

// queueLocks queues the statements that lock keys of coll for the
// transaction (those it does not hold yet), before the statements that
// read or write them in the same batch.
func (t *btx) queueLocks(batch *pgx.Batch, coll string, keys [][]byte, write bool) {
	var r lockRequest
	t.wantLocks(&r, coll, keys, write)
	r.queue(batch)
}

// lockRequest is the advisory locks one round trip takes: the commit
// marker's, then collections shared, then keys, each sorted. The marker's
// comes first because no other transaction takes it but a read-back
// (readBack), which must find it held from the first round trip on: the
// transaction holds it before it can wait for any other lock.
type lockRequest struct {
	marker, collections, shared, exclusive []int64
}

// queue queues r's statement in batch: one, which takes the locks in
// r's order (each group sorted) and in the mode of each.
func (r *lockRequest) queue(batch *pgx.Batch) {
	n := len(r.marker) + len(r.collections) + len(r.shared) + len(r.exclusive)
	if n == 0 {
		return
	}
	ids, exclusive := make([]int64, 0, n), make([]bool, 0, n)
	for _, g := range []struct {
		ids       []int64
		exclusive bool
	}{{r.marker, true}, {r.collections, false}, {r.shared, false}, {r.exclusive, true}} {
		slices.Sort(g.ids)
		for _, id := range g.ids {
			ids, exclusive = append(ids, id), append(exclusive, g.exclusive)
		}
	}
	batch.Queue(`SELECT count(CASE WHEN l.x THEN pg_advisory_xact_lock(l.id) ELSE pg_advisory_xact_lock_shared(l.id) END)
		FROM (SELECT * FROM unnest($1::bigint[], $2::bool[]) WITH ORDINALITY AS u(id, x, n) ORDER BY n) AS l`, ids, exclusive)
}

// lockMode is how a transaction holds a key's lock.
type lockMode uint8

const (
	lockShared    lockMode = 1
	lockExclusive lockMode = 2
)

// queueCollectionLock queues the statement that takes coll exclusively
// for the rest of the transaction (a cursor in an Update), unless it
// holds it already or coll is one of the ledger's swept indexes
// (ledger.SweptCollections), whose walks lock the records they act on
// instead.
func (t *btx) queueCollectionLock(batch *pgx.Batch, coll string) {
	if !t.writable || unlocked(coll) || t.collX[coll] || slices.Contains(ledger.SweptCollections(), coll) {
		return
	}
	batch.Queue("SELECT pg_advisory_xact_lock($1)", lockID(coll, nil))
	if t.collX == nil {
		t.locked, t.collS, t.collX = map[int64]lockMode{}, map[string]bool{}, map[string]bool{}
	}
	t.collX[coll] = true
}

// One multi-row statement carries at most maxChunkRows rows and, past its
// first row, maxChunkBytes of keys and values: PostgreSQL bounds one
// array parameter to 1 GB, and a flush of many large values is sent as
// several statements rather than one huge array.
const (
	maxChunkRows  = 1000
	maxChunkBytes = 16 << 20
)

// rowChunk is the rows of one multi-row statement, as parallel arrays
// (values nil for deletes).
type rowChunk struct {
	colls  []string
	keys   [][]byte
	values [][]byte
	bytes  int
}

// rowChunks collects rows into chunks of at most maxChunkRows rows and
// about maxChunkBytes.
type rowChunks []rowChunk

// add adds a row: a put of *value, or a delete when value is nil.
func (r *rowChunks) add(coll string, key []byte, value *[]byte) {
	n := len(key)
	if value != nil {
		n += len(*value)
	}
	if len(*r) == 0 {
		*r = append(*r, rowChunk{})
	}
	c := &(*r)[len(*r)-1]
	if len(c.keys) >= maxChunkRows || (len(c.keys) > 0 && c.bytes+n > maxChunkBytes) {
		*r = append(*r, rowChunk{})
		c = &(*r)[len(*r)-1]
	}
	c.colls = append(c.colls, coll)
	c.keys = append(c.keys, key)
	if value != nil {
		v := *value
		if v == nil {
			v = []byte{} // a nil []byte is sent as NULL
		}
		c.values = append(c.values, v)
	}
	c.bytes += n
}

// bucket is one collection seen from a transaction.
type bucket struct {
	tx   *btx
	coll string
}

// Prefetch implements ledger.Prefetcher (see btx.Prefetch).
func (bk *bucket) Prefetch(keys ...[]byte) { bk.tx.Prefetch(bk.coll, keys...) }

func (bk *bucket) Get(key []byte) []byte {
	t := bk.tx
	if v, ok := t.pending[bk.coll][string(key)]; ok {
		if v == nil {
			return nil
		}
		return *v
	}
	if t.err != nil {
		return nil
	}
	if t.isAhead(bk.coll, key) && t.exchange(&pgx.Batch{}) != nil { // read with the others asked for
		return nil
	}
	if r, ok := t.cache[bk.coll][string(key)]; ok {
		if !r.present {
			return nil
		}
		return r.v
	}
	// The key's lock, then its value, in one round trip: under READ
	// COMMITTED the SELECT's snapshot is taken once the locks are
	// granted, so it sees every transaction that held them before.
	var v []byte
	found := false
	batch := &pgx.Batch{}
	t.queueLocks(batch, bk.coll, [][]byte{key}, false)
	batch.Queue("SELECT value FROM idemgate_kv WHERE collection = $1 AND key = $2", bk.coll, key).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			found = true
			if err := rows.Scan(&v); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	err := t.exchange(batch)
	if err == nil && !found {
		err = pgx.ErrNoRows
	}
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.fail(err)
		return nil
	}
	if err != nil { // no such row
		t.remember(bk.coll, string(key), nil)
		return nil
	}
	if v == nil {
		v = []byte{}
	}
	t.remember(bk.coll, string(key), &v)
	return v
}

func (bk *bucket) Put(key, value []byte) error {
	t := bk.tx
	if !t.writable {
		return errViewWrite
	}
	if len(key) == 0 {
		return errors.New("postgres: empty key")
	}
	if t.err != nil {
		return connError(t.err)
	}
	v := bytes.Clone(value)
	if v == nil {
		v = []byte{}
	}
	t.set(bk.coll, string(key), &v)
	return nil
}

func (bk *bucket) Delete(key []byte) error {
	t := bk.tx
	if !t.writable {
		return errViewWrite
	}
	if t.err != nil {
		return connError(t.err)
	}
	t.set(bk.coll, string(key), nil)
	return nil
}

func (t *btx) set(coll, key string, v *[]byte) {
	if t.pending == nil {
		t.pending = map[string]map[string]*[]byte{}
	}
	m := t.pending[coll]
	if m == nil {
		m = map[string]*[]byte{}
		t.pending[coll] = m
	}
	m[key] = v
}

func (bk *bucket) Cursor() ledger.Cursor { return &cursor{bk: bk} }

// A cursor's first query fetches firstPage rows, each next one twice as
// many up to cursorPage: most walks stop after a row or two (the audit
// chain's head, a key's few index entries), and long ones soon fetch full
// pages.
const (
	firstPage  = 4
	cursorPage = 64
)

type kv struct{ k, v []byte }

// cursor walks a collection a page at a time; rows is the current page in
// ascending order and i the position in it (-1: not positioned).
type cursor struct {
	bk   *bucket
	rows []kv
	i    int
	page int // rows the next query fetches (0: firstPage)
}

// fetch loads the page after (op ">" / ">=") or before ("<") key, and
// returns whether it found a row.
func (c *cursor) fetch(op string, key []byte, last bool) bool {
	t := c.bk.tx
	c.rows, c.i = nil, -1
	if t.err != nil {
		return false
	}
	// The collection's lock, the pending writes to it and the page, in
	// one round trip.
	batch := &pgx.Batch{}
	t.queueCollectionLock(batch, c.bk.coll)
	t.queueFlush(batch, c.bk.coll)
	q := "SELECT key, value FROM idemgate_kv WHERE collection = $1"
	args := []any{c.bk.coll}
	if key != nil {
		q += " AND key " + op + " $2"
		args = append(args, key)
	}
	desc := op == "<" || last
	// The order names both columns of the primary key, so the plan is an
	// index scan even before the table's statistics exist.
	if desc {
		q += " ORDER BY collection DESC, key DESC"
	} else {
		q += " ORDER BY collection, key"
	}
	if c.page == 0 {
		c.page = firstPage
	}
	q += fmt.Sprintf(" LIMIT %d", c.page)
	c.page = min(2*c.page, cursorPage)
	batch.Queue(q, args...).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var r kv
			if err := rows.Scan(&r.k, &r.v); err != nil {
				return err
			}
			if r.v == nil {
				r.v = []byte{}
			}
			c.rows = append(c.rows, r)
		}
		return rows.Err()
	})
	if err := t.exchange(batch); err != nil {
		c.rows = nil
		return false
	}
	if last && key == nil { // the collection's last row, from now on known
		if t.tails == nil {
			t.tails = map[string]tail{}
		}
		if len(c.rows) == 0 {
			t.tails[c.bk.coll] = tail{}
		} else {
			r := c.rows[len(c.rows)-1]
			if desc {
				r = c.rows[0]
			}
			t.tails[c.bk.coll] = tail{k: r.k, v: r.v}
		}
	}
	if len(c.rows) == 0 {
		return false
	}
	if desc {
		for i, j := 0, len(c.rows)-1; i < j; i, j = i+1, j-1 {
			c.rows[i], c.rows[j] = c.rows[j], c.rows[i]
		}
		c.i = len(c.rows) - 1
	} else {
		c.i = 0
	}
	return true
}

func (c *cursor) at() ([]byte, []byte) {
	if c.i < 0 || c.i >= len(c.rows) {
		c.i = -1
		return nil, nil
	}
	r := c.rows[c.i]
	return r.k, r.v
}

func (c *cursor) First() ([]byte, []byte) {
	c.fetch(">=", nil, false)
	return c.at()
}

func (c *cursor) Last() ([]byte, []byte) {
	if !c.lastKnown() {
		c.fetch("", nil, true)
	}
	return c.at()
}

// lastKnown positions c at the collection's last row without a query when
// the transaction knows it: the greater of the database's last row (tails)
// and the greatest key written here and not yet sent. It reports false
// when that cannot be told (the tail unknown, or deleted here).
func (c *cursor) lastKnown() bool {
	t := c.bk.tx
	tl, known := t.tails[c.bk.coll]
	if t.err != nil || !known {
		return false
	}
	var best string
	var bestV *[]byte
	for k, v := range t.pending[c.bk.coll] {
		if v != nil && (bestV == nil || k > best) {
			best, bestV = k, v
		}
	}
	c.rows, c.i = nil, -1
	switch {
	case bestV != nil && (tl.k == nil || best >= string(tl.k)):
		c.rows, c.i = []kv{{k: []byte(best), v: *bestV}}, 0
	case tl.k != nil:
		if v, ok := t.pending[c.bk.coll][string(tl.k)]; ok && v == nil {
			return false // deleted here: the row before it is not known
		}
		c.rows, c.i = []kv{{k: tl.k, v: tl.v}}, 0
	}
	return true
}

func (c *cursor) Seek(seek []byte) ([]byte, []byte) {
	c.fetch(">=", seek, false)
	return c.at()
}

func (c *cursor) Next() ([]byte, []byte) {
	if c.i < 0 {
		return nil, nil
	}
	if c.i+1 < len(c.rows) {
		c.i++
		return c.at()
	}
	cur := c.rows[c.i].k
	c.fetch(">", cur, false)
	return c.at()
}

func (c *cursor) Prev() ([]byte, []byte) {
	if c.i < 0 {
		return nil, nil
	}
	if c.i > 0 {
		c.i--
		return c.at()
	}
	cur := c.rows[c.i].k
	c.fetch("<", cur, false)
	return c.at()
}
