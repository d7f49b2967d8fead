package ledger

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// AuditEntry is one line of the audit log: a tool call (accepted, replayed
// or refused) or a state transition. Seq, PrevHash and Hash are set by the
// store when the entry is appended.
type AuditEntry struct {
	Seq         uint64    `json:"seq"`
	At          time.Time `json:"at"`
	Event       string    `json:"event"` // call, transition
	Actor       Actor     `json:"actor"`
	Tool        string    `json:"tool,omitempty"`
	Key         string    `json:"key,omitempty"`
	Fingerprint string    `json:"fingerprint,omitempty"`
	Decision    string    `json:"decision,omitempty"` // what the ledger or policy decided
	StateBefore State     `json:"state_before,omitempty"`
	StateAfter  State     `json:"state_after,omitempty"`
	Attempt     int       `json:"attempt,omitempty"`
	Downstream  string    `json:"downstream,omitempty"`
	DurationMS  float64   `json:"duration_ms,omitempty"`
	ErrorCode   string    `json:"error_code,omitempty"`
	Detail      string    `json:"detail,omitempty"`
	PrevHash    string    `json:"prev_hash"`
	Hash        string    `json:"hash"`
}

// chain fills e's PrevHash and Hash from the previous entry's hash. The
// hash covers the entry's JSON with Hash empty; JSON of a Go struct has a
// fixed field order, so the encoding is stable.
func (e *AuditEntry) chain(prevHash string) error {
	e.PrevHash = prevHash
	e.Hash = ""
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	e.Hash = hex.EncodeToString(sum[:])
	return nil
}

// verifyChain checks that e links to prevHash and that its hash is its own.
func (e AuditEntry) verifyChain(prevHash string) error {
	if e.PrevHash != prevHash {
		return fmt.Errorf("audit entry %d: prev_hash %.12s… does not match the previous entry's hash %.12s…", e.Seq, e.PrevHash, prevHash)
	}
	want := e.Hash
	if err := e.chain(prevHash); err != nil {
		return err
	}
	if e.Hash != want {
		return fmt.Errorf("audit entry %d: content does not match its hash (edited after it was written)", e.Seq)
	}
	return nil
}

// transitionEntry is the audit entry of a state change of rec.
func transitionEntry(now time.Time, a Actor, rec *Record, before State, decision string) AuditEntry {
	e := AuditEntry{
		At: now, Event: "transition", Actor: a, Tool: rec.Tool, Key: rec.Key,
		Fingerprint: rec.Fingerprint, Decision: decision, StateBefore: before,
		StateAfter: rec.State, Attempt: rec.Attempts,
	}
	e.Actor.Tenant = rec.Tenant
	if rec.Error != nil {
		e.ErrorCode = rec.Error.Code
	}
	return e
}
