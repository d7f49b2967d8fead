package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/postgres/pgtest"
)

// freezeProxy forwards TCP connections to target until it is frozen: then
// it stops forwarding, in both directions, whatever it reads, and closes
// nothing — a replica's process frozen, or a network that drops packets
// while a middlebox keeps the connections up, as seen from either end.
// thaw forwards what it held and goes on.
type freezeProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	thawed  chan struct{} // closed while not frozen
	conns   []net.Conn
	accepts atomic.Int64
}

func newFreezeProxy(t *testing.T, target string) *freezeProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezeProxy{ln: ln, target: target, thawed: make(chan struct{})}
	close(p.thawed)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.accepts.Add(1)
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go p.pipe(s, c)
			go p.pipe(c, s)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.thaw()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	return p
}

// url is dbURL (a database of cluster c) reached through the proxy.
func (p *freezeProxy) url(c *pgtest.Cluster, dbURL string) string {
	return strings.Replace(dbURL, fmt.Sprintf(":%d/", c.Port()), fmt.Sprintf(":%d/", p.ln.Addr().(*net.TCPAddr).Port), 1)
}

func (p *freezeProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
		p.thawed = make(chan struct{})
	default: // already frozen
	}
}

func (p *freezeProxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
	default:
		close(p.thawed)
	}
}

func (p *freezeProxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.thawed
}

// pipe copies src to dst, holding each chunk while the proxy is frozen.
func (p *freezeProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			<-p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				src.Close()
			}
			return
		}
	}
}

// TestFrozenWriterStopsNoOne: replica A's write transaction goes silent
// mid-transaction (a proxy between A and PostgreSQL stops forwarding,
// closing nothing). Replica B's writes go on meanwhile, at once: no lock
// of A's stands in their way (the server ends A's session once it has sat
// idle in its transaction for idle_in_transaction_session_timeout). A
// itself gives up on the silent connection after its stall timeout
// instead of hanging: its Update either committed (once) or reports an
// error and wrote nothing. Once the network is back, A writes again
// without being reopened.
func TestFrozenWriterStopsNoOne(t *testing.T) {
	c := pgtest.Require(t)
	url := pgtest.NewDatabase(t)
	p := newFreezeProxy(t, fmt.Sprintf("127.0.0.1:%d", c.Port()))
	a, err := Open(p.url(c, url), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.be.stall = 3 * time.Second // the default is a minute
	b, err := Open(url, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()

	inside, frozen := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	aDone := make(chan error, 1)
	aStart := time.Now()
	go func() {
		aDone <- a.Update(ctx, func(tx ledger.Tx) error {
			if runs.Add(1) == 1 {
				close(inside) // the transaction has begun
				<-frozen
			}
			if _, err := tx.Get("effects", "x"); err != nil { // a round trip through the frozen proxy
				return err
			}
			return tx.Put("effects", "a", []byte("A"))
		})
	}()
	select {
	case <-inside:
	case <-time.After(20 * time.Second):
		t.Fatal("A's transaction did not start")
	}
	p.freeze()
	close(frozen)

	// B writes at once, several times, while A's transaction is frozen.
	bStart := time.Now()
	bctx, cancel := context.WithTimeout(ctx, 40*time.Second)
	defer cancel()
	for i := range 10 {
		err = b.Update(bctx, func(tx ledger.Tx) error { return tx.Put("effects", fmt.Sprintf("b%d", i), []byte("B")) })
		if err != nil {
			t.Fatalf("B's write beside a frozen writer: %v (after %s)", err, time.Since(bStart))
		}
	}
	waited := time.Since(bStart)
	t.Logf("B's 10 writes took %s beside the frozen writer", waited.Round(time.Millisecond))
	if waited > 2*time.Second {
		t.Errorf("B's 10 writes took %s beside a frozen writer: they waited for it", waited)
	}

	// A gives up on its own: a stalled round trip (3 s here), then reruns
	// for up to retryFor while the network is still frozen.
	var aErr error
	select {
	case aErr = <-aDone:
	case <-time.After(40 * time.Second):
		p.thaw()
		t.Fatalf("A's Update still hangs %s after its connection went silent", time.Since(aStart))
	}
	t.Logf("A's Update returned after %s: %v", time.Since(aStart).Round(time.Millisecond), aErr)
	if aErr != nil && !errors.Is(aErr, errStalled) && !strings.Contains(aErr.Error(), "postgres:") {
		t.Errorf("A's Update failed with %v, want a connection error", aErr)
	}
	p.thaw()

	// What was committed is what the answers said, and A works again.
	if err := a.Update(ctx, func(tx ledger.Tx) error { return tx.Put("effects", "a2", []byte("A")) }); err != nil {
		t.Fatalf("A's next write once the network is back: %v", err)
	}
	got := map[string]string{}
	if err := b.View(ctx, func(tx ledger.Tx) error {
		return tx.Scan("effects", "", false, func(k string, v []byte) (bool, error) { got[k] = string(v); return true, nil })
	}); err != nil {
		t.Fatal(err)
	}
	_, aWrote := got["a"]
	if got["b9"] != "B" || got["a2"] != "A" || aWrote != (aErr == nil) {
		t.Errorf("committed %v; A's frozen Update said %v: want b0…b9 and a2, and a exactly when A said it committed", got, aErr)
	}
}

// TestSessionBounds: every connection of the pool starts with the
// session bounds, and a URL parameter of the same name wins.
func TestSessionBounds(t *testing.T) {
	url := pgtest.NewDatabase(t)
	ctx := context.Background()
	show := func(d *DB, name string) string {
		t.Helper()
		var v string
		if err := d.be.pool.QueryRow(ctx, "SHOW "+name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	d, err := Open(url, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for name, want := range map[string]string{"idle_in_transaction_session_timeout": "10s", "lock_timeout": "20s", "statement_timeout": "30s", "tcp_keepalives_idle": "15", "tcp_keepalives_count": "3"} {
		if got := show(d, name); got != want {
			t.Errorf("SHOW %s = %q, want %q", name, got, want)
		}
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	o, err := Open(url+sep+"lock_timeout=3s", ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if got := show(o, "lock_timeout"); got != "3s" {
		t.Errorf("with lock_timeout=3s in the URL, SHOW lock_timeout = %q", got)
	}
	if got := show(o, "statement_timeout"); got != "30s" {
		t.Errorf("with another bound in the URL, SHOW statement_timeout = %q, want the default 30s", got)
	}
}
