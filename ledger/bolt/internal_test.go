package bolt

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	bbolt "go.etcd.io/bbolt"

	"idemgate/ledger"
)

// Test access to the file below the ledger: the key layout of the
// ledger's collections (see ledger.Collections), written out here so the
// tests can damage, age or inspect a file as another build would.

var (
	bucketByTime    = []byte("by_time")
	bucketIssued    = []byte("issued")
	keyAuditIndexed = []byte("audit_indexed")
)

// auditFlushInterval is the ledger's flush interval of buffered audit
// entries.
const auditFlushInterval = 200 * time.Millisecond

func be64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func recordKey(tenant, key string) []byte { return []byte(tenant + "\x00" + key) }

func timeKey(t time.Time, tenant, key string) []byte {
	return append(be64(uint64(t.UnixNano())), recordKey(tenant, key)...)
}

func (f *File) view(fn func(*bbolt.Tx) error) error   { return f.be.view(fn) }
func (f *File) update(fn func(*bbolt.Tx) error) error { return f.be.update(fn, false) }

func auditIndexed(tx *bbolt.Tx) uint64 {
	if v := tx.Bucket(bucketMeta).Get(keyAuditIndexed); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func getRecord(tx *bbolt.Tx, tenant, key string) (*ledger.Record, error) {
	v := tx.Bucket(bucketRecords).Get(recordKey(tenant, key))
	if v == nil {
		return nil, nil
	}
	return ledger.DecodeRecord(v)
}

func putRecord(tx *bbolt.Tx, r *ledger.Record) error {
	v, err := ledger.EncodeRecord(r)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketRecords).Put(recordKey(r.Tenant, r.Key), v)
}

// chain fills e's PrevHash and Hash as the ledger does: SHA-256 of the
// entry's JSON with Hash empty.
func chain(e *ledger.AuditEntry, prevHash string) error {
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
func verifyChain(e ledger.AuditEntry, prevHash string) error {
	if e.PrevHash != prevHash {
		return fmt.Errorf("audit entry %d: prev_hash does not match", e.Seq)
	}
	want := e.Hash
	if err := chain(&e, prevHash); err != nil {
		return err
	}
	if e.Hash != want {
		return fmt.Errorf("audit entry %d: content does not match its hash", e.Seq)
	}
	return nil
}
