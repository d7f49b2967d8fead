package ledger

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Audit retention: the oldest audit entries are archived (exported) and
// pruned, and the chain stays verifiable from an anchor.
//
// The anchor is the sequence number and hash of the last pruned entry,
// kept in the meta collection. The first kept entry's prev_hash must equal
// the anchor's hash and its sequence number must follow the anchor's, so
// VerifyAuditChain proves the kept part from there. Every prune also
// appends an EventAuditPruned entry to the chain naming the anchor it set;
// verification checks that the newest one names the stored anchor, so
// changing the anchor (to hide deleted entries) breaks the chain's own
// record of it. The pruned part is proven by its archive: the archive's
// entries chain into each other and its last entry's hash is the anchor
// (AuditChain, "idemgate audit verify --archive").

// EventAuditPruned is the audit event of a prune: the entries up to the
// anchor it names were removed from the ledger (after being archived, or
// discarded on the operator's word). Its PrunedThrough is the anchor it set;
// its Detail says the same for people (prunedDetail).
const EventAuditPruned AuditEvent = "audit_pruned"

// keyAuditAnchor is the meta key of the AuditAnchor JSON.
var keyAuditAnchor = []byte("audit_anchor")

// pruneChunk bounds the entries one prune transaction removes, so a prune
// of a long log never holds the writer for long (claims keep being served).
const pruneChunk = 500

// ErrAuditPruneConflict is returned by PruneAudit when the log's head
// moved while it worked (another prune ran at the same time).
var ErrAuditPruneConflict = errors.New("ledger: the audit log's oldest entries changed during the prune (another prune running?); nothing more was pruned, run it again")

// AuditAnchor is where a pruned audit log's kept part begins: Seq and Hash
// are those of the last pruned entry (the first kept entry's prev_hash),
// At when that entry was written, PrunedAt when it was pruned.
type AuditAnchor struct {
	Seq      uint64    `json:"seq"`
	Hash     string    `json:"hash"`
	At       time.Time `json:"at"`
	PrunedAt time.Time `json:"pruned_at"`
}

// AuditArchive receives the entries a prune removes, before it removes
// them.
type AuditArchive interface {
	// Write makes entries durable (written and synced) and returns a short
	// note for the prune's audit entry (say, the digest of what it wrote).
	// When it returns an error, nothing is pruned.
	Write(entries []AuditEntry) (note string, err error)
	// Undo takes back the last Write, whose entries were not pruned after
	// all (the prune's transaction failed).
	Undo() error
}

// AuditPruned is what PruneAudit did: how many entries it removed and the
// anchor it left (zero when it removed nothing).
type AuditPruned struct {
	Entries int
	Anchor  AuditAnchor
}

// PruneAudit removes the oldest audit entries written before before — the
// longest prefix of the log whose entries are all older — after handing
// each batch to archive (nil: the entries are discarded; the caller has
// decided that). It never removes an entry appended after it started, and
// refuses (removing nothing more) when the part it would prune does not
// verify: pruning must not destroy the evidence of tampering. It works in
// transactions of at most pruneChunk entries; each one moves the anchor,
// removes the entries from the per-key index, and appends an
// EventAuditPruned entry, so an interrupted prune leaves a consistent,
// verifiable log. before must not be in the future.
func (s *Ledger) PruneAudit(ctx context.Context, before time.Time, actor Actor, archive AuditArchive) (AuditPruned, error) {
	var res AuditPruned
	if s.readOnly {
		return res, errors.New("ledger: opened read-only; pruning the audit log writes")
	}
	if before.After(s.opts.Now()) {
		return res, fmt.Errorf("ledger: prune before %s: that is in the future", before.Format(time.RFC3339))
	}
	if err := s.flushAudit(); err != nil {
		return res, err
	}
	var last uint64 // the newest entry when the prune started: the limit
	if err := s.view(func(tx *ltx) error {
		if k, _ := tx.Bucket(bucketAudit).Cursor().Last(); len(k) == 8 {
			last = beUint64(k)
		}
		return nil
	}); err != nil {
		return res, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		batch, anchor, err := s.pruneBatch(before, last)
		if err != nil || len(batch) == 0 {
			return res, err
		}
		note := "discarded without an archive"
		if archive != nil {
			if note, err = archive.Write(batch); err != nil {
				return res, fmt.Errorf("archive: %w", err)
			}
		}
		end := batch[len(batch)-1]
		next := AuditAnchor{Seq: end.Seq, Hash: end.Hash, At: end.At}
		err = s.update(func(tx *ltx) error {
			next.PrunedAt = s.opts.Now()
			// Its entry is chained here, not journaled: verification
			// finds the prune record right after what it pruned.
			tx.journal = false
			// The batch must still be the log's head after the anchor:
			// nothing pruned it meanwhile, and no entry changed.
			cur, err := readAnchor(tx)
			if err != nil {
				return err
			}
			if !sameAnchor(cur, anchor) {
				return ErrAuditPruneConflict
			}
			b := tx.Bucket(bucketAudit)
			for _, e := range batch {
				v := b.Get(be64(e.Seq))
				var stored AuditEntry
				if v == nil || json.Unmarshal(v, &stored) != nil || stored.Hash != e.Hash {
					return ErrAuditPruneConflict
				}
			}
			// Append first: the log is never empty, so the next entry's
			// sequence number follows on.
			if err := s.appendObserved(tx, AuditEntry{At: next.PrunedAt, Event: EventAuditPruned, Actor: actor,
				Detail: prunedDetail(batch[0].Seq, next, note), PrunedThrough: &next}); err != nil {
				return err
			}
			idx := tx.Bucket(bucketAuditByKey)
			for _, e := range batch {
				if e.Key == "" || idx == nil {
					continue
				}
				k := auditKeyIndex(e.Actor.Tenant, e.Key, e.Seq)
				if v := idx.Get(k); len(v) > 0 {
					// A deleted record's entries, named by their newest
					// (keepRecordAuditLocked): the kept entries near it
					// are indexed one by one before it goes.
					if err := keepNearAuditLocked(tx, e, end.Seq); err != nil {
						return err
					}
				}
				if err := idx.Delete(k); err != nil {
					return err
				}
			}
			for _, e := range batch {
				if err := b.Delete(be64(e.Seq)); err != nil {
					return err
				}
			}
			v, err := json.Marshal(next)
			if err != nil {
				return err
			}
			return tx.Bucket(bucketMeta).Put(keyAuditAnchor, v)
		})
		if err != nil {
			if archive != nil {
				if uerr := archive.Undo(); uerr != nil {
					err = errors.Join(err, fmt.Errorf("archive: taking back the entries not pruned: %w", uerr))
				}
			}
			return res, err
		}
		res.Entries += len(batch)
		res.Anchor = next
	}
}

// keepNearAuditLocked indexes, one by one, the entries of e's key after
// kept (the last pruned) that land at most auditNear after e — the ones a
// reader found by scanning near e, a transition of a deleted record,
// whose index entry goes with e. Every earlier transition of that record
// is pruned too, so the kept entries near any of them are near e. The
// caller holds tx.
func keepNearAuditLocked(tx BTx, e AuditEntry, kept uint64) error {
	near, err := nearAuditEntries(tx, e.Actor.Tenant, e.Key, []uint64{e.Seq})
	if err != nil {
		return err
	}
	idx := tx.Bucket(bucketAuditByKey)
	for _, seq := range near {
		if seq <= kept {
			continue
		}
		if err := idx.Put(auditKeyIndex(e.Actor.Tenant, e.Key, seq), nil); err != nil {
			return err
		}
	}
	return nil
}

// pruneBatch reads the next batch to prune: up to pruneChunk entries from
// the head of the log, each written before before and numbered at most
// last, checked against the chain from the current anchor.
func (s *Ledger) pruneBatch(before time.Time, last uint64) ([]AuditEntry, *AuditAnchor, error) {
	var batch []AuditEntry
	var anchor *AuditAnchor
	err := s.view(func(tx *ltx) error {
		batch = nil
		var err error
		if anchor, err = readAnchor(tx); err != nil {
			return err
		}
		prev := ""
		if anchor != nil {
			prev = anchor.Hash
		}
		c := tx.Bucket(bucketAudit).Cursor()
		for k, v := c.First(); k != nil && len(batch) < pruneChunk; k, v = c.Next() {
			var e AuditEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("audit entry %x: not JSON: %w", k, err)
			}
			if e.Seq > last || !e.At.Before(before) {
				break
			}
			if e.Seq != beUint64(k) {
				return fmt.Errorf("audit entry %d: stored under sequence %d", e.Seq, beUint64(k))
			}
			if len(batch) == 0 && anchor != nil && e.Seq != anchor.Seq+1 {
				return fmt.Errorf("audit entry %d: the anchor says the log starts at %d", e.Seq, anchor.Seq+1)
			}
			if err := e.verifyChain(prev); err != nil {
				return err
			}
			prev = e.Hash
			batch = append(batch, e)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("ledger: audit log does not verify, nothing more pruned (run idemgate audit verify): %w", err)
	}
	return batch, anchor, nil
}

// readAnchor returns the stored anchor, or nil when the log was never
// pruned.
func readAnchor(tx *ltx) (*AuditAnchor, error) {
	m := tx.Bucket(bucketMeta)
	if m == nil {
		return nil, nil
	}
	v := m.Get(keyAuditAnchor)
	if v == nil {
		return nil, nil
	}
	var a AuditAnchor
	if err := json.Unmarshal(v, &a); err != nil {
		return nil, fmt.Errorf("audit anchor: not JSON: %w", err)
	}
	return &a, nil
}

func sameAnchor(a, b *AuditAnchor) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Seq == b.Seq && a.Hash == b.Hash
}

// prunedDetail is an EventAuditPruned entry's Detail, for people: the
// anchor it names is also the entry's PrunedThrough, which verification
// reads.
func prunedDetail(first uint64, a AuditAnchor, note string) string {
	return fmt.Sprintf("audit entries %d-%d pruned; anchor seq %d hash %s; %s", first, a.Seq, a.Seq, a.Hash, note)
}

// AuditVerification is what VerifyAuditChain proved.
type AuditVerification struct {
	// Entries is the number of entries checked in the ledger.
	Entries int
	// First and Last are the sequence numbers of the first and last entry
	// checked (0 when the log is empty).
	First, Last uint64
	// Anchor is where the kept part begins when the log was pruned (nil:
	// the log is whole, from entry 1).
	Anchor *AuditAnchor
}

// verifyChunk bounds the entries one read transaction of
// VerifyAuditChain checks: a long log is read in many short transactions,
// never in one long read (on bbolt a long read keeps the file from
// growing, so a commit that needs room would wait for the check).
const verifyChunk = 4096

// errPrunedMeanwhile is returned by one pass of verifyAuditChain when a
// prune moved the anchor between two of its transactions.
var errPrunedMeanwhile = errors.New("ledger: the audit log was pruned while it was being verified")

// VerifyAuditChain checks the hash chain of the entries the ledger keeps:
// from entry 1, or, when the log was pruned, from the anchor (the first
// kept entry must link to it, and the newest EventAuditPruned entry must
// name it). from, when not nil, is the chain of an archive checked before
// (AuditChain): the ledger must continue it exactly — its anchor is the
// archive's last entry, or the ledger was never pruned and the archive is
// a copy of its first entries. It checks the entries present when it
// started (those appended meanwhile are left to the next check), reading
// them in transactions of at most verifyChunk entries; a prune that runs
// meanwhile makes it start again (three times at most). Then it checks
// that every entry the records, the per-key index and its watermark
// number is in the log or pruned (checkAuditNumbers), so a cut tail is
// found. It returns what it proved — on an error, Entries counts the
// entries that verified before the one named — or an error naming the
// first entry that does not verify, or what numbers a missing one, or
// ctx's error when ctx ends first (then nothing was proved).
func (s *Ledger) VerifyAuditChain(ctx context.Context, from *AuditChain) (AuditVerification, error) {
	for attempt := 1; ; attempt++ {
		res, err := s.verifyAuditChain(ctx, from)
		if errors.Is(err, errPrunedMeanwhile) && attempt < 3 {
			continue
		}
		return res, err
	}
}

// chainCheck is the state verifyAuditChain carries from one of its
// transactions to the next.
type chainCheck struct {
	res         AuditVerification
	anchor      *AuditAnchor
	prev        string
	want        uint64 // the first entry's sequence number
	end         uint64 // the newest entry when the check started
	newestPrune *AuditEntry
	done        bool
}

// verifyAuditChain is one pass of VerifyAuditChain.
func (s *Ledger) verifyAuditChain(ctx context.Context, from *AuditChain) (AuditVerification, error) {
	var st chainCheck
	for first := true; !st.done; first = false {
		var reached AuditVerification // what the failed chunk had proved
		err := s.view(func(tx *ltx) error {
			// A backend may run fn again: it works on a copy, kept only
			// when the transaction's reads all succeeded.
			next := st
			err := next.chunk(ctx, tx, from, first)
			reached = next.res
			if err != nil {
				return err
			}
			st = next
			return nil
		})
		if err != nil {
			// The entries before the one that failed are good: say how
			// many ("broken after 5 good entries", not after 0).
			return reached, err
		}
	}
	if err := st.finish(from); err != nil {
		return st.res, err
	}
	return st.res, s.checkAuditNumbers(ctx)
}

// chunk checks up to verifyChunk entries in tx: from the log's first entry
// when first, else from the one after the last checked.
func (st *chainCheck) chunk(ctx context.Context, tx *ltx, from *AuditChain, first bool) error {
	a, err := readAnchor(tx)
	if err != nil {
		return err
	}
	c := tx.Bucket(bucketAudit).Cursor()
	var k, v []byte
	if first {
		st.anchor, st.res.Anchor = a, a
		st.prev, st.want = "", 1
		if a != nil {
			st.prev, st.want = a.Hash, a.Seq+1
		}
		if from != nil && from.N > 0 {
			switch {
			case a != nil && (from.Last != a.Seq || from.Hash != a.Hash):
				return fmt.Errorf("the archive ends at entry %d (hash %.12s…) but the ledger's kept part starts after entry %d (hash %.12s…): an archive is missing or was changed", from.Last, from.Hash, a.Seq, a.Hash)
			case a == nil && from.First != 1:
				return fmt.Errorf("the archive starts at entry %d but the ledger was never pruned and starts at entry 1", from.First)
			}
		}
		if lk, _ := c.Last(); len(lk) == 8 {
			st.end = beUint64(lk)
		}
		k, v = c.First()
	} else {
		if !sameAnchor(a, st.anchor) {
			return errPrunedMeanwhile // entries are removed only with the anchor moved
		}
		var seek [8]byte
		binary.BigEndian.PutUint64(seek[:], st.res.Last+1)
		k, v = c.Seek(seek[:])
	}
	res, anchor := &st.res, st.anchor
	for n := 0; ; n++ {
		if k == nil || beUint64(k) > st.end {
			st.done = true
			return nil
		}
		if n == verifyChunk {
			return nil // the next transaction goes on from here
		}
		if res.Entries%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		var e AuditEntry
		if err := json.Unmarshal(v, &e); err != nil {
			return fmt.Errorf("audit entry %x: not JSON: %w", k, err)
		}
		if e.Seq != binary.BigEndian.Uint64(k) {
			return fmt.Errorf("audit entry %d: stored under sequence %d", e.Seq, binary.BigEndian.Uint64(k))
		}
		if res.Entries > 0 && e.Seq != res.Last+1 {
			missing := fmt.Sprintf("entry %d is", res.Last+1)
			if e.Seq-res.Last > 2 {
				missing = fmt.Sprintf("entries %d-%d are", res.Last+1, e.Seq-1)
			}
			return fmt.Errorf("audit entry %d: it follows entry %d, %s missing", e.Seq, res.Last, missing)
		}
		if res.Entries == 0 && e.Seq != st.want {
			if anchor == nil {
				return fmt.Errorf("audit entry %d is the first, but no anchor records a prune: entries 1-%d were removed", e.Seq, e.Seq-1)
			}
			return fmt.Errorf("audit entry %d is the first kept, but the anchor is entry %d: the entries between are missing, or the anchor was changed", e.Seq, anchor.Seq)
		}
		if from != nil && anchor == nil && from.N > 0 && e.Seq == from.Last && e.Hash != from.Hash {
			// An archive (export) of a log never pruned: two chains that
			// verify and agree on an entry's hash agree on every entry
			// before it.
			return fmt.Errorf("audit entry %d: the archive's copy (hash %.12s…) differs from the ledger's (%.12s…)", e.Seq, from.Hash, e.Hash)
		}
		if err := e.verifyChain(st.prev); err != nil {
			if res.Entries == 0 && anchor != nil {
				return fmt.Errorf("%w (the anchor says entry %d has hash %.12s…: the anchor or the first kept entry was changed)", err, anchor.Seq, anchor.Hash)
			}
			return err
		}
		if e.Event == EventAuditPruned {
			ec := e
			st.newestPrune = &ec
		}
		st.prev = e.Hash
		if res.Entries == 0 {
			res.First = e.Seq
		}
		res.Last = e.Seq
		res.Entries++
		k, v = c.Next()
	}
}

// finish checks, once every entry is checked, what the whole log must
// show: the archive's end, and the anchor named by the newest prune.
func (st *chainCheck) finish(from *AuditChain) error {
	res, anchor, newestPrune := st.res, st.anchor, st.newestPrune
	if from != nil && anchor == nil && from.N > 0 && res.Last < from.Last {
		return fmt.Errorf("the archive goes up to entry %d, the ledger's log only to %d: the archive is not of this ledger", from.Last, res.Last)
	}
	if anchor == nil {
		if newestPrune != nil {
			return fmt.Errorf("audit entry %d records a prune, but the ledger holds no anchor: the anchor was removed", newestPrune.Seq)
		}
		return nil
	}
	if res.Entries == 0 {
		return fmt.Errorf("the log was pruned through entry %d but holds no entry after it: the prune record was removed", anchor.Seq)
	}
	if newestPrune == nil {
		return fmt.Errorf("the anchor says entries through %d were pruned, but no prune record is in the log: the anchor or the log was changed", anchor.Seq)
	}
	if p := newestPrune.PrunedThrough; p == nil || p.Seq != anchor.Seq || p.Hash != anchor.Hash {
		return fmt.Errorf("the anchor (entry %d, hash %.12s…) is not the one the newest prune record (entry %d) names: the anchor was changed", anchor.Seq, anchor.Hash, newestPrune.Seq)
	}
	return nil
}

// AuditChain checks a sequence of audit entries read from an archive (an
// export): each must follow the one before in the hash chain. The first
// entry is taken as given (its prev_hash must be empty only when it is
// entry 1); VerifyAuditChain then checks that the ledger continues the
// chain. The zero value is ready to use.
type AuditChain struct {
	// N is the number of entries added; First and Last their first and
	// last sequence numbers, Hash the last entry's hash.
	N           int
	First, Last uint64
	Hash        string
}

// Add checks e against the entries added before it.
func (c *AuditChain) Add(e AuditEntry) error {
	prev := c.Hash
	if c.N == 0 {
		if e.Seq == 1 && e.PrevHash != "" {
			return fmt.Errorf("audit entry 1: prev_hash is %.12s…, the first entry's is empty", e.PrevHash)
		}
		prev = e.PrevHash
		c.First = e.Seq
	} else if e.Seq != c.Last+1 {
		return fmt.Errorf("audit entry %d follows entry %d: entries are missing or out of order", e.Seq, c.Last)
	}
	if err := e.verifyChain(prev); err != nil {
		return err
	}
	c.N++
	c.Last, c.Hash = e.Seq, e.Hash
	return nil
}

// AuditAnchorOf returns the ledger's audit anchor, or nil when its log was
// never pruned.
func (s *Ledger) AuditAnchorOf(ctx context.Context) (*AuditAnchor, error) {
	var a *AuditAnchor
	err := s.view(func(tx *ltx) error {
		var err error
		a, err = readAnchor(tx)
		return err
	})
	return a, err
}
