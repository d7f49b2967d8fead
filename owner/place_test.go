package owner

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
)

// realDir is t.TempDir() with its symbolic links resolved, as PlaceOf
// resolves a ledger's directory.
func realDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// shortDir is a new directory of a short path (t.TempDir()'s may be too
// long for a socket in it), removed at the test's end.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "xdg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func mustPlace(t *testing.T, db string) Place {
	t.Helper()
	p, err := PlaceOf(db)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPlaceOfInRuntimeDir(t *testing.T) {
	xdg := shortDir(t)
	t.Setenv("XDG_RUNTIME_DIR", xdg)
	ledger := filepath.Join(realDir(t), "ledger.db")
	sum := sha256.Sum256([]byte(ledger))
	stem := filepath.Join(xdg, "idemgate", "ledger.db-"+hex.EncodeToString(sum[:8]))
	want := Place{Ledger: ledger, Socket: stem + ".owner.sock", Log: stem + ".owner.log"}
	if got := mustPlace(t, ledger); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	fi, err := os.Lstat(filepath.Join(xdg, "idemgate"))
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("$XDG_RUNTIME_DIR/idemgate is %s, want a directory of mode 0700", fi.Mode())
	}

	// A long name is cut; the hash of the whole path tells ledgers apart.
	long := filepath.Join(filepath.Dir(ledger), strings.Repeat("n", 40)+".db")
	sum = sha256.Sum256([]byte(long))
	if got, want := mustPlace(t, long).Socket, filepath.Join(xdg, "idemgate", strings.Repeat("n", 32)+"-"+hex.EncodeToString(sum[:8])+".owner.sock"); got != want {
		t.Errorf("the socket of %s is %s, want %s", long, got, want)
	}
}

func TestPlaceOfBesideTheLedger(t *testing.T) {
	dir := realDir(t)
	notMine := filepath.Join(dir, "not-mine")
	if err := os.Mkdir(notMine, 0o700); err != nil {
		t.Fatal(err)
	}
	xdgs := map[string]string{
		"unset":    "",
		"relative": "run/user",
		"missing":  filepath.Join(dir, "missing"),
		"a file":   filepath.Join(dir, "file"),
	}
	if err := os.WriteFile(xdgs["a file"], nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if os.Getuid() == 0 {
		if err := os.Chown(notMine, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		xdgs["another user's"] = notMine
	}
	ledger := filepath.Join(dir, "ledger.db")
	want := Place{Ledger: ledger, Socket: ledger + ".owner.sock", Log: ledger + ".owner.log"}
	for name, xdg := range xdgs {
		t.Run(name, func(t *testing.T) {
			t.Setenv("XDG_RUNTIME_DIR", xdg)
			if got := mustPlace(t, ledger); got != want {
				t.Errorf("got %+v, want %+v", got, want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(notMine, "idemgate")); err == nil {
		t.Error("PlaceOf made its directory in another user's XDG_RUNTIME_DIR")
	}
}

// The socket of a ledger whose name ends in .sock is not the ledger: a new
// owner removes what is at its socket's path.
func TestPlaceOfLedgerNamedSock(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "")
	ledger := filepath.Join(realDir(t), "ledger.sock")
	p := mustPlace(t, ledger)
	if p.Socket == p.Ledger || p.Log == p.Ledger {
		t.Errorf("the place of ledger %s is %+v", ledger, p)
	}
}

func TestPlaceOfTooLong(t *testing.T) {
	t.Run("beside", func(t *testing.T) {
		t.Setenv("XDG_RUNTIME_DIR", "")
		dir := realDir(t)
		// The longest that fits, and one byte more.
		name := strings.Repeat("l", maxSocketPath-len(dir)-len("/")-len(".owner.sock"))
		if p, err := PlaceOf(filepath.Join(dir, name)); err != nil || len(p.Socket) != maxSocketPath {
			t.Errorf("a socket path of %d bytes: %+v, %v", maxSocketPath, p, err)
		}
		_, err := PlaceOf(filepath.Join(dir, name+"l"))
		tooLong(t, err)
	})
	t.Run("in runtime dir", func(t *testing.T) {
		xdg := filepath.Join(realDir(t), strings.Repeat("x", maxSocketPath))
		if err := os.Mkdir(xdg, 0o700); err != nil {
			t.Fatal(err)
		}
		t.Setenv("XDG_RUNTIME_DIR", xdg)
		_, err := PlaceOf(filepath.Join(realDir(t), "ledger.db"))
		tooLong(t, err)
	})
}

func tooLong(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("PlaceOf took a socket path over the limit")
	}
	for _, w := range []string{"longer than a unix socket path may be (103 bytes)", "set XDG_RUNTIME_DIR to a short directory"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error %q does not say %q", err, w)
		}
	}
}

func TestPlaceOfTwoSpellings(t *testing.T) {
	dir := realDir(t)
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for name, xdg := range map[string]string{"beside": "", "in runtime dir": shortDir(t)} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("XDG_RUNTIME_DIR", xdg)
			want := mustPlace(t, filepath.Join(real, "ledger.db"))
			if want.Ledger != filepath.Join(real, "ledger.db") {
				t.Errorf("the ledger of the place is %s", want.Ledger)
			}
			t.Chdir(dir)
			for _, db := range []string{filepath.Join(dir, "link", "ledger.db"), "link/ledger.db", "real/../link/./ledger.db"} {
				if got := mustPlace(t, db); got != want {
					t.Errorf("the place of %s is %+v, want %+v", db, got, want)
				}
			}
		})
	}
}

// The owner opens its ledger writable, and the ledger's writer serves it
// on a socket of its own: the owner's socket is another, so a client that
// dials the owner reaches the owner.
func TestPlaceOfBesideTheLedgersWriter(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "")
	p := mustPlace(t, filepath.Join(shortDir(t), "ledger.db"))
	ln := mustListen(t, p)
	store, err := bolt.Open(p.Ledger, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c, err := Dial(p, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ln.SetDeadline(time.Now().Add(time.Second))
	ac, err := ln.Accept(func(error) {})
	if err != nil {
		t.Fatalf("the owner did not accept a client that dialed its socket %s: %v", p.Socket, err)
	}
	ac.Close()
}
