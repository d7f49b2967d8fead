// Package pgtest starts throwaway PostgreSQL clusters for tests: initdb
// and pg_ctl on a temporary directory, listening on a free loopback port
// (and a unix socket in that directory), run as the unprivileged user
// "nobody" when the tests run as root (PostgreSQL refuses to run as
// root), stopped and removed at the end. Each test gets a database of its
// own in one cluster per test binary:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
//	func TestX(t *testing.T) { url := pgtest.NewDatabase(t); … }
//
// A test that stops or restarts the server starts a cluster of its own
// (NewCluster). A CutProxy between a client and a database cuts the
// connection of a chosen transaction as it sends COMMIT.
//
// When PostgreSQL's server binaries are missing, NewDatabase skips the
// test with a hint to install them — except under CI (CI=true), where it
// fails it. The cluster trades durability for speed (fsync off): it is
// for tests only.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotInstalled is returned by Start when initdb or pg_ctl is missing.
var ErrNotInstalled = errors.New("pgtest: PostgreSQL's server binaries (initdb, pg_ctl) were found neither on PATH nor under /usr/lib/postgresql/*/bin; install them (Debian/Ubuntu: apt-get install postgresql)")

// Cluster is a running throwaway cluster.
type Cluster struct {
	dir  string // data directory, socket and log, removed by Stop
	bin  string // the directory of initdb and pg_ctl
	port int
	cred *syscall.Credential // the user it runs as, when not this process's
	n    atomic.Int64
	// durable: PostgreSQL's default durability (StartDurable), not
	// fsync, synchronous_commit and full_page_writes off.
	durable bool
}

// FindBinaries returns the directory holding initdb and pg_ctl: the
// newest /usr/lib/postgresql/N/bin (Debian's layout), else PATH.
func FindBinaries() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "pg_ctl")) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		d := filepath.Dir(p)
		if isExec(filepath.Join(d, "initdb")) {
			return d, nil
		}
	}
	return "", ErrNotInstalled
}

func version(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// Start initialises and starts a new cluster.
func Start() (*Cluster, error) { return start(false) }

// StartDurable is Start with PostgreSQL's default durability: every
// COMMIT waits for its WAL to be flushed (for benchmarks that count it).
func StartDurable() (*Cluster, error) { return start(true) }

func start(durable bool) (*Cluster, error) {
	bin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "idemgate-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, bin: bin, durable: durable}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("nobody")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: running as root, PostgreSQL must run as another user, and user nobody does not exist: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := c.run("initdb", "-D", c.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		c.port, err = freePort()
		if err == nil {
			err = c.start()
		}
		if err == nil {
			return c, nil
		}
		if attempt == 2 {
			log, _ := os.ReadFile(filepath.Join(dir, "log"))
			os.RemoveAll(dir)
			return nil, fmt.Errorf("%w\n%s", err, tail(string(log)))
		}
	}
}

func tail(s string) string {
	if len(s) > 2000 {
		return s[len(s)-2000:]
	}
	return s
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

// run runs one of the server binaries as the cluster's user.
func (c *Cluster) run(name string, args ...string) error {
	cmd := exec.Command(filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: %s %s: %v\n%s", name, strings.Join(args, " "), err, tail(string(out)))
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// URL returns the connection URL of database name in the cluster.
func (c *Cluster) URL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, name)
}

// Port is the cluster's loopback TCP port.
func (c *Cluster) Port() int { return c.port }

// CreateDatabase creates a new, empty database and returns its URL.
func (c *Cluster) CreateDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("t%d_%d", os.Getpid(), c.n.Add(1))
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	return c.URL(name), nil
}

// Restart stops the cluster (fast shutdown: connections are cut,
// transactions in flight roll back) and starts it again on the same port.
func (c *Cluster) Restart() error {
	return c.run("pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "log"), "-m", "fast", "-w", "-t", "60", "restart")
}

// Pause stops the server (fast shutdown), keeping its data: Resume
// starts it again on the same port.
func (c *Cluster) Pause() error {
	return c.run("pg_ctl", "-D", c.data(), "-m", "fast", "-w", "stop")
}

// Resume starts a paused cluster.
func (c *Cluster) Resume() error { return c.start() }

func (c *Cluster) start() error {
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=300", c.port, c.dir)
	if !c.durable {
		opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	}
	return c.run("pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60", "start", "-o", opts)
}

// Stop stops the cluster at once and removes its directory.
func (c *Cluster) Stop() error {
	err := c.run("pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop")
	if rmErr := os.RemoveAll(c.dir); err == nil {
		err = rmErr
	}
	return err
}

var shared struct {
	mu      sync.Mutex
	c       *Cluster
	err     error
	started bool
	inMain  bool // Main runs the tests, so it will stop the cluster
}

// Shared returns this test binary's cluster, started at the first call.
// Main stops it; outside Main it refuses, since nothing would (the
// cluster would outlive the test binary).
func Shared() (*Cluster, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.inMain {
		return nil, errors.New("pgtest: the shared cluster needs the package's TestMain to run the tests with pgtest.Main, which stops it: func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }")
	}
	if !shared.started {
		shared.started = true
		shared.c, shared.err = Start()
	}
	return shared.c, shared.err
}

// Main runs the tests and then stops the shared cluster, if one was
// started; it returns m.Run's exit code.
func Main(m *testing.M) int {
	shared.mu.Lock()
	shared.inMain = true
	shared.mu.Unlock()
	code := m.Run()
	shared.mu.Lock()
	c := shared.c
	shared.mu.Unlock()
	if c != nil {
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	return code
}

// Require returns the shared cluster, or skips t when PostgreSQL is not
// installed (fails it under CI=true) and fails it when the cluster does
// not start.
func Require(t testing.TB) *Cluster {
	t.Helper()
	c, err := Shared()
	if errors.Is(err, ErrNotInstalled) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI=true: a skip would hide the PostgreSQL tests)", err)
		}
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// NewCluster starts a cluster of t's own, stopped (and removed) when t
// ends, for a test that stops or restarts the server and must not disturb
// the others sharing the test binary's cluster. It skips or fails t as
// Require does when PostgreSQL is not installed.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	Require(t)
	c, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// NewDatabase returns the URL of a new, empty database in the shared
// cluster (see Require for when it skips).
func NewDatabase(t testing.TB) string {
	t.Helper()
	c := Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url, err := c.CreateDatabase(ctx)
	if err != nil {
		t.Fatalf("pgtest: creating a database: %v", err)
	}
	return url
}
