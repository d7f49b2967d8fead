package pgtest

import (
	"net"
	neturl "net/url"
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
	ln     net.Listener
	target string
	url    string
	delay  time.Duration
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	done   bool
	wg     sync.WaitGroup
	total  time.Duration // held, over every chunk
	chunks int64
}

// NewDelayProxy starts a proxy delaying each direction by delay in front
// of the database at url (a URL of a Cluster) on a free loopback port; URL
// is the database's URL through it. It is stopped, with its connections,
// when the test ends.
func NewDelayProxy(t testing.TB, url string, delay time.Duration) *DelayProxy {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil || u.Host == "" {
		t.Fatalf("pgtest: NewDelayProxy: not a URL with a host: %q", url)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &DelayProxy{ln: ln, target: u.Host, delay: delay, conns: map[net.Conn]struct{}{}}
	u.Host = ln.Addr().String()
	p.url = u.String()
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL is the database's URL through the proxy.
func (p *DelayProxy) URL() string { return p.url }

func (p *DelayProxy) close() {
	p.mu.Lock()
	p.done = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

func (p *DelayProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *DelayProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve proxies one connection until either side closes it.
func (p *DelayProxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(server) {
		client.Close()
		return
	}
	var both sync.WaitGroup
	both.Add(2)
	go func() { defer both.Done(); p.pipe(client, server) }()
	go func() { defer both.Done(); p.pipe(server, client) }()
	both.Wait()
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
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
