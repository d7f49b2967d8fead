package forward

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net"
	"sync"
	"time"

	"idemgate/ledger"
)

// Server serves one ledger.Backend (the writer's) to forwarders over a
// listener. Each connection carries one transaction at a time; a forwarded
// Update joins the backend's group commit like a local one.
type Server struct {
	b  ledger.Backend
	ln net.Listener

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// txIdle bounds how long the writer waits for the forwarder's next
// message inside a transaction: a forwarder that stalls there holds up the
// whole group commit, so it is cut off and its transaction rolled back.
const txIdle = 10 * time.Second

// markerKept is how long commit markers are kept: a read-back happens
// within the forwarder's failover deadline of the commit it asks about.
const markerKept = 10 * time.Minute

// MarkerCollection is the data collection holding the marker of every
// forwarded Update, written in the Update's own transaction (see
// Committed).
const MarkerCollection = "forward_commits"

// errAborted is the error a forwarded fn's abort returns inside the
// writer's transaction; the forwarder keeps fn's own error.
var errAborted = errors.New("forward: aborted by the forwarder")

// Serve serves b on ln until Close; it returns at once. Connections from
// another user are refused where the platform tells (SO_PEERCRED).
func Serve(ln net.Listener, b ledger.Backend) *Server {
	s := &Server{b: b, ln: ln, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s
}

// accept runs until the listener is closed (Close).
func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		if !SameUser(c) {
			c.Close()
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

// Close stops accepting, closes every connection (a transaction in flight
// there is rolled back unless its commit was already received; its
// forwarder then reads back its marker) and waits for the connections'
// goroutines. It does not close the backend.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// serverConn is one forwarder's connection. broken holds the first I/O
// error: the connection is then closed after the transaction ends.
type serverConn struct {
	c      net.Conn
	r      reader
	w      writer
	broken error
}

// serve runs the connection's transactions one after another; it exits
// when the connection fails or is closed.
func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	sc := &serverConn{c: c, r: reader{bufio.NewReaderSize(c, 16<<10)}, w: writer{bufio.NewWriterSize(c, 16<<10)}}
	ctx := context.Background()
	for {
		c.SetReadDeadline(time.Time{})
		t, err := sc.r.byte()
		if err != nil {
			return
		}
		switch t {
		case msgHello:
			if _, err := sc.r.uint(); err != nil {
				return
			}
			sc.w.byte(msgBool)
			sc.w.uint(protoVersion)
		case msgUpdate, msgView, msgUpdatePre, msgViewPre:
			update := t == msgUpdate || t == msgUpdatePre
			var marker []byte
			if update {
				if marker, err = sc.r.bytes(); err != nil {
					return
				}
			}
			var pre []prefetch
			if t == msgUpdatePre || t == msgViewPre {
				if pre, err = sc.r.prefetches(); err != nil {
					return
				}
			}
			fn := func(tx ledger.BTx) error { return sc.runTx(tx, update, marker, pre) }
			if update {
				err = s.b.Update(ctx, fn)
			} else {
				err = s.b.View(ctx, fn)
			}
			if sc.broken != nil {
				return
			}
			sc.reply(err)
		case msgReadBack:
			marker, err := sc.r.bytes()
			if err != nil {
				return
			}
			var found bool
			// An Update, not a View: it runs after every batch already
			// queued or committing, so the transaction asked about has ended.
			err = s.b.Update(ctx, func(tx ledger.BTx) error {
				found = Committed(tx, marker)
				return nil
			})
			if err != nil {
				sc.reply(err)
			} else {
				sc.w.byte(msgBool)
				sc.w.uint(boolUint(found))
			}
		case msgHealth:
			h := ledger.Health{OK: true}
			if hr, ok := s.b.(ledger.HealthReporter); ok {
				h = hr.Health(ctx)
			}
			b, _ := json.Marshal(h)
			sc.w.byte(msgValue)
			sc.w.bytes(b)
		default:
			return
		}
		if sc.w.flush() != nil {
			return
		}
	}
}

// reply ends a transaction: msgDone, or msgFail with the reason.
func (sc *serverConn) reply(err error) {
	if err == nil {
		sc.w.byte(msgDone)
		return
	}
	code := failOther
	switch {
	case errors.Is(err, errAborted):
		code = failAborted
	case errors.Is(err, ledger.ErrClosed):
		code = failClosed
	}
	sc.w.byte(msgFail)
	sc.w.uint(uint64(code))
	sc.w.string(err.Error())
}

// runTx is the forwarded fn inside the writer's transaction: it tells the
// forwarder to run fn and serves its reads and writes until it commits or
// aborts. It may run again for the same request (the group commit re-runs
// a batch's members alone when one failed); each run starts afresh.
//
// pre are the reads the forwarder expects to make (see prefetch): they are
// answered with msgStart, read in tx before fn runs, so that fn finds them
// without a round trip.
func (sc *serverConn) runTx(tx ledger.BTx, writable bool, marker []byte, pre []prefetch) error {
	if sc.broken != nil {
		return sc.broken
	}
	st := txState{tx: tx, buckets: map[bucketRef]ledger.Bucket{}, cursors: map[uint64]ledger.Cursor{}}
	sc.w.byte(msgStart)
	for i, p := range pre {
		st.answer(sc.w, uint64(i), p)
	}
	if err := sc.w.flush(); err != nil {
		sc.broken = err
		return err
	}
	for {
		if sc.w.w.Buffered() > 0 { // the answer to the previous read
			if err := sc.w.flush(); err != nil {
				sc.broken = err
				return err
			}
		}
		sc.c.SetReadDeadline(time.Now().Add(txIdle))
		err := sc.step(&st)
		if errors.Is(err, errCommit) {
			if st.writeErr != nil {
				return st.writeErr
			}
			if writable {
				return putMarker(tx, marker)
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
}

var errCommit = errors.New("commit")

type bucketRef struct {
	kind uint64
	name string
}

// txState is one run of a forwarded transaction on the writer's side.
type txState struct {
	tx       ledger.BTx
	buckets  map[bucketRef]ledger.Bucket
	cursors  map[uint64]ledger.Cursor
	writeErr error // the first failed Put or Delete: the transaction will not commit
}

func (st *txState) bucket(ref bucketRef) (ledger.Bucket, error) {
	if b, ok := st.buckets[ref]; ok {
		return b, nil
	}
	var b ledger.Bucket
	if ref.kind == kindLedger {
		b = st.tx.Bucket([]byte(ref.name))
	} else {
		var err error
		if b, err = st.tx.Data(ref.name, false); err != nil {
			return nil, err
		}
	}
	if b != nil {
		st.buckets[ref] = b
	}
	return b, nil
}

// answer reads the i-th prefetch p in st's transaction and writes the
// answer: a Get's value, or a cursor's first pair (the cursor is kept as
// prefetchCursor(i), where the forwarder's later moves of it go).
func (st *txState) answer(w writer, i uint64, p prefetch) {
	b, err := st.bucket(p.ref)
	if err != nil {
		b = nil // as msgGet and msgCursor answer: a missing collection
	}
	if p.op == preGet {
		var v []byte
		if b != nil {
			v = b.Get(p.key)
		}
		w.bytes(v)
		return
	}
	var k, v []byte
	if b != nil {
		cur := b.Cursor()
		st.cursors[prefetchCursor(i)] = cur
		k, v = moveCursor(cur, p.op-preCursor, p.key)
	}
	writePair(w, k, v)
}

// step serves one message; it returns errCommit at msgCommit, errAborted
// at msgAbort, and the I/O error (also kept in sc.broken) when the
// connection fails.
func (sc *serverConn) step(st *txState) error {
	fail := func(err error) error {
		sc.broken = err
		return err
	}
	t, err := sc.r.byte()
	if err != nil {
		return fail(err)
	}
	readRef := func() (bucketRef, error) {
		k, err := sc.r.uint()
		if err != nil {
			return bucketRef{}, err
		}
		n, err := sc.r.string()
		return bucketRef{k, n}, err
	}
	switch t {
	case msgCommit:
		return errCommit
	case msgAbort:
		return errAborted
	case msgBucket:
		name, err := sc.r.string()
		if err != nil {
			return fail(err)
		}
		sc.w.byte(msgBool)
		sc.w.uint(boolUint(st.tx.Bucket([]byte(name)) != nil))
	case msgData:
		name, err := sc.r.string()
		if err != nil {
			return fail(err)
		}
		create, err := sc.r.uint()
		if err != nil {
			return fail(err)
		}
		b, err := st.tx.Data(name, create == 1)
		if err != nil {
			sc.w.byte(msgFail)
			sc.w.uint(failOther)
			sc.w.string(err.Error())
			break
		}
		if b != nil {
			st.buckets[bucketRef{kindData, name}] = b
		}
		sc.w.byte(msgBool)
		sc.w.uint(boolUint(b != nil))
	case msgGet:
		ref, err := readRef()
		if err != nil {
			return fail(err)
		}
		key, err := sc.r.bytes()
		if err != nil {
			return fail(err)
		}
		var v []byte
		b, err := st.bucket(ref)
		if err == nil && b != nil {
			v = b.Get(key)
		}
		sc.w.byte(msgValue)
		sc.w.bytes(v)
	case msgPut, msgDelete:
		ref, err := readRef()
		if err != nil {
			return fail(err)
		}
		key, err := sc.r.bytes()
		if err != nil {
			return fail(err)
		}
		var value []byte
		if t == msgPut {
			if value, err = sc.r.bytes(); err != nil {
				return fail(err)
			}
		}
		if st.writeErr != nil {
			return nil
		}
		b, err := st.bucket(ref)
		switch {
		case err != nil:
			st.writeErr = err
		case b == nil:
			st.writeErr = errors.New("forward: write to a collection that does not exist: " + ref.name)
		case t == msgPut:
			if value == nil {
				value = []byte{}
			}
			st.writeErr = b.Put(key, value)
		default:
			st.writeErr = b.Delete(key)
		}
		return nil // no answer: the forwarder does not wait for writes
	case msgCursor:
		id, err := sc.r.uint()
		if err != nil {
			return fail(err)
		}
		op, err := sc.r.uint()
		if err != nil {
			return fail(err)
		}
		ref, err := readRef()
		if err != nil {
			return fail(err)
		}
		seek, err := sc.r.bytes()
		if err != nil {
			return fail(err)
		}
		var k, v []byte
		cur, ok := st.cursors[id]
		if !ok {
			if b, err := st.bucket(ref); err == nil && b != nil {
				cur = b.Cursor()
				st.cursors[id] = cur
			}
		}
		if cur != nil {
			k, v = moveCursor(cur, op, seek)
		}
		sc.w.byte(msgPair)
		writePair(sc.w, k, v)
	case msgCursorAhead:
		var f [2]uint64 // id, op
		for i := range f {
			if f[i], err = sc.r.uint(); err != nil {
				return fail(err)
			}
		}
		ref, err := readRef()
		if err != nil {
			return fail(err)
		}
		seek, err := sc.r.bytes()
		if err != nil {
			return fail(err)
		}
		var g [3]uint64 // dir, skip, ahead
		for i := range g {
			if g[i], err = sc.r.uint(); err != nil {
				return fail(err)
			}
		}
		id, op, dir, skip, ahead := f[0], f[1], g[0], g[1], g[2]
		if (dir != curNext && dir != curPrev) || skip > maxAhead || ahead > maxAhead {
			return fail(errCorrupt)
		}
		b, _ := st.bucket(ref)
		cur, ok := st.cursors[id]
		if !ok && b != nil {
			cur = b.Cursor()
			st.cursors[id] = cur
		}
		var k, v []byte
		var pairs [][2][]byte
		if cur != nil {
			for range skip { // the moves the forwarder took from its last read-ahead
				moveCursor(cur, dir, nil)
			}
			k, v = moveCursor(cur, op, seek)
			pairs = readAhead(b, k, op, ahead)
		}
		sc.w.byte(msgPair)
		writePair(sc.w, k, v)
		sc.w.uint(uint64(len(pairs)))
		for _, p := range pairs {
			writePair(sc.w, p[0], p[1])
		}
	case msgSkip:
		var f [3]uint64 // id, dir, n
		for i := range f {
			if f[i], err = sc.r.uint(); err != nil {
				return fail(err)
			}
		}
		id, dir, n := f[0], f[1], f[2]
		cur, ok := st.cursors[id]
		if !ok || (dir != curNext && dir != curPrev) || n > maxAhead {
			return fail(errCorrupt)
		}
		for range n {
			moveCursor(cur, dir, nil)
		}
		return nil // no answer
	default:
		return fail(errCorrupt)
	}
	return nil
}

// readAhead returns the pairs up to ahead further moves op (curNext or
// curPrev) would return after a cursor of b stopped at k, read with a
// cursor of its own; none for other moves.
func readAhead(b ledger.Bucket, k []byte, op, ahead uint64) [][2][]byte {
	if b == nil || k == nil || ahead == 0 || (op != curNext && op != curPrev) {
		return nil
	}
	c := b.Cursor()
	if at, _ := c.Seek(k); !bytes.Equal(at, k) {
		return nil
	}
	var pairs [][2][]byte
	size := 0
	for range ahead {
		k, v := moveCursor(c, op, nil)
		if k == nil {
			break
		}
		pairs = append(pairs, [2][]byte{k, v})
		if size += len(k) + len(v); size > maxAheadBytes {
			break
		}
	}
	return pairs
}

// moveCursor makes one move of cur.
func moveCursor(cur ledger.Cursor, op uint64, seek []byte) (k, v []byte) {
	switch op {
	case curFirst:
		return cur.First()
	case curLast:
		return cur.Last()
	case curSeek:
		return cur.Seek(seek)
	case curNext:
		return cur.Next()
	case curPrev:
		return cur.Prev()
	}
	return nil, nil
}

// writePair writes a cursor's pair: no value without a key, and a present
// key's value is never nil (bbolt's nil value marks a nested bucket).
func writePair(w writer, k, v []byte) {
	if k == nil {
		v = nil
	} else if v == nil {
		v = []byte{}
	}
	w.bytes(k)
	w.bytes(v)
}

func boolUint(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// NewMarker returns a fresh commit marker: the time (8 bytes, big
// endian, Unix nanoseconds, so old markers sort first and are pruned) and
// 16 random bytes.
func NewMarker() []byte {
	m := make([]byte, 24)
	binary.BigEndian.PutUint64(m, uint64(time.Now().UnixNano()))
	randRead(m[8:])
	return m
}

// Committed reports whether the forwarded Update that wrote marker has
// committed, read in tx. Run it in an Update (serialized after the
// transaction asked about), never in a View.
func Committed(tx ledger.BTx, marker []byte) bool {
	b, err := tx.Data(MarkerCollection, false)
	return err == nil && b != nil && b.Get(marker) != nil
}

// putMarker records marker in the forwarded Update's own transaction and
// drops a few markers older than markerKept.
func putMarker(tx ledger.BTx, marker []byte) error {
	b, err := tx.Data(MarkerCollection, true)
	if err != nil {
		return err
	}
	cutoff := uint64(time.Now().Add(-markerKept).UnixNano())
	var old [][]byte
	c := b.Cursor()
	for k, _ := c.First(); k != nil && len(old) < 16; k, _ = c.Next() {
		if len(k) < 8 || binary.BigEndian.Uint64(k) >= cutoff {
			break
		}
		old = append(old, append([]byte(nil), k...))
	}
	for _, k := range old {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return b.Put(marker, []byte{})
}
