package owner

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// RefusedError is the owner's refusal of a hello, in its words.
type RefusedError struct {
	Reason string
	// leaving: the owner refused this client's build or configuration
	// and is exiting (Welcome.Leaving), so that the next attempt starts
	// an owner of the client's own.
	leaving bool
}

func (e *RefusedError) Error() string { return e.Reason }

// Conn is a connection to the owner past its welcome: MCP messages, one
// per line, both ways.
type Conn struct {
	*net.UnixConn
	R       *bufio.Reader // reads c: it may hold bytes past the welcome
	Welcome Welcome
}

// Connect opens a connection to the owner of p's ledger and says hello.
// When no owner listens it calls start, which starts one, and dials again
// until one answers. An owner that ends during the hello (killed, or
// leaving for a client of another build or configuration) is tried again,
// up to three times. A refusal is a *RefusedError. A start that returns
// ErrNoOwner (a client that starts none) ends it with that error.
func Connect(p Place, h Hello, start func() error) (*Conn, error) {
	var err error
	for attempt := range 3 {
		var c *Conn
		if c, err = connect(p, h, start); err == nil {
			return c, nil
		}
		var refused *RefusedError
		if errors.Is(err, errSilent) || errors.Is(err, ErrNoOwner) || errors.As(err, &refused) && !refused.leaving {
			return nil, err // a silent owner is not waited for twice
		}
		time.Sleep(time.Duration(attempt+1) * 50 * time.Millisecond)
	}
	return nil, err
}

func connect(p Place, h Hello, start func() error) (*Conn, error) {
	c, err := Dial(p, helloTimeout)
	if errors.Is(err, ErrNoOwner) {
		if err := start(); err != nil {
			return nil, err
		}
		// The owner listens before it says it is ready; another that
		// won the start may take a moment longer.
		for wait := 10 * time.Millisecond; ; wait *= 2 {
			if c, err = Dial(p, helloTimeout); !errors.Is(err, ErrNoOwner) || wait > 2*time.Second {
				break
			}
			time.Sleep(wait)
		}
	}
	if err != nil {
		if errors.Is(err, ErrNoOwner) {
			return nil, fmt.Errorf("no owner answers on %s after one was started", p.Socket)
		}
		return nil, err
	}
	h.Protocol, h.Build, h.PID = protocol, Build(), os.Getpid()
	conn := &Conn{UnixConn: c, R: bufio.NewReaderSize(c, 64<<10)}
	if err := Send(c, h); err != nil {
		c.Close()
		return nil, fmt.Errorf("owner of %s: hello: %w", p.Ledger, err)
	}
	if err := Receive(c, conn.R, &conn.Welcome); err != nil {
		c.Close()
		return nil, fmt.Errorf("owner of %s did not answer: %w", p.Ledger, err)
	}
	if !conn.Welcome.OK {
		c.Close()
		return nil, &RefusedError{Reason: conn.Welcome.Error, leaving: conn.Welcome.Leaving}
	}
	return conn, nil
}
