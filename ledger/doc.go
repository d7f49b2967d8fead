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
// SHA-256 hash chain that [VerifyAudit] checks.
package ledger
