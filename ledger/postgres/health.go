package postgres

import (
	"context"
	"time"

	"idemgate/ledger"
)

var _ ledger.HealthReporter = (*backend)(nil)

// Health implements ledger.HealthReporter: one read of the database within
// ctx (bounded to 5 s), no retry, so /healthz answers promptly when the
// database is unreachable. The database's own disk is PostgreSQL's to
// watch (FreeBytes stays 0). The driver's error names the database's user,
// name and address: it is the Detail, not the Problem.
func (b *backend) Health(ctx context.Context) ledger.Health {
	if b.isClosed() {
		return ledger.Health{Problem: ledger.ErrClosed.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var v int
	if err := b.pool.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM idemgate_schema_version").Scan(&v); err != nil {
		return ledger.Health{Problem: "the PostgreSQL ledger cannot be read", Detail: connError(err).Error()}
	}
	if v > SchemaVersion() {
		return ledger.Health{Problem: newerSchema(v).Error()}
	}
	return ledger.Health{OK: true}
}
