package main

import (
	"context"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel"

	"idemgate/server"
	"idemgate/telemetry"
)

// startTelemetry sets up the telemetry of a process that runs the tools —
// a serve that opens its ledger itself (--own-ledger, PostgreSQL) or a
// ledger file's owner — from its OTEL_* environment (telemetry.FromEnv;
// the owner's is the environment of the client that started it). It
// returns nil when none is configured, and a stop that exports what is
// left (within 5 s). Export failures are logged as warnings.
func startTelemetry(logger *slog.Logger) (*telemetry.Provider, func(), error) {
	tel, err := telemetry.FromEnv(context.Background(), os.Getenv, server.Version)
	if err != nil || tel == nil {
		return nil, func() {}, err
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { logger.Warn("telemetry", "err", err) }))
	logger.Info("telemetry on (OTEL_*)")
	return tel, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(ctx); err != nil {
			logger.Warn("telemetry: last export", "err", err)
		}
	}, nil
}
