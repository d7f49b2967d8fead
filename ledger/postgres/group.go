package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"idemgate/ledger"
)

// Group commit. Every write transaction takes the one writer lock, so a
// replica's concurrent Updates would queue on the database one behind the
// other, each paying BEGIN, the lock, its batch of writes, COMMIT and the
// COMMIT's WAL flush. Instead, the Updates of one process queue here: the
// first caller to find no transaction running leads, takes up to
// maxBatch queued callers, and runs their functions one after the other
// in ONE physical transaction (one lock, one marker row, one COMMIT); when
// it ends it hands the lead to the next waiter, so no caller waits for
// more than one transaction beyond its own. Each function sees the writes
// of the ones before it (they share the transaction), and their audit
// entries are chained in the order they ran.
//
// Every guarantee of a lone Update holds for the batch as a whole: one
// marker row is read back when COMMIT fails (committed: every member
// succeeded; not committed: the batch is run again), a transient failure
// before COMMIT runs the whole batch again, and a member whose function
// returns an error or panics rolls the batch back, after which every
// member is run again alone (the contract allows it: a function must reset
// what it reports at its start), so a refused member leaves no write and
// the others are not held hostage by it.

// maxBatch bounds the functions run in one transaction.
const maxBatch = 128

type gcJob struct {
	ctx      context.Context
	fn       func(ledger.BTx) error
	err      error
	panicked any
	wake     chan bool // false: done; true: lead the next batch
}

// run calls j.fn in tx, turning a panic into an error so the batch is
// rolled back and the lead handed over; Update raises it again in j's
// caller.
func (j *gcJob) run(tx ledger.BTx) (err error) {
	j.panicked = nil // a re-run alone may succeed where the batch panicked
	defer func() {
		if r := recover(); r != nil {
			j.panicked = r
			err = fmt.Errorf("postgres: panic in transaction: %v", r)
		}
	}()
	return j.fn(tx)
}

// errMemberFailed marks a batch rolled back because one of its functions
// failed; the functions are then run alone.
var errMemberFailed = errors.New("postgres: a function of the batch failed")

// Update implements ledger.Backend (see the package documentation and the
// group commit above). A transaction that failed before COMMIT was sent
// for a transient reason (the connection lost, the server restarting, a
// serialization failure or deadlock) did not commit, and is run again (fn
// with it, as the interface allows) for up to retryFor; a failure of
// COMMIT itself is read back, never guessed at.
func (b *backend) Update(ctx context.Context, fn func(ledger.BTx) error) error {
	if b.isClosed() {
		return ledger.ErrClosed
	}
	if b.readOnly {
		return ErrReadOnly
	}
	j := &gcJob{ctx: ctx, fn: fn, wake: make(chan bool, 1)}
	b.gcMu.Lock()
	b.gcQueue = append(b.gcQueue, j)
	if b.gcRunning {
		b.gcMu.Unlock()
		if lead := <-j.wake; !lead {
			if j.panicked != nil {
				panic(j.panicked)
			}
			return j.err
		}
		b.gcMu.Lock()
	} else {
		b.gcRunning = true
	}
	n := min(len(b.gcQueue), maxBatch)
	batch := b.gcQueue[:n:n]
	b.gcQueue = append([]*gcJob(nil), b.gcQueue[n:]...)
	b.gcMu.Unlock()

	b.commitBatch(batch)

	for _, o := range batch[1:] { // batch[0] is j
		o.wake <- false
	}
	b.gcMu.Lock()
	// The writer's connection goes with the lead while writers queue; it
	// goes back to the pool when none does (or for Close, or when the
	// pool is too small to keep one aside: the reads would wait for it).
	var idle *pgxpool.Conn
	if len(b.gcQueue) == 0 || !b.keepWriter || b.isClosed() {
		idle, b.wconn = b.wconn, nil
	}
	if len(b.gcQueue) > 0 {
		b.gcQueue[0].wake <- true
	} else {
		b.gcRunning = false
	}
	b.gcMu.Unlock()
	if idle != nil {
		idle.Release()
	}
	if j.panicked != nil {
		panic(j.panicked)
	}
	return j.err
}

// commitBatch runs the batch's functions in one transaction, retried as
// Update says, and sets each member's err. A member whose context is done
// before the batch starts is answered with its context's error and left
// out. A batch of several runs under its first member's context without
// its cancellation (one caller giving up must not cut the others'
// transaction); the ledger passes no deadline anyway.
func (b *backend) commitBatch(batch []*gcJob) {
	live := batch[:0:0]
	for _, j := range batch {
		if err := j.ctx.Err(); err != nil {
			j.err = err
			continue
		}
		live = append(live, j)
	}
	if len(live) == 0 {
		return
	}
	ctx := live[0].ctx
	if len(live) > 1 {
		ctx = context.WithoutCancel(ctx)
	}
	err := b.retry(ctx, func() (bool, error) { return b.update(ctx, live) })
	switch {
	case err == nil:
		b.noteBatch(len(live))
		return
	case !errors.Is(err, errMemberFailed):
		for _, j := range live {
			j.err = err
		}
		return
	case len(live) == 1:
		return // j.err holds fn's own error
	}
	for _, j := range live {
		one := []*gcJob{j}
		if err := b.retry(j.ctx, func() (bool, error) { return b.update(j.ctx, one) }); err != nil && !errors.Is(err, errMemberFailed) {
			j.err = err
		}
		if j.err == nil {
			b.noteBatch(1)
		}
	}
}

// noteBatch counts a committed transaction of n functions.
func (b *backend) noteBatch(n int) {
	b.mu.Lock()
	b.txCommitted++
	b.fnCommitted += int64(n)
	b.mu.Unlock()
}

// GroupCommitStats reports how many physical write transactions this
// process committed and how many Update functions they carried (their
// ratio is the mean batch).
func (d *DB) GroupCommitStats() (transactions, functions int64) {
	d.be.mu.Lock()
	defer d.be.mu.Unlock()
	return d.be.txCommitted, d.be.fnCommitted
}
