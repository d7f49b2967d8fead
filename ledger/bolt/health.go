package bolt

import (
	"context"
	"errors"
	"fmt"
	"idemgate/ledger"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	bbolt "go.etcd.io/bbolt"
)

// MinFreeBytes is the free space on the ledger's filesystem below which
// Health reports that the ledger cannot commit: bbolt grows the file in
// steps of up to 16 MiB, so less than that may fail the next claim.
const MinFreeBytes = 16 << 20

// commitResult is the outcome of one commit (of a batch of claims, or a
// health probe) and the bytes of the pages it allocated.
type commitResult struct {
	at    time.Time
	err   error
	alloc int64
}

// maxProbeBytes bounds a health probe's padding (see probe): a failed
// commit larger than this is taken as cleared by a commit of this size.
const maxProbeBytes = 4 << 20

// noteCommit remembers the outcome of a commit for Health. Errors of a
// function of the batch (a refused claim) are not commit failures: only
// errors of the transaction itself are recorded. A failed commit stays
// the ledger's failure until a commit that allocated at least as many
// bytes succeeds: a small commit (a session's touch, the probe of old)
// can fit in the file's free pages while every create_order needs the
// file to grow, so its success does not mean that callers' writes work.
func (s *backend) noteCommit(err error, alloc int64) {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	now := time.Now()
	s.lastCommit = commitResult{at: now, err: err, alloc: alloc}
	if err != nil {
		need := min(max(alloc, s.failed.alloc), maxProbeBytes)
		s.failed = commitResult{at: now, err: err, alloc: need}
		return
	}
	s.lastOK = now
	if alloc >= s.failed.alloc {
		s.failed = commitResult{}
	}
}

// healthText is err as one bounded line without the ledger's path (the
// health body may be served without authentication).
func (s *backend) healthText(err error) string {
	var fe *fileError
	if errors.As(err, &fe) {
		// Not the advice: it names commands with the path.
		msg := "the ledger file: " + fe.kind.Error()
		if fe.detail != "" {
			msg += " (" + strings.ReplaceAll(fe.detail, s.path, "the ledger file") + ")"
		}
		return oneLine(msg, 300)
	}
	return oneLine(strings.ReplaceAll(err.Error(), s.path, "the ledger file"), 300)
}

// Health reports whether the ledger can be read and can commit what
// callers commit. It reads the file and looks at the free space of its
// filesystem (statfs). While a commit has failed and no commit as large
// has succeeded since, it is not OK, and it runs a probe commit as large
// as the failed one (see probe), so a recovered disk is seen without
// waiting for a client's call.
func (s *backend) Health(ctx context.Context) ledger.Health {
	h := ledger.Health{OK: true, MinFreeBytes: MinFreeBytes}
	if err := s.view(func(*bbolt.Tx) error { return nil }); err != nil {
		h.OK, h.Problem = false, "the ledger cannot be read: "+s.healthText(err)
	}
	var st syscall.Statfs_t
	statErr := syscall.Statfs(filepath.Dir(s.path), &st)
	if statErr == nil {
		h.FreeBytes = st.Bavail * uint64(st.Bsize)
	}
	s.healthMu.Lock()
	failed := s.failed
	s.healthMu.Unlock()
	if !failed.at.IsZero() && !s.readOnly {
		h.Probe = "ok"
		if err := s.probe(failed.alloc); err != nil {
			h.Probe = s.healthText(err)
		}
	}
	s.healthMu.Lock()
	last, lastOK, failed := s.lastCommit, s.lastOK, s.failed
	s.healthMu.Unlock()
	if !last.at.IsZero() {
		h.LastCommitAt = &last.at
	}
	if !failed.at.IsZero() {
		h.LastCommitError = s.healthText(failed.err)
		if h.OK {
			h.OK, h.Problem = false, "the ledger cannot commit: "+h.LastCommitError
		}
	}
	if !lastOK.IsZero() {
		h.LastCommitOKAt = &lastOK
	}
	if statErr == nil && h.FreeBytes < MinFreeBytes && h.OK {
		h.OK, h.Problem = false, fmt.Sprintf("only %d bytes free on the ledger's filesystem (below %d)", h.FreeBytes, uint64(MinFreeBytes))
	}
	return h
}

// probeInterval bounds how often health checks probe with a commit; a
// check within it reuses the last probe's outcome.
const probeInterval = time.Second

// probe commits a write of meta/health_probe padded to size bytes, at
// most once per probeInterval, and returns its error. It is committed
// alone (as background work is), so its padding never fails a caller's
// batch; once it succeeded, a second commit writes the key without the
// padding, which gives its pages back.
func (s *backend) probe(size int64) error {
	s.healthMu.Lock()
	if !s.probeAt.IsZero() && time.Since(s.probeAt) < probeInterval {
		err := s.probeErr
		s.healthMu.Unlock()
		return err
	}
	s.healthMu.Unlock()
	stamp := []byte(time.Now().UTC().Format(time.RFC3339Nano))
	put := func(v []byte) func(*bbolt.Tx) error {
		return func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyHealthProbe, v) }
	}
	padded := append(stamp[:len(stamp):len(stamp)], make([]byte, size)...)
	err := s.update(put(padded), true)
	if err == nil && size > 0 {
		s.update(put(stamp), true)
	}
	s.healthMu.Lock()
	s.probeAt, s.probeErr = time.Now(), err
	s.healthMu.Unlock()
	return err
}
