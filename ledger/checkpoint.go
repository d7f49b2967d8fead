package ledger

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Audit checkpoints. A hash chain whose head only the ledger knows cannot
// show that its newest entries were removed, nor that the whole chain was
// written again by someone who can write the file. A checkpoint is the
// head, signed with a key the ledger does not hold (Ed25519), and kept
// outside the ledger — the server writes one to its log now and then,
// audit export writes one after the entries it exported — so a later
// `idemgate audit verify --checkpoint FILE` proves that the chain still
// holds every entry the checkpoint covers, unchanged.
//
// A checkpoint names what it covers: a chain (Chain; "" is the ledger's
// one chain — a ledger that keeps a chain per tenant or per key names
// each), how many entries that chain had (Entries, which is the head's
// sequence number: chains are numbered from 1), and the head's hash.
// Whatever shape the chain takes, a checkpoint is checked the same way:
// the chain it names must still hold entry Entries, with hash Head.

// AuditCheckpoint is a signed statement that an audit chain held Entries
// entries, the last with hash Head, at time At.
type AuditCheckpoint struct {
	Chain   string    `json:"chain"`
	Entries uint64    `json:"entries"`
	Head    string    `json:"head"`
	At      time.Time `json:"at"`
	// KeyID names the signing key: the first 8 bytes, in hex, of the
	// SHA-256 of its public key (AuditKeyID).
	KeyID string `json:"key_id"`
	// Sig is the Ed25519 signature (base64) of the fields above
	// (signedText).
	Sig string `json:"sig"`
}

// ErrCheckpointPruned is returned by CheckAuditCheckpoint when the entry a
// checkpoint covers was pruned from the ledger: its archive (audit verify
// --archive) is what can prove it.
var ErrCheckpointPruned = errors.New("ledger: the checkpoint's head entry was pruned from the ledger")

// AuditKeyID returns the key id of pub as checkpoints name it.
func AuditKeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// SignAuditCheckpoint returns the checkpoint of entries 1-entries of chain
// (the ledger's: ""), whose last has hash head, signed with key at at.
func SignAuditCheckpoint(key ed25519.PrivateKey, chain string, entries uint64, head string, at time.Time) AuditCheckpoint {
	c := AuditCheckpoint{Chain: chain, Entries: entries, Head: head, At: at.UTC(),
		KeyID: AuditKeyID(key.Public().(ed25519.PublicKey))}
	c.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(key, c.signedText()))
	return c
}

// signedText is what a checkpoint's signature covers: every field but the
// signature, one a line, after a line naming the format.
func (c AuditCheckpoint) signedText() []byte {
	return []byte("idemgate audit checkpoint 1\n" + strconv.Quote(c.Chain) + "\n" +
		strconv.FormatUint(c.Entries, 10) + "\n" + c.Head + "\n" + c.At.UTC().Format(time.RFC3339Nano) + "\n" + c.KeyID + "\n")
}

// VerifySignature checks that pub signed c.
func (c AuditCheckpoint) VerifySignature(pub ed25519.PublicKey) error {
	if c.KeyID != AuditKeyID(pub) {
		return fmt.Errorf("checkpoint of %s: signed by key %s, not by the key given (%s)", c.At.Format(time.RFC3339), c.KeyID, AuditKeyID(pub))
	}
	sig, err := base64.StdEncoding.DecodeString(c.Sig)
	if err != nil || !ed25519.Verify(pub, c.signedText(), sig) {
		return fmt.Errorf("checkpoint of %s (entries 1-%d): the signature does not verify: the checkpoint was changed", c.At.Format(time.RFC3339), c.Entries)
	}
	return nil
}

// String is c as one line of JSON (how logs and exports carry it).
func (c AuditCheckpoint) String() string {
	b, _ := json.Marshal(c) // a struct of strings, numbers and a time: never fails
	return string(b)
}

// CheckAuditCheckpoint checks that the ledger's chain holds what c covers:
// entry c.Entries, with hash c.Head. It does not check c's signature
// (VerifySignature) nor the chain itself (VerifyAuditChain). Errors: the
// log is shorter than c, or its entry differs; ErrCheckpointPruned when
// that entry was pruned (only its archive can prove it); a chain this
// ledger does not keep.
func (s *Ledger) CheckAuditCheckpoint(ctx context.Context, c AuditCheckpoint) error {
	if c.Chain != "" {
		return fmt.Errorf("checkpoint of chain %q: this ledger keeps one audit chain (\"\")", c.Chain)
	}
	if c.Entries == 0 {
		return nil // the empty chain: every log continues it
	}
	if err := s.flushAudit(); err != nil {
		return err
	}
	return s.view(func(tx *ltx) error {
		h, err := heldLocked(tx)
		if err != nil {
			return err
		}
		a, err := readAnchor(tx)
		if err != nil {
			return err
		}
		when := c.At.Format(time.RFC3339)
		switch v := h.audit.Get(be64(c.Entries)); {
		case v != nil:
			var e struct {
				Hash string `json:"hash"`
			}
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("audit entry %d: not JSON: %w", c.Entries, err)
			}
			if e.Hash != c.Head {
				return fmt.Errorf("the checkpoint of %s says entry %d has hash %.12s…, the log's has %.12s…: the chain was written again since", when, c.Entries, c.Head, e.Hash)
			}
			return nil
		case a != nil && c.Entries == a.Seq:
			if a.Hash != c.Head {
				return fmt.Errorf("the checkpoint of %s says entry %d has hash %.12s…, the anchor says %.12s…: the chain was written again since", when, c.Entries, c.Head, a.Hash)
			}
			return nil
		case a != nil && c.Entries < a.Seq:
			return ErrCheckpointPruned
		case c.Entries > h.last:
			return fmt.Errorf("the checkpoint of %s says the log held %d entries, it ends at entry %d: entries %d-%d were removed", when, c.Entries, h.last, h.last+1, c.Entries)
		default:
			return fmt.Errorf("the checkpoint of %s covers entry %d, which is not in the log: it was removed", when, c.Entries)
		}
	})
}
