package ledger

import (
	"bytes"
	"context"
	"time"
)

// Backend is the storage a ledger runs on: named, ordered key-value
// collections read and written in transactions. The ledger's rules
// (claim, decide, settle, fencing, leases, retention, the audit chain) are
// written once, in this package, over it; a backend only stores bytes.
// See the package documentation ("Backends") for what a backend must
// guarantee, and ledgertest.Run for the suite every backend must pass.
type Backend interface {
	// Update runs fn in a read-write transaction and commits it when fn
	// returns nil; when fn returns an error or panics, none of its writes
	// happen (the panic is raised again in the caller). Update transactions
	// are serializable: each sees the effects of every Update committed
	// before it and none of a concurrent one. A backend may run several
	// callers' functions in one physical transaction (group commit) and
	// may then run fn again, alone, when another member failed: fn must
	// reset whatever it reports at its start. When Update returns nil the
	// writes are durable.
	//
	// A ctx marked by Background carries background work (the retention
	// sweep): a backend that commits callers' functions together runs it
	// in a transaction of its own, after every other function already
	// waiting, so that a claim never waits for more than the one
	// background transaction in progress. A backend without group commit
	// may ignore the mark.
	Update(ctx context.Context, fn func(BTx) error) error
	// View runs fn in a read-only transaction that sees one consistent
	// state: every Update committed before it began, nothing of a later
	// or concurrent one. fn must not write.
	View(ctx context.Context, fn func(BTx) error) error
	// ReadOnly reports whether every Update fails (a backend opened for
	// reading only). The ledger then drops the audit entries of reads
	// instead of buffering them.
	ReadOnly() bool
	// Close releases the backend. The ledger calls it once, last; after
	// it, Update and View return ErrClosed.
	Close() error
}

type backgroundKey struct{}

// Background returns ctx marked as carrying background work (see
// Backend.Update).
func Background(ctx context.Context) context.Context {
	return context.WithValue(ctx, backgroundKey{}, true)
}

// IsBackground reports whether ctx was marked by Background.
func IsBackground(ctx context.Context) bool {
	b, _ := ctx.Value(backgroundKey{}).(bool)
	return b
}

// Concurrent is a Backend whose Update transactions run in parallel
// (PostgreSQL: each one serializable on its own, none waiting for another
// unless they touch the same keys). On such a backend the ledger keeps no
// key that every write transaction must write: a transition's audit
// entries go to a journal (audit_journal) under keys of their own, and the
// ledger's sealer chains them into the audit log in order, in
// transactions of its own (see sealJournal). A backend whose Updates run
// one at a time (bbolt, one writer) is not Concurrent: the entries are
// chained in the transaction that wrote them.
type Concurrent interface {
	Concurrent() bool
}

// Prefetcher is a Bucket (of the ledger's collections or of a data
// collection) whose transaction reads several keys in one exchange with
// its store (PostgreSQL: one round trip). Prefetch says the transaction
// will read keys of the bucket soon; their reads go with its next
// exchange. It is a hint and changes nothing else: a read returns what it
// would have, and the keys are locked as their reads would lock them. A
// bucket that reads from memory (bbolt) does not implement it.
type Prefetcher interface {
	Prefetch(keys ...[]byte)
}

// prefetch passes keys of collection to its bucket's Prefetch, if it has
// one.
func prefetch(tx BTx, collection []byte, keys ...[]byte) {
	if p, ok := tx.Bucket(collection).(Prefetcher); ok {
		p.Prefetch(keys...)
	}
}

// PointReader is a Backend that reads one key's latest committed value in
// one exchange with its store, outside any transaction (PostgreSQL: one
// statement, with no BEGIN and no ROLLBACK). The value is one a View
// begun at that moment would read. The claim's first look at its record
// (a replay, most often) reads it so; without it, in a View.
type PointReader interface {
	// ReadCommitted returns the value of key in collection, nil when
	// there is none. The caller may keep it.
	ReadCommitted(ctx context.Context, collection string, key []byte) ([]byte, error)
}

// Clock is a Backend that supplies the ledger's clock. When a backend
// implements it and Options.Now is not set, the ledger reads every time it
// uses (claims, leases, expiries, approval TTLs, retention, audit
// timestamps) from Now instead of the process's wall clock: a backend
// shared by several machines (PostgreSQL) gives them the database's clock,
// so their own clocks' drift does not move a lease or a TTL. Options.Now,
// when set (tests), wins. The bbolt backend does not implement it.
type Clock interface {
	Now() time.Time
}

// BTx is one backend transaction. Its values are valid only until the
// transaction ends.
type BTx interface {
	// Bucket returns the ledger collection name (one of Collections), or
	// nil when it does not exist (only an old file opened read-only may
	// lack a collection; a writable backend creates them all).
	Bucket(name []byte) Bucket
	// Data returns the downstream collection name (the collections the
	// embedded order store and the outbox write through Tx), creating it
	// when create is true; without create it returns nil for a collection
	// never written.
	Data(name string, create bool) (Bucket, error)
}

// Bucket is an ordered collection of keys and values. Keys are non-empty
// byte strings ordered bytewise. Get returns nil for a missing key and a
// non-nil slice (possibly empty) for a present one. Put and Delete fail in
// a View. The ledger does not change a slice after passing it to Put, so
// a backend may keep it until the transaction ends (as bbolt does); one
// that keeps it longer must copy it.
type Bucket interface {
	Get(key []byte) []byte
	Put(key, value []byte) error
	Delete(key []byte) error
	// Cursor walks the keys in order. The ledger never writes to a
	// bucket while it walks that bucket (it collects, then writes); it
	// may write to other buckets during a walk.
	Cursor() Cursor
}

// Cursor is a position in a Bucket. Every method returns the key and value
// it moved to, or nil, nil past either end.
type Cursor interface {
	First() (key, value []byte)
	Last() (key, value []byte)
	// Seek moves to the first key >= seek.
	Seek(seek []byte) (key, value []byte)
	Next() (key, value []byte)
	Prev() (key, value []byte)
}

// The ledger's collections and meta keys, with their key layout: all of
// them are here. A backend creates every collection (Bucket never returns
// nil for a writable backend); their contents are the ledger's business.
var (
	bucketMeta       = []byte("meta")              // audit_indexed, clock_high_water, clock_trusted (and the backend's own keys)
	bucketRecords    = []byte("records")           // tenant \x00 key → Record JSON
	bucketByTime     = []byte("by_time")           // first_seen (8 bytes BE ns) tenant \x00 key → ""
	bucketExpiry     = []byte("expiry")            // due (8 bytes BE ns) action tenant \x00 key → action
	bucketFPIndex    = []byte("fp_index")          // tenant \x00 fingerprint → fpEntry JSON (latest executed key)
	bucketIssued     = []byte("issued")            // tenant \x00 key → issued_at (8 bytes BE ns)
	bucketAudit      = []byte("audit")             // seq (8 bytes BE) → AuditEntry JSON
	bucketApprovals  = []byte("approvals")         // tenant \x00 approval_id → key
	bucketPending    = []byte("pending_approvals") // tenant \x00 approval_id → key, while pending
	bucketOpen       = []byte("open")              // state \x00 tenant \x00 key → "" for in_progress, unknown, retryable
	bucketJournal    = []byte("audit_journal")     // transaction order (8 bytes BE, see JournalCollection) index (4 bytes BE) → AuditEntry JSON, not chained yet (Concurrent backends; see sealJournal)
	bucketWatched    = []byte("watched")           // record topic (see recordTopic) → "": a waiter in some process waits for that in-progress record to change (Notifier backends only; see Ledger.GetWatched)
	bucketAuditByKey = []byte("audit_by_key")      // tenant \x00 key \x00 seq (8 bytes BE) → "": the entries of a key its record does not number or lead to (see Record.AuditSeqs, auditNear); → seqs (8 bytes BE each): the transitions a deleted record numbered, seq the newest (keepRecordAuditLocked)
	keyAuditIndexed  = []byte("audit_indexed")     // meta: seq (8 bytes BE) through which every audit entry is in audit_by_key, numbered by its record, or near a transition it numbers
	keyClockHigh     = []byte("clock_high_water")  // meta: 8 bytes BE unix ns, the latest wall time a write recorded (see ledgerTime)
	keyClockTrusted  = []byte("clock_trusted")     // meta: 8 bytes BE unix ns, the ledger's trusted time
)

// WriteMetaKeys are the meta keys every write transaction reads: the
// ledger's clocks (see ledgerTime). A backend may read them with its first
// round trip. Their values are 8-byte big-endian times that only grow: a
// backend whose Updates run concurrently may read them without a lock and
// keep the greater of the stored and the written value (a writer that
// read an older time never moves them back).
func WriteMetaKeys() [][]byte { return [][]byte{keyClockHigh, keyClockTrusted} }

// SweptCollections are the ledger's time-ordered indexes (by_time,
// expiry). An Update walks them only in the background sweeps, which
// read, and so lock, each record an entry names and check it again before
// acting on it; writers only add and remove entries of their own keys. A
// backend that locks the keys a transaction touches need not lock the
// ranges walked in these collections: a claim that adds an entry behind a
// sweep's cursor does not wait for the sweep.
func SweptCollections() []string { return []string{string(bucketByTime), string(bucketExpiry)} }

// ClockKey reports whether key, of the meta collection, is one of the
// ledger's clocks (see WriteMetaKeys).
func ClockKey(key []byte) bool {
	return bytes.Equal(key, keyClockHigh) || bytes.Equal(key, keyClockTrusted)
}

// Collection names, for backends: every name Bucket is called with.
var (
	// MetaCollection is the collection a backend may keep its own keys in
	// (schema version, identity), beside the ledger's clocks.
	MetaCollection = string(bucketMeta)
	// AuditCollection and RecordsCollection are the audit log and the
	// records, for a backend's own consistency check.
	AuditCollection   = string(bucketAudit)
	RecordsCollection = string(bucketRecords)
	// AuditByKeyCollection is the per-key audit index.
	AuditByKeyCollection = string(bucketAuditByKey)
	// JournalCollection is the audit journal of a Concurrent backend: a
	// key is 8 bytes of the writing transaction's order, then 4 of the
	// entry's index in it; it is written once, and read and deleted only
	// by the sealer, once its transaction has committed, so a backend
	// need not lock its keys. The sealer chains entries in key order, so
	// the entries of one key must be chained in the order of its
	// transitions: when a transaction reads what another wrote, its order
	// must be the greater. The ledger writes its own count of its
	// transactions there, which is such an order only for a backend used
	// by one process; a Concurrent backend shared by several processes
	// replaces those 8 bytes, when it writes the keys, with an order it
	// takes at commit, after the transaction's last lock (PostgreSQL: a
	// sequence).
	JournalCollection = string(bucketJournal)
	// WatchedCollection holds the records a waiter waits on, by topic (see
	// Notifier): a NotifyTx sends the notice of a topic only while its key
	// is there, and deletes the key as it sends it.
	WatchedCollection = string(bucketWatched)
)

// Collections lists every collection of the ledger.
func Collections() []string {
	var out []string
	for _, b := range [][]byte{bucketMeta, bucketRecords, bucketByTime, bucketExpiry, bucketFPIndex, bucketIssued, bucketAudit, bucketApprovals, bucketPending, bucketOpen, bucketAuditByKey, bucketJournal, bucketWatched} {
		out = append(out, string(b))
	}
	return out
}

// Upgrade brings a writable backend's collections up to this build at
// open: it indexes audit entries written by a build without the per-key
// audit index. Backends call it in an Update when they open.
func Upgrade(tx BTx) error {
	if k, _ := tx.Bucket(bucketAudit).Cursor().Last(); len(k) == 8 {
		return indexAudit(tx, beUint64(k))
	}
	return nil
}

// AuditUnindexed reports whether audit entries past the per-key index's
// watermark exist (Upgrade would index them).
func AuditUnindexed(tx BTx) bool {
	b := tx.Bucket(bucketAudit)
	if b == nil || tx.Bucket(bucketMeta) == nil {
		return false
	}
	k, _ := b.Cursor().Last()
	return len(k) == 8 && beUint64(k) > auditIndexed(tx)
}
