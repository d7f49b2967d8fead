package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/loadgen"
)

// measureInProcess runs the in-process floor of `idemgate bench --floors`
// in a child process of its own (so that its CPU is that process's, not
// the load generator's), on a new ledger in a temporary directory in dir,
// removed afterwards.
func measureInProcess(ctx context.Context, dir string, stderr io.Writer) (*loadgen.InProcess, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(dir, "bench-in-process-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.CommandContext(ctx, exe, "bench", inProcessArg, "--db", filepath.Join(tmp, "ledger.db"))
	cmd.Stderr = stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	var p loadgen.InProcess
	if err := json.Unmarshal(out, &p); err != nil {
		return nil, fmt.Errorf("its report: %w", err)
	}
	return &p, nil
}

// inProcessCmd is `idemgate bench __in-process --db PATH [--fill N]
// [--warm N] [--creates N]`, the in-process floor of `bench --floors` and
// the at-size figures of BENCHMARKS.md: new create_orders made by the tool
// service in this process, with no MCP. On a new ledger file PATH (with
// the default settings and policy, its outbox directory beside it) it
// makes --fill create_orders from 64 concurrent callers, without
// confirmations (notify_customer false), then --warm ordinary ones, one at
// a time; then it measures --creates ordinary ones, one at a time, with
// the outbox's deliverer stopped (the create alone: its latency, CPU,
// commits and pages), and --creates more with the deliverer running, as
// in a server, until every confirmation is delivered (the CPU of a create
// and its delivery). It prints a loadgen.InProcess as JSON.
func inProcessCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench "+inProcessArg, flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := fs.String("db", "", "a new ledger file")
	fill := fs.Int("fill", 0, "create_orders made first, 64 at a time, without confirmations")
	warm := fs.Int("warm", 300, "create_orders made next, one at a time, not measured")
	creates := fs.Int("creates", 300, "create_orders measured in each phase")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *db == "":
		return usageError{errors.New("--db is required")}
	case *fill < 0 || *warm < 0 || *creates < 1:
		return usageError{errors.New("--fill and --warm must be at least 0, --creates at least 1")}
	}
	if _, err := os.Stat(*db); err == nil {
		return usageError{fmt.Errorf("--db %s exists: give a new file", *db)}
	}
	var l settings
	lfs := flag.NewFlagSet("in-process", flag.ContinueOnError)
	l.register(lfs)
	// The defaults, whatever the environment says: a webhook would take
	// the confirmations elsewhere, a configuration could hold them.
	if err := lfs.Parse([]string{"--db", *db, "--config", "", "--notify-webhook", "", "--orders-api", ""}); err != nil {
		return err
	}
	if err := l.load(); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*db), 0o700); err != nil {
		return err
	}
	store, err := bolt.Open(*db, l.ledgerOptions())
	if err != nil {
		return err
	}
	defer store.Close()
	outboxDir := filepath.Join(filepath.Dir(*db), "outbox")
	svc, err := l.service(store, outboxDir, 0, quietLogger(stderr))
	if err != nil {
		return err
	}
	defer svc.Close()

	ctx := context.Background()
	actor := ledger.Actor{Tenant: "bench", Principal: "bench", Role: "agent"}
	run := uuid.NewString()[:8]
	var seq atomic.Int64
	create := func(notify bool) error {
		n := seq.Add(1)
		args := map[string]any{"operation_key": uuid.NewString(), "customer_id": fmt.Sprintf("bench-%s-%d", run, n), "currency": "EUR",
			"items": []any{map[string]any{"sku": "coffee-1kg", "quantity": float64(1), "unit_price_minor": float64(1850)}}}
		if !notify {
			args["notify_customer"] = false
		}
		r := svc.Call(ctx, actor, "create_order", args, nil)
		if r.IsError || r.Replayed {
			return fmt.Errorf("create_order %d: %+v", n, r.Error)
		}
		return nil
	}
	var p loadgen.InProcess
	p.Creates = *creates

	t0 := time.Now()
	var wg sync.WaitGroup
	var fillErr error
	var once sync.Once
	left := atomic.Int64{}
	left.Store(int64(*fill))
	for range 64 {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := create(false); err != nil {
					once.Do(func() { fillErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if fillErr != nil {
		return fmt.Errorf("filling the ledger: %w", fillErr)
	}
	if *fill > 0 {
		p.FillSeconds = time.Since(t0).Seconds()
	}
	for range *warm {
		if err := create(true); err != nil {
			return err
		}
	}
	p.Records = *fill + *warm

	// The create alone.
	durs := make([]time.Duration, 0, *creates)
	s0, cpu0 := store.CommitStats(), processCPU()
	for range *creates {
		t := time.Now()
		if err := create(true); err != nil {
			return err
		}
		durs = append(durs, time.Since(t))
	}
	s1, cpu1 := store.CommitStats(), processCPU()
	slices.Sort(durs)
	var sum time.Duration
	for _, d := range durs {
		sum += d
	}
	p.P50 = us(durs[(len(durs)-1)/2])
	p.Mean = us(sum) / float64(len(durs))
	p.CPUPerCreate = us(cpu1-cpu0) / float64(*creates)
	if commits := s1.Commits - s0.Commits; commits > 0 {
		p.CommitsPerCreate = float64(commits) / float64(*creates)
		p.PagesPerCommit = float64(s1.PageWrites-s0.PageWrites) / float64(commits)
	}

	// A create and its delivery: the backlog of the phases before is
	// delivered first, outside the measurement. Waiting reads the outbox
	// directory every 10 ms, after the creates: a few hundred µs of CPU
	// in all.
	dctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { svc.Deliverer().Run(dctx); close(done) }()
	defer func() { stop(); <-done }()
	delivered := func(want int) error {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			n, err := loadgen.CountMessages(outboxDir)
			if err != nil || n >= want {
				return err
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%d of %d confirmations delivered after 2 minutes", n, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := delivered(*warm + *creates); err != nil {
		return err
	}
	cpu0 = processCPU()
	for range *creates {
		if err := create(true); err != nil { // the service kicks its deliverer
			return err
		}
	}
	if err := delivered(*warm + 2**creates); err != nil {
		return err
	}
	p.CPUPerCreateDelivered = us(processCPU()-cpu0) / float64(*creates)

	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(p)
}

// processCPU is this process's CPU time so far (user + system, every
// thread).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
