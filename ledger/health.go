package ledger

import (
	"context"
	"time"
)

// Health is the ledger's write health, as /healthz reports it.
type Health struct {
	// OK is false when the ledger cannot be read, or cannot commit what
	// callers commit: a commit failed and no commit as large (a probe
	// commit included) has succeeded since; or the free space is below
	// MinFreeBytes.
	OK bool `json:"ok"`
	// Problem says why OK is false, in words that name nothing of the
	// deployment (it is served without authentication).
	Problem string `json:"problem,omitempty"`
	// Detail is what Problem leaves out because it names the deployment: a
	// database's error with its user, name and address. Public withholds it.
	Detail string `json:"detail,omitempty"`
	// LastCommitAt is when this process last committed (nil before the
	// first). LastCommitError is the error of a failed commit that no
	// commit as large has cleared since, even when smaller commits
	// succeeded after it.
	LastCommitAt    *time.Time `json:"last_commit_at,omitempty"`
	LastCommitError string     `json:"last_commit_error,omitempty"`
	// LastCommitOKAt is when a commit last succeeded.
	LastCommitOKAt *time.Time `json:"last_commit_ok_at,omitempty"`
	// Probe is the outcome of the probe commit run by this check, as
	// large as the failed commit: "ok", an error, or empty when none was
	// needed (no failed commit waits to be cleared).
	Probe string `json:"probe,omitempty"`
	// FreeBytes is the space available to this process on the ledger's
	// filesystem; MinFreeBytes the threshold (both 0 for a backend
	// without a filesystem).
	FreeBytes    uint64 `json:"free_bytes"`
	MinFreeBytes uint64 `json:"min_free_bytes"`
}

// DetailWithheld is Detail as Public shows it.
const DetailWithheld = "withheld: /healthz shows it to an approver's bearer token (Authorization: Bearer <token>)"

// Public is h as it may be shown to anyone: Detail is withheld.
func (h Health) Public() Health {
	if h.Detail != "" {
		h.Detail = DetailWithheld
	}
	return h
}

// HealthReporter is a Backend that knows its own health (a file's free
// space, its newest commit). The ledger's Health asks it when it can.
type HealthReporter interface {
	Health(ctx context.Context) Health
}

// Health implements Store: the backend's report when it is a
// HealthReporter; otherwise whether a read transaction succeeds.
func (s *Ledger) Health(ctx context.Context) Health {
	if hr, ok := s.b.(HealthReporter); ok {
		return hr.Health(ctx)
	}
	h := Health{OK: true}
	if err := s.View(ctx, func(Tx) error { return nil }); err != nil {
		h.OK, h.Problem = false, "the ledger cannot be read: "+err.Error()
	}
	return h
}
