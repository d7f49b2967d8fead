package main

// Signed checkpoints of the audit chain's head (ledger.AuditCheckpoint):
// the key file, the server's checkpoint log lines, the export's checkpoint
// line, and reading them back for audit verify --checkpoint.

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"idemgate/ledger"
)

// checkpointKey is the key that signs and checks audit checkpoints. It
// lives in a file outside the ledger (the point of a checkpoint is that
// whoever can rewrite the ledger cannot sign one), readable by the server
// alone. The file is PEM: a private key (PKCS #8 "PRIVATE KEY", as
// `openssl genpkey -algorithm ed25519 -out FILE` writes it) signs and
// checks; its public key ("PUBLIC KEY", `openssl pkey -in FILE -pubout`)
// only checks — what an auditor's machine needs.
type checkpointKey struct {
	file string
	priv ed25519.PrivateKey // nil for a public key file
	pub  ed25519.PublicKey
}

// loadCheckpointKey reads the key file name. A private key file that
// others than its owner may read is refused: anyone who can read it can
// sign checkpoints of a rewritten chain.
func loadCheckpointKey(name string) (*checkpointKey, error) {
	fi, err := os.Stat(name)
	if err != nil {
		return nil, fmt.Errorf("audit checkpoint key: %w", err)
	}
	if fi.Size() > 64<<10 {
		return nil, fmt.Errorf("audit checkpoint key %s: larger than 64 KiB, not a key file", name)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("audit checkpoint key: %w", err)
	}
	const how = "want an Ed25519 key in PEM (make one with: openssl genpkey -algorithm ed25519 -out FILE; its public key: openssl pkey -in FILE -pubout)"
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("audit checkpoint key %s: not PEM; %s", name, how)
	}
	k := &checkpointKey{file: name}
	switch blk.Type {
	case "PRIVATE KEY":
		if fi.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("audit checkpoint key %s: a private key that others may read (mode %04o); run chmod 600 %s", name, fi.Mode().Perm(), name)
		}
		key, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		priv, ok := key.(ed25519.PrivateKey)
		if err != nil || !ok {
			return nil, fmt.Errorf("audit checkpoint key %s: not an Ed25519 private key; %s", name, how)
		}
		k.priv, k.pub = priv, priv.Public().(ed25519.PublicKey)
	case "PUBLIC KEY":
		key, err := x509.ParsePKIXPublicKey(blk.Bytes)
		pub, ok := key.(ed25519.PublicKey)
		if err != nil || !ok {
			return nil, fmt.Errorf("audit checkpoint key %s: not an Ed25519 public key; %s", name, how)
		}
		k.pub = pub
	default:
		return nil, fmt.Errorf("audit checkpoint key %s: a PEM %q block; %s", name, blk.Type, how)
	}
	return k, nil
}

// checkpointLogKey is the attribute of the server's log line that carries
// a checkpoint's JSON (readCheckpoints finds it there).
const checkpointLogKey = "audit_checkpoint"

// checkpointLoop writes a signed checkpoint of the audit chain's head to
// w (the server's stderr) as a log line, whatever the log level — it is
// evidence, not a diagnostic: once when it starts, then every interval
// when the head moved, and a last one when ctx ends (the shutdown, after
// the last call was answered). A log shipped off the machine keeps them
// where the ledger's writer cannot reach. It exits when ctx ends.
func checkpointLoop(ctx context.Context, store ledger.Store, key ed25519.PrivateKey, every time.Duration, w io.Writer, logger *slog.Logger) {
	out := slog.New(slog.NewTextHandler(w, nil))
	var last uint64
	write := func(ctx context.Context) {
		tail, err := store.AuditTail(ctx, 1)
		if err != nil {
			logger.Warn("audit checkpoint: reading the chain's head", "err", err)
			return
		}
		if len(tail) == 0 || tail[0].Seq == last {
			return
		}
		head := tail[0]
		out.Info("audit checkpoint", checkpointLogKey, ledger.SignAuditCheckpoint(key, "", head.Seq, head.Hash, time.Now()).String())
		last = head.Seq
	}
	write(ctx)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			write(final)
			cancel()
			return
		case <-t.C:
			write(ctx)
		}
	}
}

// exportCheckpoint is the line audit export writes after its entries: a
// checkpoint of the last one, {"audit_checkpoint":{…}}.
type exportCheckpoint struct {
	Checkpoint *ledger.AuditCheckpoint `json:"audit_checkpoint"`
}

// readCheckpoints returns the checkpoints in a file: the server's log
// lines (audit_checkpoint="…"), an export's checkpoint lines, or lines of
// a checkpoint's JSON alone. Other lines are skipped; a file without any
// checkpoint is an error.
func readCheckpoints(name string) ([]ledger.AuditCheckpoint, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []ledger.AuditCheckpoint
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20) // export lines can be long
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		var text string
		if i := strings.Index(line, checkpointLogKey+`="`); i >= 0 {
			q, err := strconv.QuotedPrefix(line[i+len(checkpointLogKey)+1:])
			if err != nil {
				return nil, fmt.Errorf("line %d: a checkpoint cut short: %w", n, err)
			}
			text, _ = strconv.Unquote(q)
		} else if strings.HasPrefix(line, `{"audit_checkpoint":`) {
			var x exportCheckpoint
			if err := json.Unmarshal([]byte(line), &x); err != nil || x.Checkpoint == nil {
				return nil, fmt.Errorf("line %d: not a checkpoint: %v", n, err)
			}
			out = append(out, *x.Checkpoint)
			continue
		} else if strings.HasPrefix(line, `{"chain":`) {
			text = line
		} else {
			continue
		}
		var c ledger.AuditCheckpoint
		if err := json.Unmarshal([]byte(text), &c); err != nil {
			return nil, fmt.Errorf("line %d: not a checkpoint: %w", n, err)
		}
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no audit checkpoint in it (want the server's log lines with audit_checkpoint=, or an audit export made with --audit-checkpoint-key)")
	}
	return out, nil
}

// checkpointCheck is what audit verify --checkpoint checks: the
// checkpoints read, each proven by an archive's entry (see) or by the
// ledger (check). The zero value checks nothing.
type checkpointCheck struct {
	list   []ledger.AuditCheckpoint
	proven []bool
	files  []string
}

// read adds the checkpoints of file name, each of which key must have
// signed.
func (cc *checkpointCheck) read(name string, key *checkpointKey) error {
	list, err := readCheckpoints(name)
	if err != nil {
		return err
	}
	for _, c := range list {
		if err := c.VerifySignature(key.pub); err != nil {
			return err
		}
	}
	cc.list = append(cc.list, list...)
	cc.proven = append(cc.proven, make([]bool, len(list))...)
	cc.files = append(cc.files, name)
	return nil
}

// see checks the checkpoints that cover e, an entry of an archive.
func (cc *checkpointCheck) see(e ledger.AuditEntry) error {
	for i, c := range cc.list {
		if c.Chain != "" || c.Entries != e.Seq {
			continue
		}
		if c.Head != e.Hash {
			return fmt.Errorf("the checkpoint of %s says entry %d has hash %.12s…, the archive's has %.12s…: the chain was written again since", c.At.Format(time.RFC3339), e.Seq, c.Head, e.Hash)
		}
		cc.proven[i] = true
	}
	return nil
}

// check checks, in the ledger, the checkpoints no archive proved.
func (cc *checkpointCheck) check(ctx context.Context, store ledger.Store) error {
	for i, c := range cc.list {
		if cc.proven[i] {
			continue
		}
		err := store.CheckAuditCheckpoint(ctx, c)
		if errors.Is(err, ledger.ErrCheckpointPruned) {
			return fmt.Errorf("the checkpoint of %s covers entry %d, which was pruned from the ledger: pass its archive with --archive", c.At.Format(time.RFC3339), c.Entries)
		}
		if err != nil {
			return err
		}
		cc.proven[i] = true
	}
	return nil
}

// report says what the checkpoints proved.
func (cc *checkpointCheck) report(w io.Writer) {
	if len(cc.list) == 0 {
		return
	}
	newest := cc.list[0]
	for _, c := range cc.list {
		if c.Entries > newest.Entries {
			newest = c
		}
	}
	fmt.Fprintf(w, "checkpoints: %d from %s, signed by key %s, all held by the chain; the newest covers entries 1-%d (%s)\n",
		len(cc.list), strings.Join(cc.files, ", "), newest.KeyID, newest.Entries, newest.At.Format(time.RFC3339))
}
