package ledger

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"time"
)

// The sweeps: open records, lease expiry, retention and tombstones.

// OpenRecords implements Store.
func (s *Ledger) OpenRecords(ctx context.Context, st State, after string, limit int) ([]*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	var out []*Record
	err := s.view(func(tx *ltx) error {
		c := tx.Bucket(bucketOpen).Cursor()
		prefix := []byte(string(st) + "\x00")
		k, _ := c.Seek(prefix)
		if after != "" {
			start := append(bytes.Clone(prefix), after...)
			if k, _ = c.Seek(start); bytes.Equal(k, start) {
				k, _ = c.Next()
			}
		}
		for ; k != nil && bytes.HasPrefix(k, prefix) && len(out) < limit; k, _ = c.Next() {
			tenant, key, _ := bytes.Cut(k[len(prefix):], []byte{0})
			rec, err := getRecord(tx, string(tenant), string(key))
			if err != nil {
				return err
			}
			if rec != nil {
				out = append(out, rec)
			}
		}
		return nil
	})
	return out, err
}

// ExpireLeases implements Store.
func (s *Ledger) ExpireLeases(ctx context.Context) (int, error) {
	stale, err := s.OpenRecords(ctx, StateInProgress, "", 1000)
	if err != nil {
		return 0, err
	}
	now := s.opts.Now()
	n := 0
	for _, r := range stale {
		if now.Before(r.LeaseExpires) {
			continue
		}
		moved := false
		err := s.update(func(tx *ltx) error {
			moved = false // update may run this twice
			rec, err := getRecord(tx, r.Tenant, r.Key)
			if err != nil || rec == nil {
				return err
			}
			now, high, _, err := s.ledgerTime(tx)
			if err != nil {
				return err
			}
			prev, why := s.opts.expireTransition(rec, now, high)
			if why != AuditLeaseExpired {
				return nil // finished or renewed meanwhile
			}
			moved = true
			return s.saveTransition(tx, Actor{Tenant: rec.Tenant, Principal: "ledger-sweep"}, rec, prev, why, now)
		})
		if err != nil {
			return n, err
		}
		if moved {
			n++
		}
	}
	return n, nil
}

// A sweep works in small transactions so that it never holds the writer
// for long, and marks them Background: a backend with group commit
// commits each alone, after every claim already waiting, and makes the
// next wait as long as the last took when claims waited for it (see
// Backend.Update), so that a claim waits for at most the one sweep
// transaction in progress, and a busy ledger gives the sweep at most half
// of its writer. sweepChunk bounds the due entries one transaction takes,
// sweepBudget the time it spends taking them (it stops early when the
// records are slow to rewrite, a cold page cache), and sweepScan the
// index entries it reads past (tombstones due by the wall clock but not
// yet by the trusted time). The target is a claim never waiting
// more than 20 ms because of a sweep.
//
// Measured on a 2-core machine (BenchmarkSweepClaimWait, 1M due records
// under random keys, 2 callers claiming throughout; the floor is as many
// claims with no sweep): with 50-record, 5 ms transactions shared with the
// claims' batches, a claim's p50 during the sweep was 10.7 ms (1.4 ms
// with no sweep), its p99 23.5 ms and its worst 80 ms (16 ms), and the
// sweep took 196 s. Committed alone and after the waiting claims, p50
// and p99 were 10.7 and 17.2 ms, the worst 74 ms (18 ms): the sweep's
// transactions still followed each other with no gap, so each of a
// claim's two transactions met one. With 20-record, 3 ms transactions
// and the wait after each, p50 2.2 ms (1.2), p99 7.9 ms (2.8), the worst
// 76 ms against 65 ms with no sweep (the machine's disk: one fdatasync);
// the sweep took 377 s while claims were made (it runs at full speed
// when none are).
//
// A compaction reads the compressed record and writes its tombstone
// through EncodeRecord like any record (compress/zlib: some 10 µs of CPU
// more per tombstone than the hand-written compressor of development
// builds before it); a deletion writes one index entry for the record's audit
// entries and reads none (keepRecordAuditLocked). Deleting 100k
// tombstones (BenchmarkSweepDelete, two runs alternated) took 8.8-17.6 s
// against 33.7-47.7 s before that, in half the transactions.
const (
	sweepChunk  = 20
	sweepBudget = 3 * time.Millisecond
	sweepScan   = 20 * sweepChunk
)

// Sweep implements Store. Pending approvals expire, and issued keys are
// forgotten, by the later of the wall clock and the ledger's high-water
// time; records past retention become tombstones by that time too. A
// tombstone is deleted — freeing its key — only once its age is past
// Retention+TombstoneRetention by both the wall clock and the ledger's
// trusted time (see ledgerTime): a clock set forward does not free keys
// early, a clock set back does not either. Each deletion is audited
// (EventDeleted). Index entries are checked against their record, so an
// entry of an earlier operation under a reused key never touches the new
// one, and a changed retention reschedules rather than loses an entry.
//
// A completion writes no compaction entry of its own: the sweep finds the
// records past retention by walking by_time in first-seen order
// (walkRetention), and a record gets an entry only where that walk would
// find it late (scheduleCompact). The entries of files written by earlier
// builds, one per completed record, are honoured as before.
func (s *Ledger) Sweep(ctx context.Context) (compacted, deleted int, err error) {
	for {
		if err := ctx.Err(); err != nil {
			return compacted, deleted, err
		}
		var c, d int
		var more bool
		err := s.updateIn(Background(ctx), func(tx *ltx) error {
			c, d, more = 0, 0, false
			now, high, trusted, err := s.ledgerTime(tx)
			if err != nil {
				return err
			}
			cutoff := later(now, high)
			freeBy := now
			if trusted.Before(freeBy) {
				freeBy = trusted
			}
			exp := tx.Bucket(bucketExpiry)
			type entry struct {
				k      []byte
				due    time.Time
				action byte
			}
			var due []entry
			cur := exp.Cursor()
			scanned := 0
			for k, v := cur.First(); k != nil && len(v) > 0 && scanned < sweepScan; k, v = cur.Next() {
				scanned++
				at := time.Unix(0, int64(binary.BigEndian.Uint64(k[:8])))
				if at.After(cutoff) {
					break
				}
				if v[0] == dueDeleteTomb && at.After(freeBy) {
					continue // due by the wall clock, not yet by the trusted time
				}
				due = append(due, entry{bytes.Clone(k), at, v[0]})
				if len(due) == sweepChunk {
					break
				}
			}
			// What this pass does may make more due now (an expired
			// approval's compaction, a compaction's deletion): another
			// pass looks, until one finds nothing.
			more = len(due) > 0
			var deletedEntries []AuditEntry
			started := time.Now() // the budget is this process's work, not the ledger's clock
			handled := 0
			for i, e := range due {
				if i > 0 && time.Since(started) >= sweepBudget {
					break // the rest stays due, for the next transaction
				}
				handled++
				if err := exp.Delete(e.k); err != nil {
					return err
				}
				tenant, key, _ := bytes.Cut(e.k[9:], []byte{0})
				if e.action == dueDeleteIssued {
					if err := tx.Bucket(bucketIssued).Delete(e.k[9:]); err != nil {
						return err
					}
					continue
				}
				rec, err := getRecord(tx, string(tenant), string(key))
				if err != nil {
					return err
				}
				if rec == nil {
					continue
				}
				switch e.action {
				case dueApproval:
					if rec.State != StateAwaitingApproval {
						continue
					}
					if prev, why := s.opts.expireTransition(rec, now, high); why != "" {
						if err := s.saveTransition(tx, Actor{Tenant: rec.Tenant, Principal: "ledger-sweep"}, rec, prev, why, now); err != nil {
							return err
						}
					}
				case dueCompact:
					if rec.Tombstone || !rec.State.Final() || rec.CompletedAt.IsZero() {
						continue // not this entry's record (an earlier operation's entry), or done
					}
					if want := rec.CompletedAt.Add(s.opts.Retention); want.After(cutoff) {
						if err := exp.Put(dueKey(want, dueCompact, rec.Tenant, rec.Key), []byte{dueCompact}); err != nil {
							return err
						}
						continue
					}
					if err := s.compactLocked(tx, rec); err != nil {
						return err
					}
					c++
				case dueDeleteTomb:
					if !rec.Tombstone {
						continue // a newer operation under the key, or not yet compacted
					}
					if want := rec.CompletedAt.Add(s.opts.Retention + s.opts.TombstoneRetention); want.After(freeBy) {
						if err := exp.Put(dueKey(want, dueDeleteTomb, rec.Tenant, rec.Key), []byte{dueDeleteTomb}); err != nil {
							return err
						}
						continue
					}
					if err := s.deleteRecordLocked(tx, rec); err != nil {
						return err
					}
					deletedEntries = append(deletedEntries, AuditEntry{At: now, Event: EventDeleted,
						Actor: Actor{Tenant: rec.Tenant, Principal: "ledger-sweep"}, Tool: rec.Tool, Key: rec.Key,
						Fingerprint: rec.Fingerprint, StateBefore: rec.State,
						Decision: AuditTombstoneDeleted, Detail: "incarnation " + rec.Incarnation})
					d++
				}
			}
			// With room left, the records past retention by their
			// first-seen time, from where the walk left off.
			if handled < sweepChunk && (handled == 0 || time.Since(started) < sweepBudget) {
				wc, moved, err := s.walkRetention(tx, cutoff, sweepChunk-handled, handled > 0, started)
				if err != nil {
					return err
				}
				c += wc
				more = more || moved
			}
			return s.appendObserved(tx, deletedEntries...)
		})
		compacted, deleted = compacted+c, deleted+d
		if err != nil || !more {
			return compacted, deleted, err
		}
	}
}

// walkRetention is the part of a sweep transaction that finds the records
// past retention without an expiry entry per record: it walks by_time (in
// first-seen order) from the place kept under keyRetentionWalk, over the
// records first seen Retention or more before cutoff. A final record due
// by cutoff (CompletedAt+Retention) becomes a tombstone, with its
// deletion's entry; a final record not yet due (it completed after it was
// first seen) gets its dueCompact entry; one not final (in progress,
// awaiting approval, unknown) gets its entry when it completes
// (scheduleCompact). An index entry whose record is gone, a tombstone, or
// a record first seen at another time (a newer operation under the key)
// is passed over. The walk reads at most sweepScan index entries and
// writes at most room entries and records, and stops at the sweep's
// budget (counted from started; busy: the transaction did work already,
// else it looks at one record at least). It returns the records it
// compacted and whether its place moved.
func (s *Ledger) walkRetention(tx *ltx, cutoff time.Time, room int, busy bool, started time.Time) (compacted int, moved bool, err error) {
	meta := tx.Bucket(bucketMeta)
	mark := bytes.Clone(meta.Get(keyRetentionWalk))
	end := cutoff.Add(-s.opts.Retention) // first seen at or before end: past retention
	// The keys first, then the records: nothing is written to a bucket
	// while a cursor walks it.
	var keys [][]byte
	cur := tx.Bucket(bucketByTime).Cursor()
	var k []byte
	if mark == nil {
		k, _ = cur.First()
	} else if k, _ = cur.Seek(mark); bytes.Equal(k, mark) {
		k, _ = cur.Next()
	}
	for ; k != nil && len(keys) < sweepScan; k, _ = cur.Next() {
		if len(k) < 8 || time.Unix(0, int64(beUint64(k[:8]))).After(end) {
			break
		}
		keys = append(keys, bytes.Clone(k))
	}
	exp := tx.Bucket(bucketExpiry)
	var last []byte
	written := 0
	for i, k := range keys {
		if written == room || (busy || i > 0) && time.Since(started) >= sweepBudget {
			break // the rest waits for the next transaction
		}
		last = k
		tenant, key, _ := bytes.Cut(k[8:], []byte{0})
		rec, err := getRecord(tx, string(tenant), string(key))
		if err != nil {
			return compacted, false, err
		}
		if rec == nil || rec.Tombstone || rec.FirstSeenAt.UnixNano() != int64(beUint64(k[:8])) ||
			!rec.State.Final() || rec.CompletedAt.IsZero() {
			continue
		}
		written++
		if want := rec.CompletedAt.Add(s.opts.Retention); want.After(cutoff) {
			if err := exp.Put(dueKey(want, dueCompact, rec.Tenant, rec.Key), []byte{dueCompact}); err != nil {
				return compacted, false, err
			}
			continue
		}
		if err := s.compactLocked(tx, rec); err != nil {
			return compacted, false, err
		}
		compacted++
	}
	if last == nil {
		return compacted, false, nil
	}
	return compacted, true, meta.Put(keyRetentionWalk, last)
}

// scheduleCompact writes the dueCompact entry of rec, which has just
// become final, when the retention walk would not find it by its due
// time: the walk has passed its time index key already (rec was not final
// then, or the clock was set back behind the walk when rec was first
// seen), or rec completed before it was first seen (a clock set back
// since), so that the walk would reach it after its due time. Otherwise
// nothing is written: the walk finds rec. The caller holds tx.
func (s *Ledger) scheduleCompact(tx *ltx, rec *Record) error {
	if !rec.CompletedAt.Before(rec.FirstSeenAt) {
		mark := tx.Bucket(bucketMeta).Get(keyRetentionWalk)
		if mark == nil || bytes.Compare(timeKey(rec.FirstSeenAt, rec.Tenant, rec.Key), mark) > 0 {
			return nil
		}
	}
	due := dueKey(rec.CompletedAt.Add(s.opts.Retention), dueCompact, rec.Tenant, rec.Key)
	return tx.Bucket(bucketExpiry).Put(due, []byte{dueCompact})
}

// compactLocked makes rec, final and past retention, a tombstone and
// schedules the tombstone's deletion; the caller holds tx.
func (s *Ledger) compactLocked(tx *ltx, rec *Record) error {
	if err := putRecord(tx, tombstone(rec)); err != nil {
		return err
	}
	at := dueKey(rec.CompletedAt.Add(s.opts.Retention+s.opts.TombstoneRetention), dueDeleteTomb, rec.Tenant, rec.Key)
	return tx.Bucket(bucketExpiry).Put(at, []byte{dueDeleteTomb})
}

func (s *Ledger) deleteRecordLocked(tx *ltx, rec *Record) error {
	// The key's history outlives its record: the numbers of the entries
	// the record numbered go to the per-key index, as one entry.
	if err := keepRecordAuditLocked(tx, rec); err != nil {
		return err
	}
	if err := tx.Bucket(bucketRecords).Delete(recordKey(rec.Tenant, rec.Key)); err != nil {
		return err
	}
	if err := tx.Bucket(bucketByTime).Delete(timeKey(rec.FirstSeenAt, rec.Tenant, rec.Key)); err != nil {
		return err
	}
	if rec.Approval != nil {
		k := recordKey(rec.Tenant, rec.Approval.ID)
		if err := tx.Bucket(bucketApprovals).Delete(k); err != nil {
			return err
		}
		if err := tx.Bucket(bucketPending).Delete(k); err != nil {
			return err
		}
	}
	fpb := tx.Bucket(bucketFPIndex)
	if v := fpb.Get(fpKey(rec.Tenant, rec.Fingerprint)); v != nil {
		var fe fpEntry
		if json.Unmarshal(v, &fe) == nil && fe.Key == rec.Key {
			return fpb.Delete(fpKey(rec.Tenant, rec.Fingerprint))
		}
	}
	return nil
}
