package owner

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func tempPlace(t *testing.T) Place {
	dir := t.TempDir()
	return Place{Ledger: filepath.Join(dir, "l.db"), Socket: filepath.Join(dir, "l.db.sock"), Log: filepath.Join(dir, "l.db.owner.log")}
}

func mustListen(t *testing.T, p Place) *Listener {
	t.Helper()
	ln, err := Listen(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// reaches checks that a client dialing p is accepted by ln, and that the
// socket is this user's alone.
func reaches(t *testing.T, p Place, ln *Listener) {
	t.Helper()
	c, err := Dial(p, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ac, err := ln.Accept(func(err error) { t.Errorf("refused: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	ac.Close()
	fi, err := os.Lstat(p.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("the socket is %s, want a socket of mode 0600", fi.Mode())
	}
}

// TestListenAndClose: a client reaches the owner; Close removes the
// socket, and a client then finds no owner; the next owner listens again.
func TestListenAndClose(t *testing.T) {
	p := tempPlace(t)
	first, err := Listen(p)
	if err != nil {
		t.Fatal(err)
	}
	reaches(t, p, first)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(p.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Close left the socket: %v", err)
	}
	if _, err := Dial(p, time.Second); !errors.Is(err, ErrNoOwner) {
		t.Errorf("Dial with no owner: %v, want ErrNoOwner", err)
	}
	reaches(t, p, mustListen(t, p))
}

func TestListenReplacesAStaleSocket(t *testing.T) {
	t.Run("socket", func(t *testing.T) {
		p := tempPlace(t)
		dead, err := Listen(p)
		if err != nil {
			t.Fatal(err)
		}
		dead.SetUnlinkOnClose(false) // as a killed owner leaves it
		dead.Close()
		if _, err := os.Lstat(p.Socket); err != nil {
			t.Fatal(err)
		}
		if _, err := Dial(p, time.Second); !errors.Is(err, ErrNoOwner) {
			t.Errorf("Dial to a dead owner's socket: %v, want ErrNoOwner", err)
		}
		reaches(t, p, mustListen(t, p))
	})
	t.Run("file", func(t *testing.T) {
		p := tempPlace(t)
		if err := os.WriteFile(p.Socket, []byte("not a socket"), 0o644); err != nil {
			t.Fatal(err)
		}
		reaches(t, p, mustListen(t, p))
	})
}

// refusingOwner listens at p and answers the hellos of the connections it
// accepts with welcomes, in turn.
func refusingOwner(t *testing.T, p Place, welcomes ...Welcome) <-chan Hello {
	ln := mustListen(t, p)
	hellos := make(chan Hello, len(welcomes))
	go func() { // ends with the welcomes, or when the listener closes
		for _, w := range welcomes {
			c, err := ln.Accept(func(error) {})
			if err != nil {
				return
			}
			var h Hello
			if err := Receive(c, bufio.NewReader(c), &h); err != nil {
				t.Errorf("hello: %v", err)
			}
			hellos <- h
			Send(c, w)
			if !w.OK {
				c.Close()
			}
		}
	}()
	return hellos
}

func TestConnectRefused(t *testing.T) {
	p := tempPlace(t)
	refusingOwner(t, p, Welcome{Error: "another configuration"}, Welcome{OK: true})
	_, err := Connect(p, Hello{}, nil)
	var refused *RefusedError
	if !errors.As(err, &refused) || refused.Reason != "another configuration" {
		t.Errorf("Connect to an owner that refuses: %v, want a *RefusedError with its reason", err)
	}
}

func TestConnectAfterTheOwnerLeft(t *testing.T) {
	p := tempPlace(t)
	hellos := refusingOwner(t, p, Welcome{Error: "another build", Leaving: true}, Welcome{OK: true, PID: 7})
	c, err := Connect(p, Hello{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if c.Welcome.PID != 7 || len(hellos) != 2 {
		t.Errorf("Connect returned the welcome %+v after %d hellos, want the second's", c.Welcome, len(hellos))
	}
}

func TestConnectStartsAnOwner(t *testing.T) {
	p := tempPlace(t)
	started := 0
	c, err := Connect(p, Hello{}, func() error {
		started++
		refusingOwner(t, p, Welcome{OK: true, PID: 8})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if started != 1 || c.Welcome.PID != 8 {
		t.Errorf("started %d owners, welcome %+v; want one, the started one's", started, c.Welcome)
	}
	p = tempPlace(t)
	if _, err := Connect(p, Hello{}, func() error { return errors.New("no way") }); err == nil || err.Error() != "no way" {
		t.Errorf("Connect when the owner fails to start: %v, want its error", err)
	}
}
