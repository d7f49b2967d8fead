package ledger

import (
	"encoding/binary"
	"sync"
	"time"
)

// EventDeleted is the audit event of a tombstone deleted by the sweep:
// from then on its key is free, and a call under it is a new operation.
const EventDeleted AuditEvent = "deleted"

// clockState is what this process knows of the ledger's clocks.
type clockState struct {
	mu       sync.Mutex
	seen     bool          // this process has read the trusted time at least once
	trusted  time.Time     // the trusted time it last read or wrote
	at       time.Duration // Options.Elapsed then
	high     time.Time     // the latest high-water time it has read or written
	warnedAt time.Duration // Options.Elapsed at the last clock warning
}

func (s *Ledger) highWater() time.Time {
	s.clock.mu.Lock()
	defer s.clock.mu.Unlock()
	return s.clock.high
}

func getTime(b Bucket, k []byte) time.Time {
	v := b.Get(k)
	if len(v) != 8 {
		return time.Time{}
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(v)))
}

// ledgerTime reads the clocks for a write transaction and moves them on.
// It returns the wall clock (now), the high-water time (the latest wall
// time any write has recorded: a clock set back is never believed below
// it for approvals, see Options.decide) and the trusted time, which is
// what deletes tombstones and so frees keys:
//
//   - the trusted time never goes back;
//   - it follows the wall clock while the wall clock moves ahead of it by
//     at most MaxClockJump;
//   - beyond that (a jump forward, or a gap while no process used the
//     ledger) it advances only by the time this process has measured
//     passing with the monotonic clock since it last looked, never past
//     the wall clock;
//   - it never falls more than MaxClockLag behind the wall clock.
//
// Both are kept in the meta bucket, written in the caller's transaction
// only when they move (no fsync of their own).
func (s *Ledger) ledgerTime(tx *ltx) (now, high, trusted time.Time, err error) {
	now = s.opts.Now()
	elapsed := s.opts.Elapsed()
	meta := tx.Bucket(bucketMeta)
	h0, t0 := getTime(meta, keyClockHigh), getTime(meta, keyClockTrusted)
	if h0.IsZero() {
		h0 = now
	}
	if t0.IsZero() { // a new ledger, or one written before the clocks were kept
		t0 = now
	}
	s.clock.mu.Lock()
	trusted = t0
	if now.After(t0) {
		next := now
		if now.Sub(t0) > s.opts.MaxClockJump {
			next = t0
			if s.clock.seen {
				if measured := s.clock.trusted.Add(elapsed - s.clock.at); measured.After(next) {
					next = measured
				}
			}
			if floor := now.Add(-s.opts.MaxClockLag); floor.After(next) {
				next = floor
			}
			if next.After(now) {
				next = now
			}
		}
		trusted = later(t0, next)
	}
	high = later(h0, now)
	warn := ""
	var by time.Duration
	switch {
	case h0.Sub(now) > time.Second:
		warn, by = "the wall clock is behind the latest time this ledger recorded (set back?): approvals expire by the recorded time; tombstones are deleted only when both clocks agree", h0.Sub(now)
	case now.Sub(trusted) > s.opts.MaxClockJump:
		warn, by = "the wall clock is ahead of the ledger's trusted time (a jump forward, or the ledger was idle): tombstones are deleted, and keys freed, only by the trusted time, which follows the time measured passing", now.Sub(trusted)
	}
	if warn != "" && (s.clock.warnedAt == 0 || elapsed-s.clock.warnedAt >= time.Minute) {
		s.clock.warnedAt = max(elapsed, 1)
		s.opts.Log.Warn("ledger clock: "+warn, "by", by.Round(time.Second).String(), "wall", now.UTC(), "trusted", trusted.UTC(), "high_water", high.UTC())
	}
	s.clock.seen, s.clock.trusted, s.clock.at = true, trusted, elapsed
	s.clock.high = later(s.clock.high, high)
	s.clock.mu.Unlock()
	// Written when they moved by clockGrain or more, so most transactions
	// of a busy ledger do not rewrite the meta bucket.
	if stored := getTime(meta, keyClockHigh); stored.IsZero() || high.Sub(stored) >= clockGrain {
		if err := meta.Put(keyClockHigh, be64(uint64(high.UnixNano()))); err != nil {
			return now, high, trusted, err
		}
	}
	if stored := getTime(meta, keyClockTrusted); stored.IsZero() || trusted.Sub(stored) >= clockGrain {
		if err := meta.Put(keyClockTrusted, be64(uint64(trusted.UnixNano()))); err != nil {
			return now, high, trusted, err
		}
	}
	return now, high, trusted, nil
}

// clockGrain is how far the ledger's clocks move before they are written
// again: they are that much behind at most, which only delays (never
// hastens) an expiry or a deletion by them.
const clockGrain = time.Second
