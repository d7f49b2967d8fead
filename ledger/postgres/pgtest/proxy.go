package pgtest

import (
	"net"
	neturl "net/url"
	"sync"
	"testing"
)

// proxy is what CutProxy and DelayProxy share: a listener on a free
// loopback port in front of one database, each accepted connection served
// by serve, and every connection closed when the test ends.
type proxy struct {
	ln     net.Listener
	target string // host:port of the server
	url    string // the database's URL with the proxy's address

	mu    sync.Mutex
	conns map[net.Conn]struct{} // both ends of every open proxied connection
	done  bool
	wg    sync.WaitGroup // one per accepted connection, and the accept loop
}

// newProxy listens for a proxy (name, for messages) in front of the
// database at url (a URL of a Cluster); start serves its connections. It
// is stopped when the test ends (register it before the clients that use
// it, so that they are stopped first).
func newProxy(t testing.TB, name, url string) *proxy {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil || u.Host == "" {
		t.Fatalf("pgtest: %s: not a URL with a host: %q", name, url)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
	u.Host = ln.Addr().String()
	p.url = u.String()
	t.Cleanup(p.close)
	return p
}

// start serves each connection the proxy accepts with serve.
func (p *proxy) start(serve func(client net.Conn)) {
	p.wg.Add(1)
	go p.accept(serve)
}

// URL is the database's URL through the proxy.
func (p *proxy) URL() string { return p.url }

func (p *proxy) close() {
	p.mu.Lock()
	p.done = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// track registers c as open (false once the proxy is closing: c is then
// closed at once).
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) untrack(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// dial opens (and tracks) the connection to the server for a client's.
func (p *proxy) dial() (net.Conn, bool) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return nil, false
	}
	return server, p.track(server)
}

func (p *proxy) accept(serve func(net.Conn)) {
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
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			serve(c)
		}()
	}
}
