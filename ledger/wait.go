package ledger

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"
)

// Waking waiters. A duplicate call waits for a running operation to
// finish (tools' wait for an in_progress record). Rather than re-reading
// the record on a short timer, it watches the record: every write
// transaction that changes a record wakes, once it has committed, the
// watchers of that record in this process; and on a backend shared by
// processes that implements Notifier (PostgreSQL: LISTEN/NOTIFY), the
// watchers in every other process too, when the record is marked watched
// (GetWatched). A waiter re-reads the record when woken, and also on a
// slow safety poll (WaitPoll), which covers what a notice cannot: a
// change made by another process over a backend that does not carry
// notices, or a notice lost without the backend noticing.
//
// Why notices only for watched records: on PostgreSQL every transaction
// that sent a NOTIFY takes one database-wide lock as it commits, held
// until its commit is durable, so notifying every change would make every
// create of every replica commit one at a time. A waiter is rare (a
// duplicate of a running call), so it pays instead: a write transaction
// that reads the record, under the record's lock, and marks it watched
// while it is in progress. The commit that changes the record holds the
// record's lock when it looks for the mark, so of the two one comes
// first: either the mark is there and the notice is sent, or the waiter's
// read sees the change.

// Notifier is a Backend shared by several processes that tells each of
// them about the changes the others commit. Its transactions implement
// NotifyTx.
type Notifier interface {
	// Listen starts delivering notices: fn is called with each topic
	// passed to NotifyTx.Notify by a transaction that committed, in any
	// process on the backend (this one included), and with "" whenever
	// notices may have been missed — on (re)connecting to the other
	// processes — so every watcher re-checks. fn must not block. The
	// ledger calls Listen at most once, when the first watcher appears;
	// the backend stops calling fn when it is closed.
	Listen(fn func(topic string))
}

// NotifyTx is a BTx of a Notifier. Notify queues notices that are sent
// when, and only if, the transaction commits (PostgreSQL's NOTIFY is
// delivered at COMMIT), each only if its topic is a key of
// WatchedCollection when the transaction has taken the locks of its
// writes; it deletes the keys of the topics it sends. A topic is at most
// 64 bytes of [0-9a-f].
type NotifyTx interface {
	Notify(topics []string)
}

// Waiting's safety polls: how often a watcher re-reads the record
// without having been woken. With a Notifier a notice reaches every
// process, so the poll is only a fallback; without one, another process's
// change is seen only by polling, so the poll stays short.
const (
	waitPollNotified = time.Second
	waitPollLocal    = 20 * time.Millisecond
)

// recordTopic names the changes of the record (tenant, key) in notices:
// a hash, so a notice carries no tenant or key and fits any channel.
func recordTopic(tenant, key string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + key))
	return hex.EncodeToString(sum[:12])
}

// watchers is the process's table of watched records.
type watchers struct {
	mu        sync.Mutex
	byTopic   map[string]map[*watch]struct{}
	listening sync.Once
}

type watch struct {
	ch   chan struct{}
	once sync.Once
}

func (w *watch) fire() { w.once.Do(func() { close(w.ch) }) }

// Watch returns a channel that is closed once the record of (tenant, key)
// may have changed after the call: a write transaction that changed it
// has committed (in this process, or in another over a Notifier backend),
// or notices may have been lost. To wait for a change without missing
// one, call Watch first, then read the record, and wait on the channel
// only if what was read is not what is waited for; after a wake-up, Watch
// again before reading again. stop releases the watch (call it when done;
// it is safe to call twice). The channel fires once: each Watch sees at
// most one wake-up.
func (s *Ledger) Watch(tenant, key string) (changed <-chan struct{}, stop func()) {
	if n, ok := s.b.(Notifier); ok {
		s.watch.listening.Do(func() { n.Listen(s.wake) })
	}
	topic := recordTopic(tenant, key)
	w := &watch{ch: make(chan struct{})}
	s.watch.mu.Lock()
	if s.watch.byTopic == nil {
		s.watch.byTopic = map[string]map[*watch]struct{}{}
	}
	set := s.watch.byTopic[topic]
	if set == nil {
		set = map[*watch]struct{}{}
		s.watch.byTopic[topic] = set
	}
	set[w] = struct{}{}
	s.watch.mu.Unlock()
	return w.ch, func() {
		s.watch.mu.Lock()
		if set := s.watch.byTopic[topic]; set != nil {
			delete(set, w)
			if len(set) == 0 {
				delete(s.watch.byTopic, topic)
			}
		}
		s.watch.mu.Unlock()
	}
}

// GetWatched is Get for a watcher about to wait for the record to leave
// in_progress (call Watch first, as before Get). On a Notifier backend it
// reads the record in a write transaction and, while the record is in
// progress, marks it watched there, so that the commit that changes it,
// in any process, sends a notice (see above). The notice removes the
// mark: a watcher still waiting after its wake-up marks it again with its
// next GetWatched. On other backends it is Get.
func (s *Ledger) GetWatched(ctx context.Context, tenant, key string) (*Record, error) {
	if _, ok := s.b.(Notifier); !ok || s.readOnly {
		return s.Get(ctx, tenant, key)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rec *Record
	err := s.updateIn(ctx, func(tx *ltx) error {
		r, err := getRecord(tx, tenant, key)
		if err != nil || r == nil {
			return cmp.Or(err, ErrNotFound)
		}
		rec = s.present(r)
		if rec.State != StateInProgress {
			return nil
		}
		return tx.Bucket(bucketWatched).Put([]byte(recordTopic(tenant, key)), []byte{})
	})
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// WaitPoll is how often a watcher should re-read the record even when
// not woken: one second when the backend carries notices between
// processes (a fallback only), 20 ms when it does not (another process's
// change is seen only by reading).
func (s *Ledger) WaitPoll() time.Duration {
	if _, ok := s.b.(Notifier); ok {
		return waitPollNotified
	}
	return waitPollLocal
}

// wake fires the watchers of topic ("": every watcher).
func (s *Ledger) wake(topic string) {
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	if topic == "" {
		for t, set := range s.watch.byTopic {
			for w := range set {
				w.fire()
			}
			delete(s.watch.byTopic, t)
		}
		return
	}
	for w := range s.watch.byTopic[topic] {
		w.fire()
	}
	delete(s.watch.byTopic, topic)
}

// wakeAll wakes the watchers of the topics a transaction changed, after
// it committed.
func (s *Ledger) wakeAll(topics []string) {
	if len(topics) == 0 {
		return
	}
	s.watch.mu.Lock()
	none := len(s.watch.byTopic) == 0
	s.watch.mu.Unlock()
	if none {
		return
	}
	for _, t := range topics {
		s.wake(t)
	}
}

// changed notes that tx wrote the record (tenant, key): its watchers are
// woken when tx commits.
func (tx *ltx) changed(tenant, key string) {
	t := recordTopic(tenant, key)
	if tx.topicSet == nil {
		tx.topicSet = map[string]bool{}
	}
	if !tx.topicSet[t] {
		tx.topicSet[t] = true
		tx.topics = append(tx.topics, t)
	}
}

// Watcher is a Store whose records can be watched ([Ledger] is one); a
// waiter that has a Store which is not one polls.
type Watcher interface {
	Watch(tenant, key string) (changed <-chan struct{}, stop func())
	GetWatched(ctx context.Context, tenant, key string) (*Record, error)
	WaitPoll() time.Duration
}

var _ Watcher = (*Ledger)(nil)
