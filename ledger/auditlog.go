package ledger

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"
)

// The audit log: the hash chain, the per-key index, and reading them.

// appendObserved appends entries written by a transition; Options.Observe
// sees them once their transaction has committed.
func (s *Ledger) appendObserved(tx *ltx, entries ...AuditEntry) error {
	if err := appendAudit(tx, entries...); err != nil {
		return err
	}
	if s.opts.Observe != nil {
		tx.observed = append(tx.observed, entries...)
	}
	return nil
}

// appendAudit adds entries to the audit log: to the journal on a
// Concurrent backend (journalAudit), else to the hash chain (chainAudit).
func appendAudit(tx *ltx, entries ...AuditEntry) error {
	if len(entries) == 0 {
		return nil
	}
	if tx.journal {
		return journalAudit(tx, entries)
	}
	return chainAudit(tx, true, entries...)
}

// journalAudit writes entries to the journal, in their order, under keys
// no other transaction writes: the transaction's order (see
// JournalCollection) and the entry's index in it. The sealer chains them
// (sealJournal).
func journalAudit(tx *ltx, entries []AuditEntry) error {
	if tx.journaled == 0 {
		tx.order = tx.ledger.txOrder.Add(1)
	}
	j := tx.Bucket(bucketJournal)
	for _, e := range entries {
		e.Seq, e.PrevHash, e.Hash = 0, "", ""
		v, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if err := j.Put(binary.BigEndian.AppendUint32(be64(tx.order), tx.journaled), v); err != nil {
			return err
		}
		tx.journaled++
	}
	return nil
}

// sealBatch bounds the journal entries one sealing transaction chains.
const sealBatch = 1000

// sealJournal chains the journal's entries into the audit log, oldest
// first, and deletes them from the journal, sealBatch entries a
// transaction, until the journal is empty. Sealers of several processes
// exclude each other by the chain's head, which each reads first and
// writes; a transition never waits for one, since it writes only its own
// journal keys. Every keyed entry sealed is put in the per-key index (a
// journaling ledger's records number none).
func (s *Ledger) sealJournal() error {
	s.auditMu.Lock()
	s.unsealed = false
	if len(s.auditBuf) == 0 && len(s.laterBuf) == 0 {
		s.bufSince = time.Time{}
	}
	s.auditMu.Unlock()
	for {
		more := false
		err := s.b.Update(context.Background(), func(bt BTx) error {
			more = false
			tx := &ltx{BTx: bt, ledger: s}
			// The chain's head first: it excludes the other sealers,
			// and the journal read after it no longer holds what they
			// chained (read before it, their entries would be chained
			// twice).
			tx.Bucket(bucketAudit).Cursor().Last()
			j := tx.Bucket(bucketJournal)
			var keys [][]byte
			var entries []AuditEntry
			c := j.Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				if len(keys) == sealBatch {
					more = true
					break
				}
				var e AuditEntry
				if err := json.Unmarshal(v, &e); err != nil {
					return fmt.Errorf("ledger: audit journal entry %x: %w", k, err)
				}
				keys = append(keys, bytes.Clone(k))
				entries = append(entries, e)
			}
			if len(keys) == 0 {
				return nil
			}
			if err := chainAudit(tx, false, entries...); err != nil {
				return err
			}
			for _, k := range keys {
				if err := j.Delete(k); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			s.auditMu.Lock()
			s.unsealed = true
			s.buffered()
			s.auditMu.Unlock()
			return err
		}
		if !more {
			return nil
		}
	}
}

// sealWait bounds how long a read-only ledger waits for the entries
// journaled before it reads the log to be sealed by the processes that
// write (each seals within auditFlushInterval of its commit).
const sealWait = 2 * time.Second

// awaitSealed waits until every audit entry journaled before the call has
// been sealed by a writing process, or sealWait has passed (a writer that
// died before sealing leaves its entries to the next writer that opens
// the ledger): a read-only ledger cannot seal them itself.
func (s *Ledger) awaitSealed() error {
	var last []byte
	if err := s.view(func(tx *ltx) error {
		if j := tx.Bucket(bucketJournal); j != nil {
			k, _ := j.Cursor().Last()
			last = bytes.Clone(k)
		}
		return nil
	}); err != nil || last == nil {
		return err
	}
	deadline := time.Now().Add(sealWait)
	for {
		var first []byte
		if err := s.view(func(tx *ltx) error {
			k, _ := tx.Bucket(bucketJournal).Cursor().First()
			first = bytes.Clone(k)
			return nil
		}); err != nil {
			return err
		}
		if first == nil || bytes.Compare(first, last) > 0 || time.Now().After(deadline) {
			return nil
		}
		time.Sleep(auditFlushInterval / 4)
	}
}

// chainAudit adds entries to the hash chain and, unless their record
// numbers them (keepAuditSeqLocked) or (near) they land near a transition
// it numbers (nearRecordAudit), to the per-key index; the caller holds
// tx. The sealer passes near false: it indexes every keyed entry rather
// than read (and, on a locking backend, lock) the records of the keys.
func chainAudit(tx BTx, near bool, entries ...AuditEntry) error {
	if len(entries) == 0 {
		return nil
	}
	b := tx.Bucket(bucketAudit)
	var seq uint64
	prev := ""
	if k, v := b.Cursor().Last(); k != nil {
		var last struct { // only what the chain goes on from
			Seq  uint64 `json:"seq"`
			Hash string `json:"hash"`
		}
		if err := json.Unmarshal(v, &last); err != nil {
			return fmt.Errorf("ledger: audit tail: %w", err)
		}
		seq, prev = last.Seq, last.Hash
	}
	// Entries a build without the index appended (another process on the
	// same file) are indexed now, before the new ones.
	if err := indexAudit(tx, seq); err != nil {
		return err
	}
	idx := tx.Bucket(bucketAuditByKey)
	// The records do not change while the entries are appended: each
	// key's is read once (a flush carries many replays of a few keys).
	var numbered map[[2]string][]uint64
	for _, e := range entries {
		seq++
		e.Seq = seq
		v, err := e.seal(prev)
		if err != nil {
			return err
		}
		if err := b.Put(be64(seq), v); err != nil {
			return err
		}
		switch {
		case e.recordSeq != 0:
			// Its record holds this number (keepAuditSeqLocked): a
			// mismatch would lose the entry from the key's history.
			if e.recordSeq != seq {
				return fmt.Errorf("ledger: audit entry %d was numbered %d in its record", seq, e.recordSeq)
			}
		case e.Key != "" && (!near || !nearRecordAudit(tx, &numbered, e.Actor.Tenant, e.Key, seq)):
			if err := idx.Put(auditKeyIndex(e.Actor.Tenant, e.Key, seq), nil); err != nil {
				return err
			}
		}
		prev = e.Hash
	}
	return tx.Bucket(bucketMeta).Put(keyAuditIndexed, be64(seq))
}

// maxRecordAuditSeqs bounds Record.AuditSeqs: a record that would hold
// more moves them to the per-key index first.
const maxRecordAuditSeqs = 16

// keepAuditSeqLocked numbers e, the next audit entry of the transaction,
// and records that number in rec (Record.AuditSeqs) instead of in the
// per-key index; rec must be written in the same transaction, before any
// other audit entry is appended. The caller holds tx. On a journaling
// ledger it numbers nothing: the number is known only when the sealer
// chains the entry, which puts it in the per-key index.
func keepAuditSeqLocked(tx *ltx, rec *Record, e *AuditEntry) error {
	if tx.journal {
		return nil
	}
	var seq uint64
	if k, _ := tx.Bucket(bucketAudit).Cursor().Last(); len(k) == 8 {
		seq = beUint64(k)
	}
	if len(rec.AuditSeqs) >= maxRecordAuditSeqs {
		if err := indexRecordAuditLocked(tx, rec); err != nil {
			return err
		}
	}
	e.recordSeq = seq + 1
	rec.AuditSeqs = append(rec.AuditSeqs, e.recordSeq)
	return nil
}

// indexRecordAuditLocked moves the audit entries rec numbers, and the
// unindexed entries of its key near them (see auditNear), to the per-key
// index, one index entry each (when rec holds too many); the caller holds
// tx.
func indexRecordAuditLocked(tx BTx, rec *Record) error {
	near, err := nearAuditEntries(tx, rec.Tenant, rec.Key, rec.AuditSeqs)
	if err != nil {
		return err
	}
	idx := tx.Bucket(bucketAuditByKey)
	for _, seq := range append(near, rec.AuditSeqs...) {
		if err := idx.Put(auditKeyIndex(rec.Tenant, rec.Key, seq), nil); err != nil {
			return err
		}
	}
	rec.AuditSeqs = nil
	return nil
}

// keepRecordAuditLocked keeps the numbers of the audit entries rec
// numbers, before rec is deleted, as one per-key index entry: tenant \x00
// key \x00 (the newest of them) → all of them, 8 bytes BE each. A
// reader scans near them (auditNear) for the key's unindexed entries, as
// it does near a record's, so deleting a record reads no audit entry and
// writes one index entry, not one per entry. A build that reads the
// index by its keys alone finds the newest of them. PruneAudit removes
// the entry with its newest, indexing one by one the entries near it that
// it keeps. The caller holds tx.
func keepRecordAuditLocked(tx BTx, rec *Record) error {
	if len(rec.AuditSeqs) == 0 {
		return nil
	}
	seqs := slices.Sorted(slices.Values(rec.AuditSeqs))
	newest := seqs[len(seqs)-1]
	if k, _ := tx.Bucket(bucketAudit).Cursor().First(); len(k) == 8 && beUint64(k) > newest {
		// Pruned already, and no prune will see the newest go: the kept
		// entries near them are indexed one by one (seldom any: the
		// scan starts past the window).
		near, err := nearAuditEntries(tx, rec.Tenant, rec.Key, seqs)
		if err != nil {
			return err
		}
		idx := tx.Bucket(bucketAuditByKey)
		for _, seq := range near {
			if err := idx.Put(auditKeyIndex(rec.Tenant, rec.Key, seq), nil); err != nil {
				return err
			}
		}
		rec.AuditSeqs = nil
		return nil
	}
	v := make([]byte, 0, 8*len(seqs))
	for _, seq := range seqs {
		v = binary.BigEndian.AppendUint64(v, seq)
	}
	rec.AuditSeqs = nil
	return tx.Bucket(bucketAuditByKey).Put(auditKeyIndex(rec.Tenant, rec.Key, newest), v)
}

// auditSet decodes the value of a per-key index entry: empty for an
// entry of one audit entry (its number is in the key), else the numbers
// a deleted record kept (keepRecordAuditLocked).
func auditSet(k, v []byte) ([]uint64, error) {
	if len(v)%8 != 0 {
		return nil, fmt.Errorf("ledger: audit index entry %x: a value of %d bytes, not sequence numbers", k, len(v))
	}
	out := make([]uint64, 0, len(v)/8)
	for ; len(v) > 0; v = v[8:] {
		out = append(out, beUint64(v))
	}
	return out, nil
}

// auditNear is how close after one of the transitions its record numbers
// (Record.AuditSeqs) an entry of the key must land to be found by a scan
// of the log there instead of the per-key index: a call's answer, written
// with the next commit after its transition, and the replays of the same
// moment. Every entry of a key is in the index or at most auditNear
// entries after a transition its record numbers, or a deleted record of
// the key numbered (keepRecordAuditLocked), so AuditForKey reads at most
// maxRecordAuditSeqs × auditNear entries beyond the key's own for each
// operation the key has had.
const auditNear = 256

// nearRecordAudit reports whether entry seq of (tenant, key) lands at most
// auditNear entries after a transition that the key's record numbers.
// *memo keeps the records' numbers read (made when nil); the caller
// resets it when a record may have changed.
func nearRecordAudit(tx BTx, memo *map[[2]string][]uint64, tenant, key string, seq uint64) bool {
	k := [2]string{tenant, key}
	ts, ok := (*memo)[k]
	if !ok {
		var err error
		if ts, err = recordAuditSeqs(tx, tenant, key); err != nil {
			return false // indexed, then: never lost
		}
		if *memo == nil {
			*memo = map[[2]string][]uint64{}
		}
		(*memo)[k] = ts
	}
	for _, t := range ts {
		if seq > t && seq-t <= auditNear {
			return true
		}
	}
	return false
}

// recordAuditSeqs returns Record.AuditSeqs of (tenant, key), or nil when
// there is no record. It reads only that field, so a record of a newer
// result format (which getRecord refuses) still gives its numbers.
func recordAuditSeqs(tx BTx, tenant, key string) ([]uint64, error) {
	v := tx.Bucket(bucketRecords).Get(recordKey(tenant, key))
	if v == nil {
		return nil, nil
	}
	seqs, err := decodeAuditSeqs(v)
	if err != nil {
		return nil, fmt.Errorf("ledger: record %s/%s: %w", tenant, key, err)
	}
	return seqs, nil
}

// decodeAuditSeqs returns Record.AuditSeqs of a stored record, v, without
// the checks of DecodeRecord.
func decodeAuditSeqs(v []byte) ([]uint64, error) {
	plain, err := inflateRecord(v, maxRecordSize)
	if err != nil {
		return nil, fmt.Errorf("compressed record: %w", err)
	}
	if !bytes.Contains(plain, []byte(`"audit_seqs"`)) {
		return nil, nil // it numbers none (omitted when empty)
	}
	var r struct {
		AuditSeqs []uint64 `json:"audit_seqs"`
	}
	if err := json.Unmarshal(plain, &r); err != nil {
		return nil, err
	}
	return r.AuditSeqs, nil
}

// nearAuditEntries returns the sequence numbers of the entries of (tenant,
// key) at most auditNear entries after each of the transitions ts (the
// ones nearRecordAudit left out of the index), ascending.
func nearAuditEntries(tx BTx, tenant, key string, ts []uint64) ([]uint64, error) {
	if len(ts) == 0 {
		return nil, nil
	}
	ts = slices.Sorted(slices.Values(ts))
	quoted, err := json.Marshal(key)
	if err != nil {
		return nil, err
	}
	needle := append([]byte(`"key":`), quoted...)
	c := tx.Bucket(bucketAudit).Cursor()
	var out []uint64
	var scanned uint64 // the last sequence number read
	for _, t := range ts {
		from := max(t+1, scanned+1)
		for k, v := c.Seek(be64(from)); len(k) == 8 && beUint64(k) <= t+auditNear; k, v = c.Next() {
			scanned = beUint64(k)
			if !bytes.Contains(v, needle) {
				continue
			}
			var e struct {
				Key   string `json:"key"`
				Actor struct {
					Tenant string `json:"tenant"`
				} `json:"actor"`
			}
			if err := json.Unmarshal(v, &e); err != nil {
				return nil, fmt.Errorf("ledger: audit entry %x: %w", k, err)
			}
			if e.Key == key && e.Actor.Tenant == tenant {
				out = append(out, scanned)
			}
		}
		scanned = max(scanned, t+auditNear)
	}
	return out, nil
}

// auditKeyIndex is the per-key audit index key of entry seq of (tenant,
// key): tenant \x00 key \x00 seq (8 bytes BE).
func auditKeyIndex(tenant, key string, seq uint64) []byte {
	return append(recordKey(tenant, key+"\x00"), be64(seq)...)
}

// auditIndexed is the sequence number up to which every audit entry is in
// the per-key index.
func auditIndexed(tx BTx) uint64 {
	if v := tx.Bucket(bucketMeta).Get(keyAuditIndexed); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// indexAudit adds the entries after the index's watermark, up to through,
// to the per-key index and moves the watermark; the caller holds tx.
func indexAudit(tx BTx, through uint64) error {
	done := auditIndexed(tx)
	if done >= through {
		return nil
	}
	idx := tx.Bucket(bucketAuditByKey)
	c := tx.Bucket(bucketAudit).Cursor()
	for k, v := c.Seek(be64(done + 1)); k != nil && binary.BigEndian.Uint64(k) <= through; k, v = c.Next() {
		var e struct {
			Seq   uint64 `json:"seq"`
			Key   string `json:"key"`
			Actor struct {
				Tenant string `json:"tenant"`
			} `json:"actor"`
		}
		if err := json.Unmarshal(v, &e); err != nil {
			return fmt.Errorf("ledger: audit entry %x: %w", k, err)
		}
		if e.Key != "" {
			if err := idx.Put(auditKeyIndex(e.Actor.Tenant, e.Key, binary.BigEndian.Uint64(k)), nil); err != nil {
				return err
			}
		}
	}
	return tx.Bucket(bucketMeta).Put(keyAuditIndexed, be64(through))
}

// AuditLog returns up to limit entries with Seq > after, oldest first.
func (s *Ledger) AuditLog(ctx context.Context, after uint64, limit int) ([]AuditEntry, error) {
	if err := s.flushAudit(); err != nil {
		return nil, err
	}
	var out []AuditEntry
	err := s.view(func(tx *ltx) error {
		if after == math.MaxUint64 {
			return nil // nothing follows; after+1 would wrap to the start
		}
		c := tx.Bucket(bucketAudit).Cursor()
		for k, v := c.Seek(be64(after + 1)); k != nil && (limit <= 0 || len(out) < limit); k, v = c.Next() {
			var e AuditEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("ledger: audit entry %x: %w", k, err)
			}
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// AuditTail returns the newest n entries, oldest first.
func (s *Ledger) AuditTail(ctx context.Context, n int) ([]AuditEntry, error) {
	if err := s.flushAudit(); err != nil {
		return nil, err
	}
	var out []AuditEntry
	err := s.view(func(tx *ltx) error {
		c := tx.Bucket(bucketAudit).Cursor()
		for k, v := c.Last(); k != nil && len(out) < n; k, v = c.Prev() {
			var e AuditEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("ledger: audit entry %x: %w", k, err)
			}
			out = append(out, e)
		}
		return nil
	})
	slices.Reverse(out)
	return out, err
}

// AuditForKey returns the audit entries of (tenant, key) — its calls,
// replays, refusals, transitions and answers — oldest first: the newest
// limit of them (limit <= 0: all), and how many there are in all; the
// same entries, in the same order, before and after the key's record is
// deleted. It reads the key's record (the transitions it numbers, and at
// most auditNear entries after each), the per-key index (the other
// entries, and the transitions deleted records numbered, read as the
// record's are), and the
// entries appended since the index's watermark (which only a build
// without the index leaves behind): its cost is that of the key's own
// entries, not of the whole log.
// Buffered entries are written first, so the history is complete.
func (s *Ledger) AuditForKey(ctx context.Context, tenant, key string, limit int) ([]AuditEntry, int, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if err := s.flushAudit(); err != nil {
		return nil, 0, err
	}
	var out []AuditEntry
	total := 0
	err := s.view(func(tx *ltx) error {
		out, total = nil, 0
		audit := tx.Bucket(bucketAudit)
		var seqs []uint64
		prefix := recordKey(tenant, key+"\x00")
		var numbered []uint64 // transitions: the entries near them are the key's too
		c := tx.Bucket(bucketAuditByKey).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			if len(k) != len(prefix)+8 {
				continue
			}
			if len(v) == 0 {
				seqs = append(seqs, binary.BigEndian.Uint64(k[len(prefix):]))
				continue
			}
			set, err := auditSet(k, v) // a deleted record's
			if err != nil {
				return err
			}
			numbered = append(numbered, set...)
		}
		// The entries written with the record are numbered in it, and
		// those near them are found by a scan there.
		own, err := recordAuditSeqs(tx, tenant, key)
		if err != nil {
			return err
		}
		numbered = append(numbered, own...)
		near, err := nearAuditEntries(tx, tenant, key, numbered)
		if err != nil {
			return err
		}
		seqs = append(append(seqs, numbered...), near...)
		done := auditIndexed(tx)
		ac := audit.Cursor()
		for k, v := ac.Seek(be64(done + 1)); k != nil; k, v = ac.Next() {
			var e AuditEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("ledger: audit entry %x: %w", k, err)
			}
			if e.Key == key && e.Actor.Tenant == tenant {
				seqs = append(seqs, e.Seq)
			}
		}
		// Pruned entries are gone from the log (and from the index, not
		// from a record): count only the kept ones.
		first := uint64(math.MaxUint64)
		if k, _ := ac.First(); len(k) == 8 {
			first = beUint64(k)
		}
		slices.Sort(seqs)
		seqs = slices.Compact(seqs)
		seqs = slices.DeleteFunc(seqs, func(seq uint64) bool { return seq < first })
		total = len(seqs)
		if limit > 0 && len(seqs) > limit {
			seqs = seqs[len(seqs)-limit:]
		}
		for _, seq := range seqs {
			v := audit.Get(be64(seq))
			if v == nil {
				continue
			}
			var e AuditEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("ledger: audit entry %d: %w", seq, err)
			}
			if e.Key == key && e.Actor.Tenant == tenant {
				out = append(out, e)
			}
		}
		return nil
	})
	return out, total, err
}

// VerifyAudit checks the hash chain of the entries the ledger keeps (from
// entry 1, or from the anchor of a pruned log: see VerifyAuditChain) and
// returns the number of entries, or an error naming the first entry that
// does not verify.
func (s *Ledger) VerifyAudit(ctx context.Context) (int, error) {
	res, err := s.VerifyAuditChain(ctx, nil)
	return res.Entries, err
}
