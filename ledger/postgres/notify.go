package postgres

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"idemgate/ledger"
)

// Change notices between replicas (ledger.Notifier). A write
// transaction that changes records a waiter watches
// (ledger.WatchedCollection) sends one NOTIFY per such record on
// notifyChannel, and deletes their marks, in one statement of the batch
// before its COMMIT, after the locks of its writes: PostgreSQL delivers
// them at commit, and only if it commits. A transaction that sends none
// takes no part in the lock every notifying commit takes on the whole
// database's notification queue. Each process keeps one listening
// connection (not one per waiter), opened when its ledger first has a
// watcher, and fans each notice out to its watchers. When that
// connection is lost it is opened again, and since notices sent
// meanwhile are lost with it, every watcher is woken to re-read its
// record; the ledger's one-second safety poll covers a connection that
// is gone without an error yet.

// notifyChannel is the LISTEN/NOTIFY channel of record changes.
const notifyChannel = "idemgate_changed"

// notifyAll is the notice that wakes every watcher: sent instead of one
// notice per record by a transaction that changed more than
// maxNotices records (a sweep), to keep the server's notification queue
// small.
const (
	notifyAll  = "*"
	maxNotices = 256
)

// listenCheck is how long the listener waits for a notice before it
// checks that its connection is alive.
const listenCheck = 30 * time.Second

var (
	_ ledger.Notifier = (*backend)(nil)
	_ ledger.NotifyTx = (*btx)(nil)
)

// listener is a backend's listening connection's state.
type listener struct {
	once   sync.Once
	cancel context.CancelFunc
	done   chan struct{}
	// connects counts successful LISTENs (tests: a reconnect is one more).
	connects atomic.Int64
	mu       sync.Mutex
	conn     *pgx.Conn // the current connection, for tests that cut it
}

// Notify implements ledger.NotifyTx: the topics are sent with the
// transaction's last batch, before COMMIT.
func (t *btx) Notify(topics []string) {
	if !t.writable {
		return
	}
	t.notices = append(t.notices, topics...)
}

// queueNotices adds the transaction's notices to its final batch: of its
// topics, those watched are unmarked and notified. The marks are deleted
// without their keys' locks: a waiter writes one only while it holds the
// lock of the record it names, which this transaction holds exclusively
// (it wrote the record) before this statement runs.
func (t *btx) queueNotices(batch *pgx.Batch) {
	if len(t.notices) == 0 {
		return
	}
	keys := make([][]byte, len(t.notices))
	for i, n := range t.notices {
		keys[i] = []byte(n)
	}
	const unmark = "WITH w AS (DELETE FROM idemgate_kv WHERE collection = $2 AND key = ANY($3::bytea[]) RETURNING key) "
	if len(t.notices) > maxNotices {
		batch.Queue(unmark+"SELECT pg_notify($1, $4) WHERE EXISTS (SELECT FROM w)", notifyChannel, ledger.WatchedCollection, keys, notifyAll)
		return
	}
	batch.Queue(unmark+"SELECT pg_notify($1, convert_from(key, 'UTF8')) FROM w", notifyChannel, ledger.WatchedCollection, keys)
}

// Listen implements ledger.Notifier: it starts the listening connection
// (once; later calls do nothing). A read-only backend never writes, so it
// never waits, and does not listen.
func (b *backend) Listen(fn func(topic string)) {
	if b.readOnly || b.isClosed() {
		return
	}
	l := &b.listen
	l.once.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		l.cancel, l.done = cancel, make(chan struct{})
		go b.listenLoop(ctx, fn)
	})
}

// stopListening stops the listening connection and waits for it to
// close; Close calls it.
func (b *backend) stopListening() {
	l := &b.listen
	l.once.Do(func() {}) // no listener may start after this
	if l.cancel != nil {
		l.cancel()
		<-l.done
	}
}

// listenLoop keeps one connection listening on notifyChannel and passes
// each notice to fn, until ctx is done (Close); it returns then.
func (b *backend) listenLoop(ctx context.Context, fn func(topic string)) {
	defer close(b.listen.done)
	wait := 20 * time.Millisecond
	for ctx.Err() == nil {
		err := b.listenOnce(ctx, fn)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// Whatever was sent while no connection listened is lost:
			// listenOnce wakes everyone when it listens again.
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, time.Second)
			continue
		}
		wait = 20 * time.Millisecond
	}
}

// listenOnce connects, listens and delivers notices until the connection
// fails (or ctx is done).
func (b *backend) listenOnce(ctx context.Context, fn func(topic string)) error {
	connect, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(connect, b.pool.Config().ConnConfig.Copy())
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		// Bounded: a server that is gone must not hold up Close.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		conn.Close(cctx)
		cancel()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return err
	}
	b.listen.mu.Lock()
	b.listen.conn = conn
	b.listen.mu.Unlock()
	defer func() {
		b.listen.mu.Lock()
		b.listen.conn = nil
		b.listen.mu.Unlock()
	}()
	b.listen.connects.Add(1)
	fn("") // notices may have been sent before this connection listened
	for {
		wctx, cancel := context.WithTimeout(ctx, listenCheck)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			if n.Payload == notifyAll {
				fn("")
			} else {
				fn(n.Payload)
			}
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded) && !conn.IsClosed():
			// Quiet for a while: make sure the connection still works.
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				return err
			}
		default:
			return err
		}
	}
}
