package forward

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The wire format: a stream of messages, each one type byte followed by
// its fields. A field is a uvarint n then, when n > 0, n-1 bytes: n == 0
// is a nil slice, so a missing value and an empty one stay distinct (as
// ledger.Bucket.Get requires). A uvarint field carries cursor ids and
// flags. prefetches is a uvarint count (at most maxPrefetch) of entries
// "kind name op key": op preGet reads key, op preCursor+curFirst,
// +curLast or +curSeek makes that first move of a new cursor, which the
// forwarder then moves as cursor prefetchCursor(i).
//
// Read-ahead (version 2): msgCursorAhead first moves cursor id skip
// times in direction dir (curNext or curPrev: the pairs the forwarder
// took from its last read-ahead), then makes the move op, and answers it
// with msgPair followed by a count and up to ahead (≤ maxAhead) pairs:
// the moves op would make next, read with a second cursor so that id
// stays where the forwarder's cursor is. The forwarder takes those pairs
// while its transaction writes nothing; before its first write it sends
// msgSkip for the pairs it took (so the writer's cursor has made the
// same moves before that write) and drops the rest.
//
// Version 1 writers (before msgHello) close the connection at msgHello;
// a Client then speaks version 1 to them (no prefetches).
//
// Forwarder to writer:
//
//	msgHello version   which version does the writer speak? (answered by msgBool: its version)
//	msgUpdate marker   begin a forwarded Update
//	msgView            begin a forwarded View
//	msgUpdatePre marker prefetches   begin an Update whose msgStart answers prefetches (version 2)
//	msgViewPre prefetches            the same for a View (version 2)
//	msgReadBack marker did the Update that wrote marker commit? (answered by msgBool)
//	msgHealth          the writer's ledger.Health (version 3; answered by msgValue: its JSON)
//	msgBucket name                        (answered by msgBool: exists)
//	msgData name create                   (answered by msgBool or msgFail)
//	msgGet kind name key                  (answered by msgValue)
//	msgPut kind name key value            (no answer: pipelined)
//	msgDelete kind name key               (no answer: pipelined)
//	msgCursor id op kind name seek        (answered by msgPair)
//	msgCursorAhead id op kind name seek dir skip ahead   (version 2: answered by
//	                                      msgPair, then up to ahead more pairs, see below)
//	msgSkip id dir n                      (version 2, no answer: see below)
//	msgCommit                             fn returned nil
//	msgAbort                              fn returned an error or panicked
//
// Writer to forwarder:
//
//	msgStart answers  run fn (again, when the group commit re-runs it alone);
//	                  after a msgUpdatePre or msgViewPre, one answer per
//	                  prefetch, read in this run's transaction: a Get's
//	                  value, or a cursor move's key and value
//	msgDone           committed (Update) or finished (View)
//	msgFail code text the transaction did not commit
//	msgBool b
//	msgValue v
//	msgPair key value
const (
	msgUpdate   = 'U'
	msgView     = 'V'
	msgReadBack = 'R'
	msgBucket   = 'B'
	msgData     = 'D'
	msgGet      = 'G'
	msgPut      = 'P'
	msgDelete   = 'X'
	msgCursor   = 'C'
	msgCommit   = 'c'
	msgAbort    = 'a'

	msgHello       = 'H'
	msgUpdatePre   = 'W'
	msgViewPre     = 'Q'
	msgCursorAhead = 'A'
	msgSkip        = 'K'
	msgHealth      = 'h'

	msgStart = 'S'
	msgDone  = 'O'
	msgFail  = 'F'
	msgBool  = 'b'
	msgValue = 'v'
	msgPair  = 'p'
)

// Bucket kinds: a ledger collection (BTx.Bucket) or a downstream data
// collection (BTx.Data).
const (
	kindLedger = 0
	kindData   = 1
)

// Cursor operations.
const (
	curFirst = iota
	curLast
	curSeek
	curNext
	curPrev
)

// protoVersion is the version this package speaks: 2 adds msgHello and
// prefetches, 3 msgHealth.
const protoVersion = 3

// Prefetch operations: a Get, or preCursor plus the cursor operation of a
// new cursor's first move (curFirst, curLast or curSeek).
const (
	preGet    = 0
	preCursor = 1
)

// maxPrefetch bounds the prefetches of one transaction.
const maxPrefetch = 64

// maxAhead bounds the pairs of one read-ahead, and maxAheadBytes their
// size (a read-ahead stops after the pair that passes it).
const (
	maxAhead      = 16
	maxAheadBytes = 16 << 10
)

// prefetchCursor is the cursor id of the i-th prefetch's cursor: above
// any id the forwarder numbers its own cursors with.
func prefetchCursor(i uint64) uint64 { return 1<<40 + i }

// prefetch is one read a forwarder expects its transaction to make.
type prefetch struct {
	ref bucketRef
	op  uint64
	key []byte
}

func (w writer) prefetches(ps []prefetch) {
	w.uint(uint64(len(ps)))
	for _, p := range ps {
		w.uint(p.ref.kind)
		w.string(p.ref.name)
		w.uint(p.op)
		w.bytes(p.key)
	}
}

func (r reader) prefetches() ([]prefetch, error) {
	n, err := r.uint()
	if err != nil {
		return nil, err
	}
	if n > maxPrefetch {
		return nil, errCorrupt
	}
	ps := make([]prefetch, n)
	for i := range ps {
		p := &ps[i]
		if p.ref.kind, err = r.uint(); err != nil {
			return nil, err
		}
		if p.ref.kind > kindData {
			return nil, errCorrupt
		}
		if p.ref.name, err = r.string(); err != nil {
			return nil, err
		}
		if p.op, err = r.uint(); err != nil {
			return nil, err
		}
		if p.op != preGet && (p.op < preCursor+curFirst || p.op > preCursor+curSeek) {
			return nil, errCorrupt
		}
		if p.key, err = r.bytes(); err != nil {
			return nil, err
		}
	}
	return ps, nil
}

// Failure codes of msgFail.
const (
	failAborted  = 1 // fn's own error (the forwarder keeps the error value)
	failClosed   = 2 // the writer is closing: nothing committed, ask the next writer
	failReadOnly = 3
	failOther    = 4 // the writer's error, as text
)

// maxField bounds one field: a bbolt value is at most 2^31-2 bytes, and
// idemgate writes far smaller ones; a longer length is a corrupt stream.
const maxField = 1 << 30

var errCorrupt = errors.New("forward: corrupt message")

type writer struct{ w *bufio.Writer }

func (w writer) byte(b byte) { w.w.WriteByte(b) }

func (w writer) uint(n uint64) {
	var buf [binary.MaxVarintLen64]byte
	w.w.Write(buf[:binary.PutUvarint(buf[:], n)])
}

func (w writer) bytes(b []byte) {
	if b == nil {
		w.uint(0)
		return
	}
	w.uint(uint64(len(b)) + 1)
	w.w.Write(b)
}

func (w writer) string(s string) {
	w.uint(uint64(len(s)) + 1)
	w.w.WriteString(s)
}

func (w writer) flush() error { return w.w.Flush() }

type reader struct{ r *bufio.Reader }

func (r reader) byte() (byte, error) { return r.r.ReadByte() }

func (r reader) uint() (uint64, error) { return binary.ReadUvarint(r.r) }

func (r reader) bytes() ([]byte, error) {
	n, err := binary.ReadUvarint(r.r)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	if n-1 > maxField {
		return nil, errCorrupt
	}
	b := make([]byte, n-1)
	if _, err := io.ReadFull(r.r, b); err != nil {
		return nil, err
	}
	return b, nil
}

func (r reader) string() (string, error) {
	b, err := r.bytes()
	return string(b), err
}

// expect reads one message type and fails unless it is want.
func (r reader) expect(want byte) error {
	got, err := r.byte()
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("%w: got %q, want %q", errCorrupt, got, want)
	}
	return nil
}
