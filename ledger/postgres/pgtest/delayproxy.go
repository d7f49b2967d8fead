package pgtest

import (
	"net"
	"sync"
	"testing"
	"time"
)

// DelayProxy is a TCP proxy in front of one PostgreSQL database that
// delays every byte by a fixed time in each direction, as a network
// between replicas and their database would (a round trip costs twice the
// delay), without bounding the throughput: what a side sends is read at
// once and written delay later, in order.
type DelayProxy struct {
	*proxy
	delay  time.Duration
	mu     sync.Mutex
	total  time.Duration // held, over every chunk
	chunks int64
}

// NewDelayProxy starts a proxy delaying each direction by delay in front
// of the database at url (a URL of a Cluster) on a free loopback port; URL
// is the database's URL through it. It is stopped, with its connections,
// when the test ends.
func NewDelayProxy(t testing.TB, url string, delay time.Duration) *DelayProxy {
	t.Helper()
	p := &DelayProxy{delay: delay}
	p.proxy = newProxy(t, "NewDelayProxy", url)
	p.start(p.serve)
	return p
}

// serve proxies one connection until either side closes it.
func (p *DelayProxy) serve(client net.Conn) {
	server, ok := p.dial()
	if !ok {
		return
	}
	defer p.untrack(server)
	var both sync.WaitGroup
	both.Add(2)
	go func() { defer both.Done(); p.pipe(client, server) }()
	go func() { defer both.Done(); p.pipe(server, client) }()
	both.Wait()
}

// pipe copies from src to dst, each chunk delay after it was read; at
// either end's close it closes both.
func (p *DelayProxy) pipe(src, dst net.Conn) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				chunks <- chunk{buf[:n], time.Now().Add(p.delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	defer src.Close()
	defer dst.Close()
	for c := range chunks {
		if d := time.Until(c.at); d > 0 {
			time.Sleep(d)
		}
		p.held(time.Since(c.at) + p.delay)
		if _, err := dst.Write(c.b); err != nil {
			src.Close()
			for range chunks { // until the reader ends
			}
			return
		}
	}
}

func (p *DelayProxy) held(d time.Duration) {
	p.mu.Lock()
	p.total += d
	p.chunks++
	p.mu.Unlock()
}

// MeanDelay is how long the proxy held a chunk on average: the delay
// asked for, or more (a timer on a busy machine wakes late; Go's sleeps
// are about a millisecond at the least on some systems).
func (p *DelayProxy) MeanDelay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.chunks == 0 {
		return 0
	}
	return p.total / time.Duration(p.chunks)
}
