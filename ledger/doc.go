// Package ledger is idemgate's execution ledger: the durable record of every
// operation key, the atomic claim that decides whether anything runs, fenced
// completion, leases, retention and the hash-chained audit log.
//
// # States
//
// A record is created by a claim, in one atomic step (one read-write
// transaction; never check-then-insert), for a (tenant, key) pair:
//
//	(none) ─claim─► in_progress ─► succeeded | failed        (final, replayed)
//	                     │
//	                     ├─ lease expired, effect impossible ─► retryable ─claim─► in_progress (attempt+1)
//	                     └─ lease expired, effect possible   ─► unknown   (held; reconcile or resolve)
//	(none) ─claim of a suspected duplicate─► awaiting_approval ─► in_progress | rejected
//
// succeeded, failed and rejected are final: the same key with the same
// fingerprint gets the saved result back and nothing runs. The same key with
// a different fingerprint, or for a different tool, is refused in every
// state, including after retention (the tombstone keeps the fingerprint).
//
// # Execution
//
// Downstreams that live in the ledger's own store (the embedded order store,
// the notification outbox) use [Store.Execute]: the claim, the side effect
// and the final state commit in one transaction, so their outcome can never
// be unknown. External downstreams use [Store.Claim], call out with no
// transaction open, and finish with [Store.Complete], which is fenced by the
// record's generation: a completion from an owner whose lease was taken over
// is refused with [ErrStaleGeneration].
//
// # Retention
//
// A finished record keeps its full result for Options.Retention (default
// 24 h). After that only a tombstone (key, tool, fingerprint, final state,
// summary) is kept until Options.TombstoneRetention (default 30 days), so a
// late replay gets [DecisionExpired], never a second execution. After the
// tombstone is gone the key is free again: idempotency is bounded by these
// two windows, per tenant.
//
// # Audit
//
// Every transition writes its audit entry in the same transaction as the
// transition. Replays and refusals are audited too, but their entries are
// buffered and written with the next write transaction (or by the periodic
// flush), so a replay never waits for an fsync; a crash can lose at most
// the replay and refusal entries of the last flush interval. Entries form a
// SHA-256 hash chain that [Store.VerifyAudit] checks. [Store.PruneAudit]
// removes the oldest entries (after archiving them) and leaves an anchor
// the kept part starts from; [Store.VerifyAuditChain] checks the chain from
// that anchor, or from the archives, and holds the log to the entry
// numbers kept outside it (records, the per-key index), so a cut tail is
// found. A signed AuditCheckpoint of the head, kept outside the ledger,
// proves the head against whoever can rewrite the whole file
// ([Store.CheckAuditCheckpoint]). An entry's Event and Decision are
// typed (AuditEvent, AuditDecision), as are the error codes of outcomes
// (Code): classify entries by them, never by other text.
//
// [Store.AuditForKey] finds a key's entries without reading the log: its
// record numbers its newest transitions (Record.AuditSeqs), the entries
// at most 256 after one of them (the call's answer, early replays) are
// found by reading those 256, and every other entry of the key is in a
// per-key index. A create therefore writes no per-key index entry.
//
// # Backends
//
// Every rule above is written once, in this package ([Ledger]), over a
// [Backend]: named collections of ordered byte keys and values, read and
// written in transactions. A backend stores bytes and knows nothing of
// records, states or audit entries; [New] puts the ledger on one, and the
// backend packages (ledger/bolt: one bbolt file shared by processes) wrap
// that in their Open. A backend must guarantee:
//
//   - Atomicity: an Update whose function returns an error, or panics,
//     leaves no write behind, in any collection; one that returns nil
//     commits every write of the function together. The claim, the
//     downstream's writes (Tx) and the audit entry are one Update, which
//     is what makes a claim exactly-once.
//   - Isolation: Update transactions are serializable — each sees every
//     Update committed before it and nothing of a concurrent one — so a
//     read-check-write in one Update (the claim) is never interleaved
//     with another. A View sees one committed state for its whole
//     duration. Nothing uncommitted is ever visible.
//   - Ordering: keys are ordered bytewise (0xff after every other byte,
//     a prefix before its extensions), and cursors walk them in that order
//     both ways. The ledger's indexes (by time, due expiries, open records,
//     pending approvals, the audit log by sequence number) are only sorted
//     keys, so paging positions are byte strings the backend never
//     interprets. The ledger never writes to a collection while it walks
//     that collection; it may write to others during a walk.
//   - Durability: when Update returns nil, its writes survive a crash of
//     the process and of the machine (the bbolt backend fsyncs; a server
//     backend commits).
//   - Concurrency: Update and View are called from many goroutines at once
//     (and, for a shared store, from many processes); the backend
//     serialises writers as it must. It may commit several callers'
//     functions in one physical transaction (group commit, bbolt) and
//     run a function again alone when another member of its group
//     failed, or run a transaction again after a deadlock (PostgreSQL),
//     so the ledger's functions reset what they report at their start.
//     A backend that runs Updates of different keys in parallel says so
//     (Concurrent): the ledger then journals its audit entries.
//   - Lifecycle: after Close, Update and View return [ErrClosed]. A
//     read-only backend (ReadOnly) fails every Update; the ledger then
//     drops the audit entries of reads instead of buffering them.
//
// A backend shared by processes may also implement [Notifier]: its
// transactions then carry change notices to the other processes, and a
// caller waiting on a record ([Ledger.Watch], then [Ledger.GetWatched],
// which marks the record watched) is woken by another process's commit
// instead of finding it by polling (wait.go). A backend whose every
// exchange crosses a network saves them with [PointReader] (a claim's
// first look at its record, one statement) and buckets that are
// [Prefetcher]s (the keys a claim will read, sent together).
//
// The collections are fixed ([Collections]); a writable backend creates
// them all, and keeps the downstreams' collections ([BTx.Data]) apart from
// them. ledgertest.Run is the contract a new backend must pass (and
// ledgertest.RunBackend checks these guarantees one by one);
// ledger/ledgertest/memory_test.go is a complete toy backend.
package ledger
