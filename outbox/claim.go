package outbox

import (
	"context"
	"encoding/binary"
	"sync"
	"time"

	"idemgate/ledger"
)

// Claims: one deliverer at a time per message.
//
// Several deliverers may share one outbox: replicas on one PostgreSQL
// ledger, processes on one ledger file, a command that delivers what it
// settled. Before delivering, a deliverer claims the messages it is about
// to hand to the sink, in one ledger transaction: a claim names the
// deliverer and lasts ClaimLease by the ledger's clock, and a message
// claimed by another deliverer, unexpired, is left to it. Ledger write
// transactions are serialised, so of two deliverers that both saw a
// message queued, exactly one claims it. The claim is dropped when the
// outcome is recorded.
//
// A deliverer that dies mid-pass leaves its claims to expire; another
// deliverer then takes the messages over. The one window in which a
// message is delivered twice is a death between the sink accepting it and
// the outcome's commit: the message is still queued, and the next
// deliverer sends it again — with the same message id (the webhook's
// Idempotency-Key, the directory sink's file name), for the sink to
// recognise. A deliverer starts a delivery only while at least half of
// its claim is left, so a delivery slower than half of ClaimLease
// (the webhook's timeout is 10 s; the default lease 30 s) is the other.
//
// Why a claim row, not PostgreSQL's SELECT … FOR UPDATE SKIP LOCKED or an
// advisory lock: a row lock lasts as long as its transaction, and a
// delivery is a network call that must not run inside one (it would hold
// a connection per message, and the locks of the keys it read, for as
// long as a gateway takes); and a claim is written through ledger.Store,
// so it works the same on every backend. Its cost is one more write per
// delivery pass that has something to deliver (not per message; an idle
// pass writes nothing), which Run has carried by the ledger's next write
// — a call's commit while calls are being made — and commits alone only
// when none comes within carryWait (claimCarried).

// collClaims holds the live claims: message_id → until (8 bytes BE unix
// ns, by the ledger's clock) followed by the claiming deliverer's id.
const collClaims = "outbox_claims"

// DefaultClaimLease is how long a claim lasts unless ClaimLease says
// otherwise.
const DefaultClaimLease = 30 * time.Second

func (d *Deliverer) claimLease() time.Duration {
	if d.ClaimLease <= 0 {
		return DefaultClaimLease
	}
	return d.ClaimLease
}

// othersClaim reports whether the claim value v is another deliverer's,
// unexpired at now.
func (d *Deliverer) othersClaim(v []byte, now time.Time) bool {
	if len(v) < 8 {
		return false
	}
	until := time.Unix(0, int64(binary.BigEndian.Uint64(v[:8])))
	return string(v[8:]) != d.owner && until.After(now)
}

// claim takes the messages of seen (read by the pass's scan) that are
// still queued, due and not claimed by another deliverer, in a
// transaction of its own, and returns them as they now stand, with the
// local time from which the claim lasts ClaimLease.
func (d *Deliverer) claim(ctx context.Context, seen []*Message) ([]*Message, time.Time, error) {
	lease := d.claimLease()
	// Measured before the transaction: its clock reads later, so the
	// claim lasts at least until start+lease.
	start := time.Now()
	var claimed []*Message
	err := d.store.Update(ctx, func(tx ledger.Tx) error {
		var err error
		claimed, err = d.claimIn(tx, seen, lease)
		return err
	})
	if err != nil {
		return nil, time.Time{}, err
	}
	return claimed, start, nil
}

// carryWait bounds how long a pass's claim waits for a commit that
// happens anyway (a call's) to carry it before the deliverer commits it
// alone.
const carryWait = 20 * time.Millisecond

// claimCarried is claim written with the ledger's next write (see
// laterStore): the commit of a call when calls are being made, so that a
// pass's claim costs no commit of its own. When no write comes within
// carryWait it commits one (which carries the claim). It returns only
// once the claim has committed — nothing is delivered on a claim that is
// not durable — or failed; the claim's guarantees are claim's: the
// carrying transaction is a write transaction like any other, serialised
// with every other deliverer's.
func (d *Deliverer) claimCarried(ctx context.Context, ls laterStore, seen []*Message) ([]*Message, time.Time, error) {
	lease := d.claimLease()
	start := time.Now() // before the transaction, as in claim
	var (
		mu        sync.Mutex
		abandoned bool // the pass gave up on the claim: it writes nothing
		claimed   []*Message
	)
	done := make(chan error, 1)
	ls.Later(func(tx ledger.Tx) error {
		mu.Lock()
		defer mu.Unlock()
		claimed = nil
		if abandoned {
			return nil
		}
		var err error
		claimed, err = d.claimIn(tx, seen, lease)
		return err
	}, func(err error) { done <- err })
	// giveUp abandons the claim when the pass stops before it committed
	// (shutting down, or the ledger failing): a claim written after all,
	// by a transaction under way, is dropped by the release queued after
	// it, so a stopping process leaves no claim to keep the messages
	// from the other deliverers for a lease.
	giveUp := func(err error) ([]*Message, time.Time, error) {
		mu.Lock()
		abandoned = true
		mu.Unlock()
		ls.Later(func(tx ledger.Tx) error {
			for _, m := range seen {
				if err := d.release(tx, m.MessageID, false); err != nil {
					return err
				}
			}
			return nil
		}, func(error) {})
		return nil, time.Time{}, err
	}
	t := time.NewTimer(carryWait)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return nil, time.Time{}, err // nothing of the claim was written
			}
			mu.Lock()
			defer mu.Unlock()
			return claimed, start, nil
		case <-ctx.Done():
			return giveUp(ctx.Err())
		case <-t.C:
			// No write came to carry it: an empty transaction does (or,
			// when a commit under way took it, waits its turn after it).
			if err := d.store.Update(ctx, func(ledger.Tx) error { return nil }); err != nil {
				return giveUp(err)
			}
			t.Reset(carryWait)
		}
	}
}

// claimIn is the claim's transaction: it claims, for lease from the
// transaction's clock, the messages of seen that are still queued, due
// and not claimed by another deliverer, and returns them as they now
// stand.
func (d *Deliverer) claimIn(tx ledger.Tx, seen []*Message, lease time.Duration) ([]*Message, error) {
	var claimed []*Message
	now := tx.Now()
	var val [8]byte
	binary.BigEndian.PutUint64(val[:], uint64(now.Add(lease).UnixNano()))
	mine := append(val[:], d.owner...)
	// The live claims, in one read (a scan, not a lookup per message: on
	// PostgreSQL every read is a round trip).
	others := map[string]bool{}
	if err := tx.Scan(collClaims, "", false, func(id string, v []byte) (bool, error) {
		if d.othersClaim(v, now) {
			others[id] = true
		}
		return true, nil
	}); err != nil {
		return nil, err
	}
	ids := make([]string, len(seen))
	for i, m := range seen {
		ids[i] = m.MessageID
	}
	ledger.Prefetch(tx, Collection, ids...)
	for _, m := range seen {
		cur, err := getMessage(tx, m.MessageID)
		if err != nil {
			return nil, err
		}
		// Re-read: another deliverer may have claimed, delivered and
		// released it since the pass's scan.
		if cur == nil || cur.State != MessageQueued || cur.NextAttemptAt.After(now) || others[cur.MessageID] {
			continue
		}
		if err := tx.Put(collClaims, cur.MessageID, mine); err != nil {
			return nil, err
		}
		claimed = append(claimed, cur)
	}
	return claimed, nil
}

// release drops d's claim of message id, if it still holds it (inside the
// transaction recording the outcome). Within its claim (mine) the claim
// is certainly d's and is deleted without being read first.
func (d *Deliverer) release(tx ledger.Tx, id string, mine bool) error {
	if mine {
		return tx.Delete(collClaims, id)
	}
	v, err := tx.Get(collClaims, id)
	if err != nil || len(v) < 8 || string(v[8:]) != d.owner {
		return err
	}
	return tx.Delete(collClaims, id)
}
