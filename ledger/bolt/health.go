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
// health probe).
type commitResult struct {
	at  time.Time
	err error
}

// noteCommit remembers the outcome of the newest commit for Health.
// Errors of a function of the batch (a refused claim) are not commit
// failures: only errors of the transaction itself are recorded.
func (s *backend) noteCommit(err error) {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	s.lastCommit = commitResult{at: time.Now(), err: err}
	if err == nil {
		s.lastOK = s.lastCommit.at
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

// Health reports whether the ledger can be read and can commit. It reads
// the file, looks at the free space of its filesystem (statfs) and, when
// the newest commit failed, runs a probe commit (it writes meta/health_probe)
// so that a recovered disk is seen without waiting for a client's call.
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
	last, lastOK := s.lastCommit, s.lastOK
	s.healthMu.Unlock()
	if last.err != nil && !s.readOnly {
		err := s.probe()
		h.Probe = "ok"
		if err != nil {
			h.Probe = s.healthText(err)
			if h.OK {
				h.OK, h.Problem = false, "the ledger cannot commit: "+h.Probe
			}
		}
		s.healthMu.Lock()
		last, lastOK = s.lastCommit, s.lastOK
		s.healthMu.Unlock()
	}
	if !last.at.IsZero() {
		h.LastCommitAt = &last.at
		if last.err != nil {
			h.LastCommitError = s.healthText(last.err)
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

// probe commits a write (meta/health_probe), at most once per
// probeInterval, and returns its error.
func (s *backend) probe() error {
	s.healthMu.Lock()
	if !s.probeAt.IsZero() && time.Since(s.probeAt) < probeInterval {
		err := s.probeErr
		s.healthMu.Unlock()
		return err
	}
	s.healthMu.Unlock()
	err := s.update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyHealthProbe, []byte(time.Now().UTC().Format(time.RFC3339Nano)))
	}, false)
	s.healthMu.Lock()
	s.probeAt, s.probeErr = time.Now(), err
	s.healthMu.Unlock()
	return err
}
