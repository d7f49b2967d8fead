package e2e

// Signed checkpoints of the audit chain's head (issue 18, defect 8): a
// server given a key logs them, audit export ends with one, and audit
// verify --checkpoint proves that the ledger still holds what they cover
// — against an attacker who rewrites the file consistently, whom nothing
// in the file can give away.

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// cutTailUnseen removes the newest entry as an attacker who knows the
// file would: with its index entries and the index's watermark, so that
// no number the ledger keeps names it. It returns the entry removed; the
// test needs one no record numbers.
func cutTailUnseen(t *testing.T, db string) uint64 {
	var cut uint64
	tamperAudit(t, db, func(audit, meta, records, byKey *bolt.Bucket) error {
		cut = lastSeq(audit)
		if recordNumbered(t, records) >= cut {
			t.Fatalf("a record numbers entry %d: the test wants the newest entry to be one no record numbers (a replay)", cut)
		}
		var drop [][]byte
		byKey.ForEach(func(k, v []byte) error {
			if bytes.HasSuffix(k, seqKey(cut)) && len(v) == 0 {
				drop = append(drop, k)
			}
			return nil
		})
		for _, k := range drop {
			if err := byKey.Delete(k); err != nil {
				return err
			}
		}
		if err := meta.Put([]byte("audit_indexed"), seqKey(cut-1)); err != nil {
			return err
		}
		return audit.Delete(seqKey(cut))
	})
	return cut
}

// rewriteChain changes entry from (one of its texts, old to new) and
// hashes it and every entry after it again, as an attacker who knows the
// chain's format would: the chain verifies, and says something else.
func rewriteChain(t *testing.T, db string, from uint64, old, new string) {
	tamperAudit(t, db, func(audit, _, _, _ *bolt.Bucket) error {
		var prev struct {
			Hash string `json:"hash"`
		}
		if err := json.Unmarshal(audit.Get(seqKey(from-1)), &prev); err != nil {
			return err
		}
		type kv struct{ k, v []byte }
		var out []kv
		c := audit.Cursor()
		for k, v := c.Seek(seqKey(from)); k != nil; k, v = c.Next() {
			b := append([]byte(nil), v...)
			if binary.BigEndian.Uint64(k) == from {
				if !bytes.Contains(b, []byte(old)) {
					t.Fatalf("entry %d has no %s: %s", from, old, b)
				}
				b = bytes.Replace(b, []byte(old), []byte(new), 1)
			}
			// prev_hash and hash are an entry's last two fields; the hash
			// is of the entry with it empty.
			body := b[:bytes.LastIndex(b, []byte(`,"prev_hash":"`))]
			sum := sha256.Sum256(fmt.Appendf(append([]byte(nil), body...), `,"prev_hash":%q,"hash":""}`, prev.Hash))
			hash := hex.EncodeToString(sum[:])
			out = append(out, kv{append([]byte(nil), k...), fmt.Appendf(append([]byte(nil), body...), `,"prev_hash":%q,"hash":%q}`, prev.Hash, hash)})
			prev.Hash = hash
		}
		for _, e := range out {
			if err := audit.Put(e.k, e.v); err != nil {
				return err
			}
		}
		return nil
	})
}

// checkpointKeys writes a new Ed25519 key pair as PEM files (the private
// one readable by its owner alone), as openssl genpkey and openssl pkey
// -pubout write them.
func checkpointKeys(t *testing.T) (private, public string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p8, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	pkix, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	private, public = filepath.Join(dir, "checkpoint.pem"), filepath.Join(dir, "checkpoint.pub.pem")
	if err := os.WriteFile(private, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(public, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pkix}), 0o644); err != nil {
		t.Fatal(err)
	}
	return private, public
}

// TestAuditCheckpoints: a server given a checkpoint key logs signed
// checkpoints of the chain's head, audit export ends with one, and audit
// verify --checkpoint proves the chain still holds what they cover: it
// fails when the tail was cut without a trace in the file, or the chain
// was written again (both of which pass a verify without it), and it
// still passes after a prune with the prune's archive.
func TestAuditCheckpoints(t *testing.T) {
	private, public := checkpointKeys(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	s := startServer(t, mcpGoModern, serverConfig{DB: db, Args: []string{"--audit-checkpoint-key", private, "--audit-checkpoint-every", "100ms"}})
	args := orderArgs(newKey(), "cust-checkpoint", coffee, nil)
	s.mustSucceed(t, "create_order", args)
	s.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-checkpoint-2", coffee, nil))
	s.mustSucceed(t, "create_order", args) // a replay: the newest entry, which no record numbers
	// The checkpoints are in the log of the ledger's owner, which serves
	// the calls of every stdio server on the file: wait for the periodic
	// one of the head.
	for n, same, deadline := -1, 0, time.Now().Add(10*time.Second); same < 4 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		if c := strings.Count(ownerLog(db), "audit_checkpoint="); c > 0 && c == n {
			same++
		} else {
			n, same = c, 0
		}
	}
	s.Close()
	logFile := filepath.Join(dir, "server.log")
	if err := os.WriteFile(logFile, []byte(ownerLog(db)), 0o600); err != nil {
		t.Fatal(err)
	}
	x := runCLI(t, 30*time.Second, "audit", "export", "--db", db, "--audit-checkpoint-key", private)
	lines := strings.Split(strings.TrimSpace(x.Stdout), "\n")
	if x.Code != 0 || !strings.HasPrefix(lines[len(lines)-1], `{"audit_checkpoint":{"chain":"","entries":`+fmt.Sprint(len(lines)-1)+`,`) {
		t.Fatalf("audit export with a key: exit %d; its last line %q is not the checkpoint of entry %d\n%s", x.Code, lines[len(lines)-1], len(lines)-1, x.Stderr)
	}
	export := filepath.Join(dir, "export.jsonl")
	if err := os.WriteFile(export, []byte(x.Stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	head := fmt.Sprintf("the newest covers entries 1-%d", len(lines)-1)
	if r := mustVerify(t, db, "--checkpoint", logFile, "--audit-checkpoint-key", public); !strings.Contains(r.Stdout, head) {
		t.Errorf("verify --checkpoint of the server's log: %q; want %q", r.Stdout, head)
	}
	mustVerify(t, db, "--checkpoint", export, "--archive", export, "--audit-checkpoint-key", public)
	// A checkpoint signed by another key, or changed, proves nothing.
	_, otherPublic := checkpointKeys(t)
	verifyFails(t, db, []string{"--checkpoint", logFile, "--audit-checkpoint-key", otherPublic}, "not by the key given")
	forged := filepath.Join(dir, "forged.log")
	if err := os.WriteFile(forged, []byte(strings.Replace(lines[len(lines)-1], `"entries":`, `"entries":1`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	verifyFails(t, db, []string{"--checkpoint", forged, "--audit-checkpoint-key", public}, "the signature does not verify")

	t.Run("cut_tail", func(t *testing.T) {
		cut := copyLedger(t, db)
		n := cutTailUnseen(t, cut)
		mustVerify(t, cut) // nothing in the file tells
		verifyFails(t, cut, []string{"--checkpoint", logFile, "--audit-checkpoint-key", public},
			fmt.Sprintf("held %d entries, it ends at entry %d: entries %d-%d were removed", n, n-1, n, n))
		verifyFails(t, cut, []string{"--checkpoint", export, "--audit-checkpoint-key", public}, "were removed")
	})
	t.Run("chain_written_again", func(t *testing.T) {
		forgedDB := copyLedger(t, db)
		rewriteChain(t, forgedDB, 2, `"principal":"local-agent"`, `"principal":"someone-else"`)
		mustVerify(t, forgedDB) // the chain is consistent
		verifyFails(t, forgedDB, []string{"--checkpoint", logFile, "--audit-checkpoint-key", public}, "the chain was written again since")
	})
	t.Run("after_prune", func(t *testing.T) {
		pruned := copyLedger(t, db)
		archive := filepath.Join(t.TempDir(), "archive.jsonl")
		// --before takes whole seconds: a second after the last entry, so
		// that the prune has entries to archive.
		time.Sleep(1100 * time.Millisecond)
		if r := runCLI(t, 30*time.Second, "audit", "prune", "--db", pruned, "--before", time.Now().UTC().Format(time.RFC3339), "--export", archive); r.Code != 0 {
			t.Fatalf("audit prune: exit %d %s%s", r.Code, r.Stdout, r.Stderr)
		}
		mustVerify(t, pruned)
		mustVerify(t, pruned, "--archive", archive, "--checkpoint", logFile, "--audit-checkpoint-key", public)
		mustVerify(t, pruned, "--checkpoint", export, "--audit-checkpoint-key", public) // its head is the anchor
	})
}

// copyLedger copies a closed ledger file to a new one.
func copyLedger(t *testing.T, db string) string {
	t.Helper()
	b, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "ledger.db")
	if err := os.WriteFile(out, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}
