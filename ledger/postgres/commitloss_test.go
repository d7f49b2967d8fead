package postgres_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/ledger/postgres"
	"idemgate/ledger/postgres/pgtest"
)

// commitMsg is the simple-query message pgx sends to commit.
var commitMsg = []byte("Q\x00\x00\x00\x0bcommit\x00")

// cutProxy forwards connections to PostgreSQL and, when armed, cuts the
// one that sends COMMIT: after forwarding it (the commit happens, its
// reply is lost) or before (it never reaches the server).
type cutProxy struct {
	ln     net.Listener
	target string
	mode   atomic.Value // "", "after" or "before"
	cuts   atomic.Int64
	wg     sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	p.mode.Store("")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return p
}

func (p *cutProxy) serve(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	var mute atomic.Bool // the server's replies are dropped from now on
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 && !mute.Load() {
				if _, werr := c.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		c.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if bytes.Contains(chunk, commitMsg) {
				if mode := p.mode.Load().(string); mode != "" && p.mode.CompareAndSwap(mode, "") {
					mute.Store(true)
					if mode == "after" {
						s.Write(chunk)
						time.Sleep(300 * time.Millisecond) // the commit completes; its reply is dropped
					}
					p.cuts.Add(1)
					c.Close()
					s.Close()
					return
				}
			}
			if _, err := s.Write(chunk); err != nil {
				c.Close()
				return
			}
		}
		if err != nil {
			s.Close()
			return
		}
	}
}

// TestConnectionCutDuringCommit: a proxy between the ledger and
// PostgreSQL drops the connection as COMMIT is sent — once after the
// server got it (committed, reply lost), once before (never committed).
// Either way the claim's answer is the truth, read back from the
// database: committed means succeeded with the one effect, not committed
// means the transaction is run again; never a second effect, never an
// error for a transaction that committed.
func TestConnectionCutDuringCommit(t *testing.T) {
	url := pgtest.NewDatabase(t)
	c := pgtest.Require(t)
	p := newCutProxy(t, fmt.Sprintf("127.0.0.1:%d", c.Port()))
	purl := strings.Replace(url, fmt.Sprintf(":%d/", c.Port()), fmt.Sprintf(":%d/", p.ln.Addr().(*net.TCPAddr).Port), 1)
	s, err := postgres.Open(purl, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, mode := range []string{"after", "before"} {
		t.Run("cut "+mode+" the server got COMMIT", func(t *testing.T) {
			cl := ledger.Claim{Actor: ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}, Key: uuid.NewString(),
				Tool: "create_order", Fingerprint: "fp", OnLeaseExpiry: ledger.StateRetryable}
			apply := func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
				if err := tx.Put("effects", rec.Key+"/"+uuid.NewString(), []byte("x")); err != nil {
					return ledger.Outcome{}, err
				}
				return ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{"ok":true}`), Summary: "effect"}, nil
			}
			before := p.cuts.Load()
			p.mode.Store(mode)
			d, err := s.Execute(ctx, cl, apply)
			if p.cuts.Load() != before+1 {
				t.Fatalf("the proxy did not cut a COMMIT (Execute: %+v, %v)", d, err)
			}
			if err != nil {
				t.Fatalf("Execute across a connection cut during COMMIT: %v", err)
			}
			if d.Record == nil || d.Record.State != ledger.StateSucceeded {
				t.Fatalf("decision %+v, want succeeded", d)
			}
			again, err := s.Execute(ctx, cl, apply)
			if err != nil || again.Record == nil || again.Record.State != ledger.StateSucceeded {
				t.Fatalf("the same claim again: %+v, %v", again, err)
			}
			n := 0
			if err := s.View(ctx, func(tx ledger.Tx) error {
				return tx.Scan("effects", cl.Key+"/", false, func(string, []byte) (bool, error) { n++; return true, nil })
			}); err != nil {
				t.Fatal(err)
			}
			if n != 1 {
				t.Errorf("%d effects committed, want exactly 1", n)
			}
		})
	}
}
