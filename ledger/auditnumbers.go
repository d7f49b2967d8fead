package ledger

import (
	"bytes"
	"context"
	"fmt"
)

// The audit log's numbers kept outside it. A hash chain proves every
// entry up to its head, but its head is known only to the log itself:
// removing the newest entries leaves a shorter chain that verifies. The
// ledger writes the numbers of its entries in other places too — each
// record numbers the transitions it went through (Record.AuditSeqs), the
// per-key index numbers the other entries of a key, and the index's
// watermark (audit_indexed) is the newest entry ever appended — so
// checkAuditNumbers holds the log to them: an entry numbered there, newer
// than the anchor, must be in the log. Someone who rewrites the file can
// rewrite those numbers too; the signed checkpoints (AuditCheckpoint),
// kept outside the ledger, are what proves the head then.

// numbersChunk bounds the records (or index entries) one read transaction
// of checkAuditNumbers looks at, as verifyChunk bounds the entries.
const numbersChunk = 4096

// checkAuditNumbers checks that every audit entry the ledger's records,
// its per-key index and its index watermark number is in the log, or was
// pruned (numbered at most the anchor). It reads in short transactions;
// an entry appended meanwhile is in the log, so it is never reported.
func (s *Ledger) checkAuditNumbers(ctx context.Context) error {
	// The watermark first: it catches a cut tail that no record numbers
	// (an answer, a replay, a refusal).
	err := s.view(func(tx *ltx) error {
		m := tx.Bucket(bucketMeta)
		if m == nil {
			return nil
		}
		v := m.Get(keyAuditIndexed)
		if len(v) != 8 {
			return nil
		}
		h, err := heldLocked(tx)
		if err != nil {
			return err
		}
		return h.check(beUint64(v), "the audit index's watermark (the newest entry appended)")
	})
	if err != nil {
		return err
	}
	for _, walk := range []struct {
		bucket  []byte
		numbers func(k, v []byte) (string, []uint64, error)
	}{
		{bucketRecords, func(k, v []byte) (string, []uint64, error) {
			seqs, err := decodeAuditSeqs(v)
			if err != nil {
				return "", nil, fmt.Errorf("ledger: record %s: %w", printableKey(k), err)
			}
			return "record " + printableKey(k), seqs, nil
		}},
		{bucketAuditByKey, func(k, v []byte) (string, []uint64, error) {
			if len(k) < 9 {
				return "", nil, nil
			}
			name := "the audit index of " + printableKey(k[:len(k)-9])
			if len(v) == 0 {
				return name, []uint64{beUint64(k[len(k)-8:])}, nil
			}
			seqs, err := auditSet(k, v)
			return name, seqs, err
		}},
	} {
		var after []byte // the last key checked
		for done := false; !done; {
			if err := ctx.Err(); err != nil {
				return err
			}
			err := s.view(func(tx *ltx) error {
				b := tx.Bucket(walk.bucket)
				if b == nil {
					done = true
					return nil
				}
				h, err := heldLocked(tx)
				if err != nil {
					return err
				}
				c := b.Cursor()
				k, v := c.First()
				if after != nil {
					if k, v = c.Seek(after); k != nil && bytes.Equal(k, after) {
						k, v = c.Next()
					}
				}
				for n := 0; ; n++ {
					if k == nil {
						done = true
						return nil
					}
					if n == numbersChunk {
						return nil
					}
					name, seqs, err := walk.numbers(k, v)
					if err != nil {
						return err
					}
					for _, seq := range seqs {
						if err := h.check(seq, name); err != nil {
							return err
						}
					}
					after = append(after[:0], k...)
					k, v = c.Next()
				}
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// auditHeld is what one transaction knows of the log: which entries
// it holds (pruned ones included).
type auditHeld struct {
	audit  Bucket
	pruned uint64 // the anchor's entry: those up to it were pruned
	last   uint64 // the newest entry
}

// heldLocked reads the log's bounds; the caller holds tx.
func heldLocked(tx *ltx) (auditHeld, error) {
	h := auditHeld{audit: tx.Bucket(bucketAudit)}
	a, err := readAnchor(tx)
	if err != nil {
		return h, err
	}
	if a != nil {
		h.pruned = a.Seq
	}
	if k, _ := h.audit.Cursor().Last(); len(k) == 8 {
		h.last = beUint64(k)
	}
	return h, nil
}

// check reports, as an error naming who numbers it, an audit entry seq
// that is neither in the log nor pruned.
func (h auditHeld) check(seq uint64, numberedBy string) error {
	if seq == 0 || seq <= h.pruned || h.audit.Get(be64(seq)) != nil {
		return nil
	}
	if seq > h.last {
		return fmt.Errorf("%s numbers audit entry %d, but the log ends at entry %d: its newest entries were removed", numberedBy, seq, h.last)
	}
	return fmt.Errorf("%s numbers audit entry %d, which is not in the log: it was removed", numberedBy, seq)
}

// printableKey is a tenant \x00 key collection key as tenant/key.
func printableKey(k []byte) string {
	return string(bytes.ReplaceAll(k, []byte{0}, []byte{'/'}))
}
