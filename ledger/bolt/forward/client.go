package forward

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"idemgate/ledger"
)

// ErrWriterLost is returned when the connection to the writer failed (or
// the writer was closing) before the transaction was sent for commit:
// it certainly did not commit, and may be run again on the next writer.
var ErrWriterLost = errors.New("forward: the ledger's writer process was lost before the transaction committed")

// ErrOutcomeUnknown is returned when the connection to the writer failed
// after the transaction was sent for commit: it may or may not have
// committed. Ask the next writer with ReadBack (or Committed) for its
// marker before running it again.
var ErrOutcomeUnknown = errors.New("forward: the ledger's writer process was lost after the transaction was sent for commit: whether it committed is unknown")

// RemoteError is an error the writer's backend returned, as text.
type RemoteError struct{ Text string }

func (e *RemoteError) Error() string { return e.Text }

// Client forwards transactions to a Server. Its functions run here; each
// read is a round trip to the writer, inside the writer's transaction,
// unless it was prefetched (see hotReads), and writes are sent without
// waiting. It is safe for concurrent use: each
// transaction has a connection of its own (idle ones are kept).
type Client struct {
	dial func() (net.Conn, error)

	mu     sync.Mutex
	idle   []*clientConn
	closed bool
	v1     bool // the writer speaks version 1: no msgHello, no prefetches
	hot    hotReads

	trips atomic.Int64 // round trips inside transactions (RoundTrips)
	hits  atomic.Int64 // reads answered by a prefetch (PrefetchHits)
}

// RoundTrips returns how many reads this client has waited for inside
// transactions (a measure of a forwarded transaction's cost).
func (c *Client) RoundTrips() int64 { return c.trips.Load() }

// PrefetchHits returns how many reads inside transactions were answered
// by the prefetch that came with the transaction's start, without a
// round trip of their own.
func (c *Client) PrefetchHits() int64 { return c.hits.Load() }

// maxIdle bounds the idle connections a Client keeps.
const maxIdle = 64

// NewClient returns a Client that opens connections with dial.
func NewClient(dial func() (net.Conn, error)) *Client {
	return &Client{dial: dial}
}

type clientConn struct {
	c     net.Conn
	r     reader
	w     writer
	proto uint64          // the version this connection speaks
	known map[string]bool // ledger collections seen to exist (a writable backend never drops one)
	// knownData holds the data collections a finished transaction of this
	// connection saw: committed, so they exist in every later transaction
	// (no collection is ever dropped).
	knownData map[string]bool
}

func (c *Client) get() (*clientConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ledger.ErrClosed
	}
	if n := len(c.idle); n > 0 {
		cc := c.idle[n-1]
		c.idle = c.idle[:n-1]
		c.mu.Unlock()
		return cc, nil
	}
	v1 := c.v1
	c.mu.Unlock()
	cc, err := c.connect(v1)
	if !errors.Is(err, errNoHello) {
		return cc, err
	}
	// A version 1 writer closes the connection at msgHello; speak version
	// 1 to it. (A writer lost right then is also lost for the next dial.)
	c.mu.Lock()
	c.v1 = true
	c.mu.Unlock()
	return c.connect(true)
}

// errNoHello: the writer took the connection but did not answer msgHello.
var errNoHello = errors.New("forward: the writer did not answer msgHello")

// connect dials a new connection; unless v1, it asks the writer's version.
func (c *Client) connect(v1 bool) (*clientConn, error) {
	conn, err := c.dial()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrWriterLost, err)
	}
	cc := &clientConn{c: conn, r: reader{bufio.NewReaderSize(conn, 16<<10)}, w: writer{bufio.NewWriterSize(conn, 16<<10)},
		proto: 1, known: map[string]bool{}, knownData: map[string]bool{}}
	if v1 {
		return cc, nil
	}
	cc.w.byte(msgHello)
	cc.w.uint(protoVersion)
	err = cc.w.flush()
	if err == nil {
		err = cc.r.expect(msgBool)
	}
	if err == nil {
		cc.proto, err = cc.r.uint()
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%w: %w: %v", ErrWriterLost, errNoHello, err)
	}
	cc.proto = min(cc.proto, protoVersion)
	return cc, nil
}

func (c *Client) put(cc *clientConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.idle) >= maxIdle {
		cc.c.Close()
		return
	}
	c.idle = append(c.idle, cc)
}

// Close closes the idle connections; a transaction in flight closes its
// own when it ends. Transactions begun later return ledger.ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, cc := range c.idle {
		cc.c.Close()
	}
	c.idle = nil
	return nil
}

// Update runs fn in a read-write transaction of the writer, committed in
// its group commit together with marker (see Committed). It returns nil
// when the transaction committed, fn's own error (or panic) when fn
// failed, ErrWriterLost when it certainly did not commit for want of the
// writer, ErrOutcomeUnknown when that is unknown. fn may run more than
// once (ledger.Backend's rule).
func (c *Client) Update(ctx context.Context, marker []byte, fn func(ledger.BTx) error) error {
	return c.run(msgUpdate, marker, fn)
}

// View runs fn in a read transaction of the writer. A lost writer is
// ErrWriterLost (a view changes nothing: run it again).
func (c *Client) View(ctx context.Context, fn func(ledger.BTx) error) error {
	err := c.run(msgView, nil, fn)
	if errors.Is(err, ErrOutcomeUnknown) {
		err = ErrWriterLost
	}
	return err
}

// ReadBack asks the writer whether the Update that wrote marker
// committed. The writer answers after every transaction it had already
// begun has ended.
func (c *Client) ReadBack(ctx context.Context, marker []byte) (bool, error) {
	cc, err := c.get()
	if err != nil {
		return false, err
	}
	cc.w.byte(msgReadBack)
	cc.w.bytes(marker)
	if err := cc.w.flush(); err != nil {
		cc.c.Close()
		return false, fmt.Errorf("%w: %v", ErrWriterLost, err)
	}
	t, err := cc.r.byte()
	if err == nil {
		switch t {
		case msgBool:
			var b uint64
			if b, err = cc.r.uint(); err == nil {
				c.put(cc)
				return b == 1, nil
			}
		case msgFail:
			var fe error
			if fe, err = cc.readFail(); err == nil {
				c.put(cc)
				return false, fe
			}
		default:
			err = errCorrupt
		}
	}
	cc.c.Close()
	return false, fmt.Errorf("%w: %v", ErrWriterLost, err)
}

// ErrNoHealth is returned by Health when the writer runs a build that
// cannot report its health (protocol version 2 or older).
var ErrNoHealth = errors.New("forward: the writer runs an older idemgate that does not report its health")

// Health asks the writer for its ledger's health: the file's, as the
// process that holds it sees it. It returns ErrWriterLost when the writer
// cannot be reached, ErrNoHealth when it cannot tell.
func (c *Client) Health(ctx context.Context) (ledger.Health, error) {
	cc, err := c.get()
	if err != nil {
		return ledger.Health{}, err
	}
	if cc.proto < 3 {
		c.put(cc)
		return ledger.Health{}, ErrNoHealth
	}
	if d, ok := ctx.Deadline(); ok {
		cc.c.SetDeadline(d)
	}
	cc.w.byte(msgHealth)
	var h ledger.Health
	err = cc.w.flush()
	if err == nil {
		err = cc.r.expect(msgValue)
	}
	var b []byte
	if err == nil {
		b, err = cc.r.bytes()
	}
	if err == nil {
		err = json.Unmarshal(b, &h)
	}
	if err != nil {
		cc.c.Close()
		return ledger.Health{}, fmt.Errorf("%w: %v", ErrWriterLost, err)
	}
	cc.c.SetDeadline(time.Time{})
	c.put(cc)
	return h, nil
}

// readFail reads the rest of a msgFail and returns its error (errAborted
// for fn's own failure).
func (cc *clientConn) readFail() (error, error) {
	code, err := cc.r.uint()
	if err != nil {
		return nil, err
	}
	text, err := cc.r.string()
	if err != nil {
		return nil, err
	}
	switch code {
	case failAborted:
		return errAborted, nil
	case failClosed:
		return fmt.Errorf("%w: %s", ErrWriterLost, text), nil
	}
	return &RemoteError{Text: text}, nil
}

func (c *Client) run(begin byte, marker []byte, fn func(ledger.BTx) error) error {
	cc, err := c.get()
	if err != nil {
		return err
	}
	writable := begin == msgUpdate
	var pre []prefetch
	if cc.proto >= 2 {
		c.mu.Lock()
		pre = c.hot.prefetches()
		c.mu.Unlock()
		if begin == msgUpdate {
			begin = msgUpdatePre
		} else {
			begin = msgViewPre
		}
	}
	cc.w.byte(begin)
	if writable {
		cc.w.bytes(marker)
	}
	if cc.proto >= 2 {
		cc.w.prefetches(pre)
	}
	if err := cc.w.flush(); err != nil {
		cc.c.Close()
		return fmt.Errorf("%w: %v", ErrWriterLost, err)
	}
	var (
		fnErr    error
		panicked any
		didPanic bool
		// sentCommit: the latest run of fn ended in msgCommit, so a lost
		// connection now leaves the outcome unknown.
		sentCommit bool
		last       *clientTx // the latest run of fn
	)
	lost := func(err error) error {
		cc.c.Close()
		if sentCommit {
			return fmt.Errorf("%w: %v", ErrOutcomeUnknown, err)
		}
		return fmt.Errorf("%w: %v", ErrWriterLost, err)
	}
	for {
		t, err := cc.r.byte()
		if err != nil {
			return lost(err)
		}
		switch t {
		case msgStart:
			sentCommit = false
			tx := &clientTx{c: c, cc: cc, writable: writable}
			if cc.proto >= 2 {
				if err := tx.readPrefetched(pre); err != nil {
					return lost(err)
				}
			}
			if !didPanic {
				last = tx
				fnErr, panicked, didPanic = callFn(fn, tx)
				if tx.err != nil {
					// A read failed, so fn may have been misled; nothing was
					// sent for commit.
					return lost(tx.err)
				}
			}
			if fnErr == nil && !didPanic {
				cc.w.byte(msgCommit)
				sentCommit = writable
			} else {
				cc.w.byte(msgAbort)
			}
			if err := cc.w.flush(); err != nil {
				return lost(err)
			}
		case msgDone:
			if last != nil {
				for name := range last.data {
					cc.knownData[name] = true
				}
				c.learn(last)
			}
			c.put(cc)
			return nil
		case msgFail:
			fe, err := cc.readFail()
			if err != nil {
				return lost(err)
			}
			if last != nil {
				c.learn(last)
			}
			c.put(cc)
			if errors.Is(fe, errAborted) {
				if didPanic {
					panic(panicked)
				}
				return fnErr
			}
			return fe
		default:
			return lost(errCorrupt)
		}
	}
}

// callFn runs fn, turning a panic into a value so the writer's
// transaction can be aborted before the panic is raised again here.
func callFn(fn func(ledger.BTx) error, tx ledger.BTx) (err error, panicked any, didPanic bool) {
	defer func() {
		if r := recover(); r != nil {
			panicked, didPanic = r, true
		}
	}()
	return fn(tx), nil, false
}

// errViewWrite is returned by a write in a View.
var errViewWrite = errors.New("forward: write in a read-only transaction")

// clientTx is one run of fn on the forwarder's side. err is the first
// I/O error: every later read returns nil and the transaction is not
// committed.
type clientTx struct {
	c        *Client
	cc       *clientConn
	writable bool
	err      error
	cursors  uint64
	// seen holds every value this run has read or written, by bucket and
	// key: no other transaction writes while fn runs (the writer runs it
	// inside its own write transaction, or a view's snapshot), so a key
	// read twice is asked for once.
	seen map[seenKey][]byte
	// data holds the data collections seen to exist in this run (a
	// collection is never dropped).
	data map[string]bool
	// pre holds the prefetched Gets, read in the writer's transaction
	// before fn ran: a key fn has not written since (not in seen) still
	// has that value. preCur holds the prefetched first moves of cursors,
	// true while fn has not written to their collection (see written).
	pre     map[seenKey][]byte
	preCur  []cursorAnswer
	written map[bucketRef]bool
	// reads are this run's reads of the writer's state, in order, for the
	// Client to learn which to prefetch next time.
	reads []prefetch
	// ahead holds the cursors with read-ahead pairs or moves to catch up
	// on the writer (see clientCursor); writes counts this run's writes.
	ahead  []*clientCursor
	writes int
}

// beforeWrite runs before each write is sent: every cursor's moves taken
// from a read-ahead are made on the writer first, in order before the
// write as fn made them, and the rest of each read-ahead is dropped (the
// write may change what those moves return).
func (t *clientTx) beforeWrite() {
	for _, c := range t.ahead {
		if c.taken > 0 {
			t.cc.w.byte(msgSkip)
			t.cc.w.uint(c.id)
			t.cc.w.uint(c.dir)
			t.cc.w.uint(c.taken)
		}
		c.taken, c.pairs, c.listed = 0, nil, false
	}
	t.ahead = t.ahead[:0]
	t.writes++
}

// cursorAnswer is a prefetched first move of a cursor, kept by the writer as
// cursor id.
type cursorAnswer struct {
	p    prefetch
	id   uint64
	k, v []byte
	used bool
}

// readPrefetched reads msgStart's answers to pre.
func (t *clientTx) readPrefetched(pre []prefetch) error {
	for i, p := range pre {
		if p.op == preGet {
			v, err := t.cc.r.bytes()
			if err != nil {
				return err
			}
			if t.pre == nil {
				t.pre = map[seenKey][]byte{}
			}
			t.pre[seenKey{p.ref.kind, p.ref.name, string(p.key)}] = v
			continue
		}
		k, err := t.cc.r.bytes()
		if err != nil {
			return err
		}
		v, err := t.cc.r.bytes()
		if err != nil {
			return err
		}
		t.preCur = append(t.preCur, cursorAnswer{p: p, id: prefetchCursor(uint64(i)), k: k, v: v})
	}
	return nil
}

// wrote notes a write to b: from now on, a prefetched cursor of b no
// longer shows what a new cursor would.
func (t *clientTx) wrote(b *clientBucket) {
	if t.written == nil {
		t.written = map[bucketRef]bool{}
	}
	t.written[bucketRef{b.kind, b.name}] = true
}

type seenKey struct {
	kind      uint64
	name, key string
}

func (t *clientTx) remember(b *clientBucket, key, v []byte) {
	if t.seen == nil {
		t.seen = map[seenKey][]byte{}
	}
	t.seen[seenKey{b.kind, b.name, string(key)}] = v
}

func (t *clientTx) fail(err error) {
	if t.err == nil {
		t.err = err
	}
}

// roundTrip flushes the pending messages and reads the answer's type.
func (t *clientTx) roundTrip(want byte) bool {
	if t.err != nil {
		return false
	}
	t.c.trips.Add(1)
	if err := t.cc.w.flush(); err != nil {
		t.fail(err)
		return false
	}
	if err := t.cc.r.expect(want); err != nil {
		t.fail(err)
		return false
	}
	return true
}

// Bucket implements ledger.BTx. It never returns nil on a lost
// connection (the transaction is doomed then, and a nil would read as an
// old file's missing collection).
func (t *clientTx) Bucket(name []byte) ledger.Bucket {
	b := &clientBucket{t: t, kind: kindLedger, name: string(name)}
	if t.cc.known[b.name] || t.err != nil {
		return b
	}
	t.cc.w.byte(msgBucket)
	t.cc.w.string(b.name)
	if !t.roundTrip(msgBool) {
		return b
	}
	ok, err := t.cc.r.uint()
	if err != nil {
		t.fail(err)
		return b
	}
	if ok != 1 {
		return nil
	}
	t.cc.known[b.name] = true
	return b
}

// Data implements ledger.BTx.
func (t *clientTx) Data(name string, create bool) (ledger.Bucket, error) {
	b := &clientBucket{t: t, kind: kindData, name: name}
	if create && !t.writable {
		return nil, errViewWrite
	}
	if t.err != nil || t.data[name] || t.cc.knownData[name] {
		return b, nil
	}
	t.cc.w.byte(msgData)
	t.cc.w.string(name)
	t.cc.w.uint(boolUint(create))
	t.c.trips.Add(1)
	if err := t.cc.w.flush(); err != nil {
		t.fail(err)
		return b, nil
	}
	typ, err := t.cc.r.byte()
	if err != nil {
		t.fail(err)
		return b, nil
	}
	switch typ {
	case msgBool:
		ok, err := t.cc.r.uint()
		if err != nil {
			t.fail(err)
			return b, nil
		}
		if ok != 1 {
			return nil, nil
		}
		if t.data == nil {
			t.data = map[string]bool{}
		}
		t.data[name] = true
		return b, nil
	case msgFail:
		fe, err := t.cc.readFail()
		if err != nil {
			t.fail(err)
			return b, nil
		}
		return nil, fe
	}
	t.fail(errCorrupt)
	return b, nil
}

// clientBucket is a collection of the writer's transaction.
type clientBucket struct {
	t    *clientTx
	kind uint64
	name string
}

func (b *clientBucket) ref() {
	b.t.cc.w.uint(b.kind)
	b.t.cc.w.string(b.name)
}

func (b *clientBucket) Get(key []byte) []byte {
	t := b.t
	if t.err != nil {
		return nil
	}
	sk := seenKey{b.kind, b.name, string(key)}
	if v, ok := t.seen[sk]; ok {
		return v
	}
	t.reads = append(t.reads, prefetch{bucketRef{b.kind, b.name}, preGet, bytes.Clone(key)})
	if v, ok := t.pre[sk]; ok {
		t.c.hits.Add(1)
		t.remember(b, key, v)
		return v
	}
	t.cc.w.byte(msgGet)
	b.ref()
	t.cc.w.bytes(key)
	if !t.roundTrip(msgValue) {
		return nil
	}
	v, err := t.cc.r.bytes()
	if err != nil {
		t.fail(err)
		return nil
	}
	t.remember(b, key, v)
	return v
}

func (b *clientBucket) Put(key, value []byte) error {
	if !b.t.writable {
		return errViewWrite
	}
	if b.t.err != nil {
		return b.t.err
	}
	b.t.beforeWrite()
	b.t.cc.w.byte(msgPut)
	b.ref()
	b.t.cc.w.bytes(key)
	if value == nil {
		value = []byte{}
	}
	b.t.cc.w.bytes(value)
	b.t.remember(b, key, value)
	b.t.wrote(b)
	return nil
}

func (b *clientBucket) Delete(key []byte) error {
	if !b.t.writable {
		return errViewWrite
	}
	if b.t.err != nil {
		return b.t.err
	}
	b.t.beforeWrite()
	b.t.cc.w.byte(msgDelete)
	b.ref()
	b.t.cc.w.bytes(key)
	b.t.remember(b, key, nil)
	b.t.wrote(b)
	return nil
}

func (b *clientBucket) Cursor() ledger.Cursor {
	b.t.cursors++
	return &clientCursor{b: b, id: b.t.cursors}
}

// clientCursor is a cursor of the writer's transaction: each move is a
// round trip, except a first move the writer answered in advance
// (prefetched): the cursor then continues as the writer's prefetched one.
//
// A cursor that moves on (Next, Prev) asks the writer to read ahead
// (version 2): the next moves in that direction come back with the
// answer, and are taken here while the transaction writes nothing (see
// beforeWrite); taken counts those the writer's cursor has not made yet.
// It asks only while the transaction has written nothing since the
// cursor's latest First, Last or Seek: a bbolt cursor that has seen a
// write in its transaction may return what a new cursor (the writer's
// read-ahead) would not, and the answers must be the cursor's own.
type clientCursor struct {
	b      *clientBucket
	id     uint64
	moved  bool
	dir    uint64      // the direction of pairs (curNext or curPrev)
	pairs  [][2][]byte // read ahead, not taken yet
	taken  uint64
	listed bool // in its transaction's ahead
	placed bool // a First, Last or Seek was made, after the transaction's write number pos
	pos    int
}

// aheadMoves is how many pairs a cursor moving on asks to read ahead.
const aheadMoves = 8

func (c *clientCursor) move(op uint64, seek []byte) ([]byte, []byte) {
	t := c.b.t
	if t.err != nil {
		return nil, nil
	}
	if op <= curSeek {
		c.placed, c.pos = true, t.writes
	}
	if !c.moved && op <= curSeek {
		if k, v, ok := c.prefetched(op, seek); ok {
			return k, v
		}
	}
	c.moved = true
	if t.cc.proto >= 2 {
		return c.moveAhead(op, seek)
	}
	t.cc.w.byte(msgCursor)
	t.cc.w.uint(c.id)
	t.cc.w.uint(op)
	c.b.ref()
	t.cc.w.bytes(seek)
	if !t.roundTrip(msgPair) {
		return nil, nil
	}
	k, err := t.cc.r.bytes()
	if err != nil {
		t.fail(err)
		return nil, nil
	}
	v, err := t.cc.r.bytes()
	if err != nil {
		t.fail(err)
		return nil, nil
	}
	return k, v
}

// moveAhead makes a move with msgCursorAhead: from the pairs read ahead
// when it is one more move in their direction, else on the writer, which
// first makes the moves taken from them.
func (c *clientCursor) moveAhead(op uint64, seek []byte) ([]byte, []byte) {
	t := c.b.t
	if op == c.dir && len(c.pairs) > 0 {
		p := c.pairs[0]
		c.pairs = c.pairs[1:]
		c.taken++
		t.c.hits.Add(1)
		return p[0], p[1]
	}
	dir := c.dir
	if dir != curPrev {
		dir = curNext
	}
	var ahead uint64
	if (op == curNext || op == curPrev) && c.placed && c.pos == t.writes {
		ahead = aheadMoves
	}
	t.cc.w.byte(msgCursorAhead)
	t.cc.w.uint(c.id)
	t.cc.w.uint(op)
	c.b.ref()
	t.cc.w.bytes(seek)
	t.cc.w.uint(dir)
	t.cc.w.uint(c.taken)
	t.cc.w.uint(ahead)
	c.taken, c.pairs = 0, nil
	if !t.roundTrip(msgPair) {
		return nil, nil
	}
	k, v, err := c.readPair()
	if err != nil {
		t.fail(err)
		return nil, nil
	}
	n, err := t.cc.r.uint()
	if err == nil && n > maxAhead {
		err = errCorrupt
	}
	for i := uint64(0); err == nil && i < n; i++ {
		var p [2][]byte
		if p[0], p[1], err = c.readPair(); err == nil {
			c.pairs = append(c.pairs, p)
		}
	}
	if err != nil {
		t.fail(err)
		return nil, nil
	}
	if len(c.pairs) > 0 {
		c.dir = op
		if !c.listed {
			c.listed = true
			t.ahead = append(t.ahead, c)
		}
	}
	return k, v
}

func (c *clientCursor) readPair() ([]byte, []byte, error) {
	k, err := c.b.t.cc.r.bytes()
	if err != nil {
		return nil, nil, err
	}
	v, err := c.b.t.cc.r.bytes()
	return k, v, err
}

// prefetched answers a new cursor's first move from a prefetch: the
// writer made the same move on a new cursor of the same collection before
// fn ran, and fn has not written to that collection since, so the answer
// and the writer's cursor are what this move would have made.
func (c *clientCursor) prefetched(op uint64, seek []byte) ([]byte, []byte, bool) {
	t := c.b.t
	ref := bucketRef{c.b.kind, c.b.name}
	p := prefetch{ref, preCursor + op, seek}
	if op != curSeek {
		p.key = nil
	}
	t.reads = append(t.reads, prefetch{ref, p.op, bytes.Clone(p.key)})
	if t.written[ref] {
		return nil, nil, false
	}
	for i := range t.preCur {
		pc := &t.preCur[i]
		if pc.used || pc.p.ref != ref || pc.p.op != p.op || !bytes.Equal(pc.p.key, p.key) {
			continue
		}
		pc.used, c.moved, c.id = true, true, pc.id
		t.c.hits.Add(1)
		return pc.k, pc.v, true
	}
	return nil, nil, false
}

func (c *clientCursor) First() ([]byte, []byte)           { return c.move(curFirst, nil) }
func (c *clientCursor) Last() ([]byte, []byte)            { return c.move(curLast, nil) }
func (c *clientCursor) Seek(seek []byte) ([]byte, []byte) { return c.move(curSeek, seek) }
func (c *clientCursor) Next() ([]byte, []byte)            { return c.move(curNext, nil) }
func (c *clientCursor) Prev() ([]byte, []byte)            { return c.move(curPrev, nil) }

func randRead(b []byte) { rand.Read(b) }

// hotReads learns which reads a Client's transactions make again and
// again (a ledger's meta keys, the audit chain's head), so that the next
// transaction asks the writer for them with its start instead of one
// round trip each. A read made in at least hotMinHits of the
// transactions it was seen in, the last of them within the latest
// hotWindow transactions, is prefetched. What is prefetched only saves
// time: a read that misses goes to the writer as before.
//
// Besides, the latest keys read by Views are prefetched (viewed): a
// caller that looks before it writes (the ledger's claim looks up its
// record in a View first) then finds the key in its Update at once.
type hotReads struct {
	n      uint64 // transactions learned from
	seen   map[string]*hotRead
	viewed [maxViewed]prefetch // a ring: the latest Gets of Views
	vi     int                 // the next slot of viewed
}

type hotRead struct {
	p          prefetch
	hits, last uint64
}

const (
	hotWindow  = 16
	hotMinHits = 2
	maxHot     = 256 // reads remembered
	maxPreTx   = 32  // hot prefetches sent with one transaction
	maxViewed  = 8   // viewed prefetches (maxPreTx + maxViewed ≤ maxPrefetch)
)

func hotKey(p prefetch) string {
	return fmt.Sprintf("%d\x00%s\x00%d\x00%s", p.ref.kind, p.ref.name, p.op, p.key)
}

// learn records the reads of t, a run of fn that ended.
func (c *Client) learn(t *clientTx) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := &c.hot
	h.n++
	if h.seen == nil {
		h.seen = map[string]*hotRead{}
	}
	for _, p := range t.reads {
		if !t.writable && p.op == preGet {
			h.viewed[h.vi] = p
			h.vi = (h.vi + 1) % maxViewed
		}
		k := hotKey(p)
		r := h.seen[k]
		if r == nil {
			if len(h.seen) >= maxHot {
				h.evict()
			}
			r = &hotRead{p: p}
			h.seen[k] = r
		}
		if r.last != h.n { // once per transaction
			r.hits++
			r.last = h.n
		}
	}
}

// evict forgets the reads not made within the window, and when that is
// not enough, every read seen only once.
func (h *hotReads) evict() {
	for k, r := range h.seen {
		if h.n-r.last >= hotWindow {
			delete(h.seen, k)
		}
	}
	if len(h.seen) < maxHot {
		return
	}
	for k, r := range h.seen {
		if r.hits < hotMinHits {
			delete(h.seen, k)
		}
	}
}

// prefetches returns the reads to prefetch for the next transaction: the
// hot ones and the viewed ones, each once.
func (h *hotReads) prefetches() []prefetch {
	var ps []prefetch
	have := map[string]bool{}
	for k, r := range h.seen {
		if r.hits >= hotMinHits && h.n-r.last < hotWindow {
			ps = append(ps, r.p)
			have[k] = true
			if len(ps) == maxPreTx {
				break
			}
		}
	}
	for _, p := range h.viewed {
		if p.ref.name == "" && p.key == nil {
			continue // a slot not used yet
		}
		if k := hotKey(p); !have[k] {
			ps = append(ps, p)
			have[k] = true
		}
	}
	return ps
}
