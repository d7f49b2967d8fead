package ledger

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
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

// appendAudit adds entries to the hash chain and to the per-key index;
// the caller holds tx.
func appendAudit(tx BTx, entries ...AuditEntry) error {
	if len(entries) == 0 {
		return nil
	}
	b := tx.Bucket(bucketAudit)
	var seq uint64
	prev := ""
	if k, v := b.Cursor().Last(); k != nil {
		var last AuditEntry
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
	for _, e := range entries {
		seq++
		e.Seq = seq
		if err := e.chain(prev); err != nil {
			return err
		}
		v, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if err := b.Put(be64(seq), v); err != nil {
			return err
		}
		if e.Key != "" {
			if err := idx.Put(auditKeyIndex(e.Actor.Tenant, e.Key, seq), nil); err != nil {
				return err
			}
		}
		prev = e.Hash
	}
	return tx.Bucket(bucketMeta).Put(keyAuditIndexed, be64(seq))
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
// limit of them (limit <= 0: all), and how many there are in all. It reads
// the per-key index, so its cost is that of the key's own entries, not of
// the whole log (plus a scan of the entries appended since the index's
// watermark, which only a build without the index leaves behind).
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
		// A file of the build before the index, opened read-only, has no
		// index bucket: its watermark is 0, so the scan below reads it all.
		if idx := tx.Bucket(bucketAuditByKey); idx != nil {
			c := idx.Cursor()
			for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
				if len(k) == len(prefix)+8 {
					seqs = append(seqs, binary.BigEndian.Uint64(k[len(prefix):]))
				}
			}
		}
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
