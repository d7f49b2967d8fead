package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"idemgate/owner"
)

// The owners of ledger files. A serve on stdio over a ledger file passes
// its client's messages to the file's owner process (see package owner),
// which outlives it: the tests put the owners' sockets and logs in a
// runtime directory of their own (XDG_RUNTIME_DIR, set by runMain), stop
// a test's owners when its sessions have ended, and stop any left over
// (from tests that start serve themselves) when all tests have run.

// runtimeDir is XDG_RUNTIME_DIR of the servers the tests start.
var runtimeDir string

// loggedOwners: the owners' logs a failed test has shown (test and ledger).
var loggedOwners sync.Map

// setUpOwners makes the runtime directory the servers use; the returned
// function stops the owners still running there and removes it.
func setUpOwners() (func(), error) {
	dir, err := os.MkdirTemp("", "igrt-") // short: socket paths are bounded
	if err != nil {
		return nil, err
	}
	runtimeDir = dir
	os.Setenv("XDG_RUNTIME_DIR", dir)
	return func() {
		socks, _ := filepath.Glob(filepath.Join(dir, "idemgate", "*.owner.sock"))
		for _, s := range socks {
			stopOwnerAt(owner.Place{Socket: s}) // no ledger named: waits until it no longer answers
		}
		os.RemoveAll(dir)
	}, nil
}

// pipedLedger returns the ledger file of serve, console (or bench) args
// whose server runs in an owner it starts: a file, no --own-ledger.
func pipedLedger(args []string) (string, bool) {
	if len(args) == 0 || args[0] != "serve" && args[0] != "bench" && args[0] != "console" || slices.Contains(args, "--own-ledger") {
		return "", false
	}
	db := ""
	for i, a := range args {
		switch {
		case a == "--url" || strings.HasPrefix(a, "--url="):
			return "", false
		case a == "--db" && i+1 < len(args):
			db = args[i+1]
		case strings.HasPrefix(a, "--db="):
			db = strings.TrimPrefix(a, "--db=")
		}
	}
	if db == "" || strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://") {
		return "", false
	}
	return db, true
}

// stopOwnerAtEnd stops, when the test ends (before the temporary
// directories made before this call are removed), the owner of the
// ledger that serve or bench args name, if their server passes its calls
// to one: an owner left running would write into a directory being
// removed (its deliverer's files).
func stopOwnerAtEnd(t testing.TB, args []string) {
	if db, ok := pipedLedger(args); ok {
		t.Cleanup(func() { stopOwner(t, db) })
	}
}

// ownerPID returns the process id of the owner of the ledger db, if one
// listens.
func ownerPID(db string) (int, bool) {
	p, err := owner.PlaceOf(db)
	if err != nil {
		return 0, false
	}
	return owner.PID(p)
}

// stopOwner ends the owner of the ledger db with SIGTERM, as an operator
// would, and waits until it has let the ledger go (it answers its calls
// in flight first): owner.Stop.
func stopOwner(t testing.TB, db string) {
	p, err := owner.PlaceOf(db)
	if err != nil {
		return
	}
	if err := stopOwnerAt(p); err != nil {
		t.Errorf("stopping the owner of %s: %v", db, err)
	}
}

// stopOwnerAt stops the owner at p (owner.Stop), and kills it when it
// did not exit within 30 s of its SIGTERM.
func stopOwnerAt(p owner.Place) error {
	pid, _ := owner.PID(p)
	err := owner.Stop(p, 30*time.Second)
	if err != nil && pid > 0 {
		syscall.Kill(pid, syscall.SIGKILL)
		waitGone(pid, 5*time.Second)
	}
	return err
}

// killOwner kills the owner of db with SIGKILL and waits until it is gone.
func killOwner(t testing.TB, db string) {
	t.Helper()
	pid, ok := ownerPID(db)
	if !ok {
		t.Fatalf("no owner listens for %s", db)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	if !waitGone(pid, 10*time.Second) {
		t.Fatalf("owner %d still runs after SIGKILL", pid)
	}
}

// waitGone waits for process pid to end.
func waitGone(pid int, timeout time.Duration) bool {
	return eventually(timeout, func() bool {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) || isZombie(pid)
	})
}

// procState is the state letter of process pid (R, S, T, Z…; 0 when it
// cannot be read).
func procState(pid int) byte {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0
	}
	return s[i+2]
}

// isZombie: the process has ended, all its threads too (so its files are
// closed), and waits for its parent to reap it (an owner's parent is the
// serve that started it, until that one ends). The first thread of a
// process shows Z while the others still exit.
func isZombie(pid int) bool {
	if procState(pid) != 'Z' {
		return false
	}
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	return err == nil && len(tasks) <= 1
}

// ownerLog returns the log of the owner of db.
func ownerLog(db string) string {
	p, err := owner.PlaceOf(db)
	if err != nil {
		return ""
	}
	b, _ := os.ReadFile(p.Log)
	return string(b)
}
