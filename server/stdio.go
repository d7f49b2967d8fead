package server

import (
	"context"
	"io"
	"log"
	"log/slog"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"
)

// StdioConfig is how ServeStdio serves one process's client.
type StdioConfig struct {
	// In and Out are the client's stream (the process's stdin and stdout).
	In  io.Reader
	Out io.Writer
	// Workers bounds concurrent tool calls.
	Workers int
	// Grace is how long a shutdown waits for the calls in flight to be
	// answered; it must exceed the longest call (see cmd serve).
	Grace  time.Duration
	Logger *slog.Logger
}

// ServeStdio serves s on cfg.In and cfg.Out until the input ends or ctx
// is done (a signal); then it stops reading, waits up to cfg.Grace for
// every request already read to be answered (StdioDrain), and returns.
// The error is the stdio server's (io.EOF or context.Canceled on an
// ordinary end).
func ServeStdio(ctx context.Context, s *mcpserver.MCPServer, cfg StdioConfig) error {
	logger := cfg.Logger
	drain := NewStdioDrain(cfg.In, cfg.Out)
	// Not cancelled by the signal: mcp-go would cancel the calls in flight.
	listen, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- listenStdio(listen, s, drain, cfg.Workers, logger) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		logger.Info("shutting down: answering the calls in flight", "grace", cfg.Grace)
	case <-drain.InputDone():
	}
	wait, stopWait := context.WithTimeout(context.Background(), cfg.Grace)
	defer stopWait()
	if left := drain.Drain(wait); left > 0 {
		logger.Error("shutdown: calls still running after the grace were not answered (their operations are recorded and reconciled)", "calls", left, "grace", cfg.Grace)
	}
	select {
	case err := <-errc:
		return err
	case <-time.After(5 * time.Second):
		cancel()
		return <-errc
	}
}

// listenStdio serves s on the drain's streams until its input ends or
// ctx is done. workers bounds concurrent tool calls (mcp-go's default is
// 5). The drain has checked every line (a refused one never reaches s; a
// message larger than MaxMessageBytes is answered with a parse error and
// dropped).
func listenStdio(ctx context.Context, s *mcpserver.MCPServer, drain *StdioDrain, workers int, logger *slog.Logger) error {
	std := mcpserver.NewStdioServer(s)
	std.SetErrorLogger(log.New(&slogWriter{logger}, "", 0))
	mcpserver.WithWorkerPoolSize(workers)(std)
	mcpserver.WithQueueSize(1000)(std)
	return std.Listen(ctx, drain.Reader(), drain.Writer())
}
