package outbox

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// SegmentSink appends each message as one line of JSON — the payload
// DirSink writes as a file, on one line, ending in "\n" — to segment
// files: <outbox-dir>/segments/<seq>.jsonl, <seq> twelve decimal digits
// (so names sort as numbers), a new segment started by the pass that
// would take the newest past MaxSegmentBytes. Deliver only checks and
// buffers; Flush appends the pass's lines with one write and makes them
// durable with one fdatasync (and, when it started a segment, an fsync of
// the directory).
//
// It is idempotent by message id across crashes, restarts and processes:
//
//   - An index of the ids in the segments (id → segment and offset) is
//     built when the sink is opened, by reading every segment, and kept
//     up to date by each Flush, which first reads what other processes
//     appended since. Memory: about 50 bytes per id (measured in
//     TestSegmentIndexMemory), some 50 MB per million messages kept in
//     the segments.
//   - Flush holds an exclusive flock(2) on <outbox-dir>/segments/lock from
//     reading the others' lines until its fdatasync returns, so two sinks
//     (two processes, or two sinks in one) never interleave, and a line
//     another holder wrote is whole or torn by its death.
//   - A message whose id is already in a segment is not appended again
//     when it is the same message; a different message under the id is
//     refused with a *PermanentError (DirSink's rule), the line standing.
//     Found by Deliver, it refuses at once; found only by Flush (another
//     process appended the id since the last Flush), Flush returns an
//     error, nothing of the pass is recorded, and the redelivery refuses.
//   - A torn tail — the newest segment's lines from the first that is not
//     a whole message line on (power lost before the fdatasync, or a
//     process killed in its write) — is cut off (truncated) by the next
//     holder of the lock, at open or at a Flush, and never read as a
//     message; those messages were not recorded as delivered, and are
//     appended again when redelivered. Only the newest segment can have
//     one (a segment is complete and synced before the next is started),
//     so a damaged line in an older segment is an error naming the file.
//
// Consumers read the segments in name order and a segment from start to
// end, taking only lines that end in "\n"; a line may appear before it is
// durable, and after a power loss be cut and appended again later, so a
// consumer deduplicates by message_id. A consumer may remove a segment
// other than the newest once it has read it; the sink then no longer
// knows its ids, so a message of it delivered again after a crash would
// be appended again — remove only segments older than a few minutes
// (ClaimLease).
//
// Safe for concurrent use. NewSegmentSink needs flock(2) (a Unix system).
type SegmentSink struct {
	dir string // the segments directory
	// MaxSegmentBytes bounds a segment: a pass that would take the newest
	// segment past it starts a new one (a pass is never split, so a
	// segment is larger only when one pass alone is). Set it before the
	// first Deliver; at most 2 GiB.
	MaxSegmentBytes int64

	mu    sync.Mutex
	index segmentIndex
	seq   uint64 // the newest segment (0: none yet)
	size  int64  // the newest segment's length as last read
	// pending are the lines of the messages delivered since the last
	// Flush, in delivery order, by id in pendingIDs.
	pending    []pendingLine
	pendingIDs map[string]int
	// resync are segments holding lines of messages delivered since the
	// last Flush that were already there (a redelivery: their write may
	// not have been synced before a crash); Flush syncs them.
	resync map[uint64]bool

	syncs atomic.Int64 // syncs issued (tests, benchmarks)
	cut   atomic.Int64 // torn bytes cut off (tests)
}

// DefaultSegmentBytes is a SegmentSink's MaxSegmentBytes unless set.
const DefaultSegmentBytes = 64 << 20

// maxLineBytes bounds one line read back from a segment: a longer one is
// not a message this sink wrote.
const maxLineBytes = 16 << 20

type pendingLine struct {
	payload deliveryPayload
	line    []byte // the payload's JSON and "\n"
}

// segmentLoc is where a message's line is: its segment, offset and
// length (with the "\n").
type segmentLoc struct {
	off int64
	seq uint32
	n   uint32
}

// segmentIndex maps message ids to their lines. Ids of MessageID's form
// ("msg_" and 32 lowercase hex digits) are kept as 16 bytes; any other id
// (a segment written by something else) as a string.
type segmentIndex struct {
	ids   map[[16]byte]segmentLoc
	other map[string]segmentLoc
}

func newSegmentIndex() segmentIndex {
	return segmentIndex{ids: map[[16]byte]segmentLoc{}, other: map[string]segmentLoc{}}
}

func compactID(id string) ([16]byte, bool) {
	var k [16]byte
	if len(id) != 36 || !strings.HasPrefix(id, "msg_") {
		return k, false
	}
	for _, c := range []byte(id[4:]) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return k, false
		}
	}
	_, err := hex.Decode(k[:], []byte(id[4:]))
	return k, err == nil
}

func (x segmentIndex) get(id string) (segmentLoc, bool) {
	if k, ok := compactID(id); ok {
		loc, ok := x.ids[k]
		return loc, ok
	}
	loc, ok := x.other[id]
	return loc, ok
}

// add records id's line, unless id has one already (the first stands).
func (x segmentIndex) add(id string, loc segmentLoc) {
	if k, ok := compactID(id); ok {
		if _, dup := x.ids[k]; !dup {
			x.ids[k] = loc
		}
		return
	}
	if _, dup := x.other[id]; !dup {
		x.other[id] = loc
	}
}

func (x segmentIndex) len() int { return len(x.ids) + len(x.other) }

// NewSegmentSink opens the segments of outboxDir (creating the
// directories if needed): it reads every segment into the index, and cuts
// a torn tail off the newest. Errors: the file system's; a damaged line
// in a segment other than the newest; errors.ErrUnsupported where
// flock(2) is not available.
func NewSegmentSink(outboxDir string) (*SegmentSink, error) {
	dir := filepath.Join(outboxDir, "segments")
	if err := os.MkdirAll(outboxDir, 0o700); err != nil {
		return nil, fmt.Errorf("outbox directory: %w", err)
	}
	switch err := os.Mkdir(dir, 0o700); {
	case err == nil:
		if err := syncDir(outboxDir); err != nil {
			return nil, err
		}
	case !errors.Is(err, os.ErrExist):
		return nil, fmt.Errorf("outbox segments directory: %w", err)
	}
	s := &SegmentSink{dir: dir, MaxSegmentBytes: DefaultSegmentBytes, pendingIDs: map[string]int{}, resync: map[uint64]bool{}}
	unlock, err := lockPath(filepath.Join(dir, "lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := s.loadLocked(); err != nil {
		return nil, err
	}
	return s, nil
}

// segmentName is the file name of segment seq.
func segmentName(seq uint64) string { return fmt.Sprintf("%012d.jsonl", seq) }

func (s *SegmentSink) path(seq uint64) string { return filepath.Join(s.dir, segmentName(seq)) }

// segments lists the segment numbers in dir, in order.
func segments(dir string) ([]uint64, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	var seqs []uint64
	for _, name := range names {
		num, ok := strings.CutSuffix(name, ".jsonl")
		if !ok || len(num) != 12 {
			continue
		}
		if seq, err := strconv.ParseUint(num, 10, 64); err == nil && seq > 0 {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

// loadLocked (re)builds the index from every segment; the caller holds
// the lock.
func (s *SegmentSink) loadLocked() error {
	seqs, err := segments(s.dir)
	if err != nil {
		return fmt.Errorf("outbox segments: %w", err)
	}
	s.index, s.seq, s.size = newSegmentIndex(), 0, 0
	for i, seq := range seqs {
		if seq > 1<<32-1 {
			return fmt.Errorf("outbox segment %s: number out of range", segmentName(seq))
		}
		end, err := s.readLocked(seq, 0, i == len(seqs)-1)
		if err != nil {
			return err
		}
		s.seq, s.size = seq, end
	}
	return nil
}

// readLocked indexes the lines of segment seq from offset from (a line
// boundary) to its end and returns the end of its last whole line. In the
// newest segment (newest), whatever follows that is a torn tail and is
// cut off; in another, it is damage and an error.
func (s *SegmentSink) readLocked(seq uint64, from int64, newest bool) (int64, error) {
	f, err := os.Open(s.path(seq))
	if err != nil {
		return 0, fmt.Errorf("outbox segment: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if fi.Size() > 1<<32-1 {
		return 0, fmt.Errorf("outbox segment %s: larger than 4 GiB, not one this sink wrote", f.Name())
	}
	end, err := scanSegment(io.NewSectionReader(f, from, fi.Size()-from), newest, func(off int64, n int, id string) {
		s.index.add(id, segmentLoc{off: from + off, seq: uint32(seq), n: uint32(n)})
	})
	if err != nil {
		return 0, fmt.Errorf("outbox segment %s: %w", f.Name(), err)
	}
	end += from
	if end == fi.Size() {
		return end, nil
	}
	if !newest {
		return 0, fmt.Errorf("outbox segment %s is damaged at byte %d: not a crash's torn tail (only the newest segment can have one); check it and move it aside", f.Name(), end)
	}
	// A torn tail: its messages were never recorded as delivered (their
	// Flush did not return), so they are delivered again.
	if err := os.Truncate(f.Name(), end); err != nil {
		return 0, fmt.Errorf("outbox segment %s: cutting its torn tail: %w", f.Name(), err)
	}
	s.cut.Add(fi.Size() - end)
	return end, nil
}

// catchUpLocked indexes what other sinks appended since this one last
// read, cutting a torn tail off; the caller holds the lock.
func (s *SegmentSink) catchUpLocked() error {
	for {
		if s.seq != 0 {
			fi, err := os.Stat(s.path(s.seq))
			switch {
			case errors.Is(err, os.ErrNotExist):
				// Removed (by a consumer): the next write starts a new segment.
				s.size = 0
			case err != nil:
				return err
			case fi.Size() < s.size:
				// Shorter than read: not by a sink (it cuts only what it
				// never indexed). Read everything again.
				return s.loadLocked()
			case fi.Size() > s.size:
				_, err := os.Stat(s.path(s.seq + 1))
				end, rerr := s.readLocked(s.seq, s.size, errors.Is(err, os.ErrNotExist))
				if rerr != nil {
					return rerr
				}
				s.size = end
			}
		}
		if _, err := os.Stat(s.path(s.seq + 1)); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		s.seq, s.size = s.seq+1, 0
	}
}

// scanSegment reads message lines from r, calling fn with each whole
// line's offset, length (with its "\n") and message id, up to the first
// line that is not a whole message line; it returns where that line
// starts (the end of r when every line is whole). With strict, every line
// is also checked to be valid JSON (the newest segment, where a torn tail
// may be). Errors: r's.
func scanSegment(r io.Reader, strict bool, fn func(off int64, n int, id string)) (int64, error) {
	buf := make([]byte, 0, 256<<10)
	var base int64 // offset of buf[0]
	eof := false
	for {
		for !eof && len(buf) < cap(buf) {
			n, err := r.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			if err == io.EOF {
				eof = true
			} else if err != nil {
				return 0, err
			}
		}
		used, bad := scanLines(buf, strict, func(off, n int, id string) { fn(base+int64(off), n, id) })
		base += int64(used)
		if bad || eof {
			// At the end, what is left has no "\n": a torn line (or nothing).
			return base, nil
		}
		buf = buf[:copy(buf, buf[used:])]
		if len(buf) == cap(buf) { // one line fills the buffer
			if cap(buf) >= maxLineBytes {
				return base, nil // too long to be a message line
			}
			buf = slices.Grow(buf, cap(buf))
		}
	}
}

// scanLines calls fn for each whole message line at the start of b and
// returns the length of those lines; bad is set when it stopped at a line
// that is whole (ends in "\n") but not a message line. A last line
// without its "\n" is left unread, bad unset: more may follow.
func scanLines(b []byte, strict bool, fn func(off, n int, id string)) (used int, bad bool) {
	for used < len(b) {
		i := bytes.IndexByte(b[used:], '\n')
		if i < 0 {
			return used, false
		}
		id, ok := lineID(b[used:used+i], strict)
		if !ok {
			return used, true
		}
		fn(used, i+1, id)
		used += i + 1
	}
	return used, false
}

// lineID returns the message id of a line (without its "\n"): a JSON
// object with a non-empty string message_id. The sink's own lines start
// with it and are read without decoding the rest, unless strict; any
// other line is decoded.
func lineID(line []byte, strict bool) (string, bool) {
	const prefix = `{"message_id":"`
	if rest, ok := bytes.CutPrefix(line, []byte(prefix)); ok && len(line) > 0 && line[len(line)-1] == '}' {
		if i := bytes.IndexByte(rest, '"'); i > 0 && bytes.IndexByte(rest[:i], '\\') < 0 {
			if !strict || json.Valid(line) {
				return string(rest[:i]), true
			}
			return "", false
		}
	}
	var v struct {
		MessageID *string `json:"message_id"`
	}
	if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &v) != nil || v.MessageID == nil || *v.MessageID == "" {
		return "", false
	}
	return *v.MessageID, true
}

// Deliver implements Sink: it checks m against the segments as this sink
// last read them and keeps its line for the next Flush. A message whose id
// is in a segment already is done when it is this very message (its
// segment is synced again at the next Flush), and refused with a
// *PermanentError when it is a different one.
func (s *SegmentSink) Deliver(_ context.Context, m *Message) error {
	p := payloadOf(m)
	line, err := json.Marshal(p)
	if err != nil {
		return &PermanentError{Err: fmt.Errorf("encode message: %w", err)}
	}
	// A line the reader would not take back as this message's — too long,
	// or an id that does not survive the JSON round trip (invalid UTF-8)
	// or is empty — would read as a torn tail, or be missed by the index.
	if id, ok := lineID(line, true); !ok || id != m.MessageID || len(line) >= maxLineBytes {
		return &PermanentError{Err: fmt.Errorf("message %q cannot be written as a segment line (an empty or invalid id, or larger than %d bytes)", m.MessageID, maxLineBytes)}
	}
	line = append(line, '\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.pendingIDs[m.MessageID]; ok {
		if bytes.Equal(s.pending[i].line, line) {
			return nil
		}
		return s.refusal(m.MessageID)
	}
	if loc, ok := s.index.get(m.MessageID); ok {
		same, err := s.holds(loc, p)
		if err != nil {
			return err
		}
		if !same {
			return s.refusal(m.MessageID)
		}
		s.resync[uint64(loc.seq)] = true
		return nil
	}
	s.pendingIDs[m.MessageID] = len(s.pending)
	s.pending = append(s.pending, pendingLine{payload: p, line: line})
	return nil
}

func (s *SegmentSink) refusal(id string) error {
	return &PermanentError{Err: fmt.Errorf("the outbox segments already hold a different message under id %s; it was not overwritten and this message was not delivered", id)}
}

// holds reports whether the line at loc is the message of payload p. A line whose segment was
// removed (by a consumer, once read) counts as m: it was delivered, and
// there is nothing left to compare with.
func (s *SegmentSink) holds(loc segmentLoc, p deliveryPayload) (bool, error) {
	f, err := os.Open(s.path(uint64(loc.seq)))
	if errors.Is(err, os.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	b := make([]byte, loc.n)
	if _, err := f.ReadAt(b, loc.off); err != nil {
		return false, fmt.Errorf("outbox segment %s: %w", f.Name(), err)
	}
	var got deliveryPayload
	if err := json.Unmarshal(b, &got); err != nil {
		return false, fmt.Errorf("outbox segment %s at byte %d: %w", f.Name(), loc.off, err)
	}
	return samePayload(got, p), nil
}

// Flush implements Sink: under the lock, it reads what others appended
// since, appends the lines delivered since the last Flush that are not
// there yet with one write, and fdatasyncs the segment (and the segments
// of redelivered messages). It returns an error — and the deliverer then
// records nothing of the pass — when a line delivered since the last
// Flush turned out to be in a segment already as a different message
// (another process appended it meanwhile): its redelivery is refused.
func (s *SegmentSink) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 && len(s.resync) == 0 {
		return nil
	}
	unlock, err := lockPath(filepath.Join(s.dir, "lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if err := s.catchUpLocked(); err != nil {
		return err
	}
	var conflicts []error
	var write []pendingLine
	for _, p := range s.pending {
		loc, ok := s.index.get(p.payload.MessageID)
		if !ok {
			write = append(write, p)
			continue
		}
		same, err := s.holds(loc, p.payload)
		switch {
		case err != nil:
			return err
		case same:
			s.resync[uint64(loc.seq)] = true
		default:
			conflicts = append(conflicts, fmt.Errorf("message %s: another process appended a different message under its id meanwhile", p.payload.MessageID))
		}
	}
	if len(write) > 0 {
		if err := s.appendLocked(write); err != nil {
			return err
		}
	}
	s.pending, s.pendingIDs = nil, map[string]int{}
	for seq := range s.resync {
		if err := s.syncSegment(seq); err != nil {
			return err
		}
		delete(s.resync, seq)
	}
	return errors.Join(conflicts...)
}

// appendLocked writes the lines at the end of the newest segment (a new
// one when there is none or they would take it past MaxSegmentBytes) in
// one write, indexes them, and fdatasyncs the segment. A failed write or
// sync is taken back (truncated) so that the redelivery writes it again.
func (s *SegmentSink) appendLocked(lines []pendingLine) error {
	var batch []byte
	for _, p := range lines {
		batch = append(batch, p.line...)
	}
	limit := s.MaxSegmentBytes
	if limit <= 0 {
		limit = DefaultSegmentBytes
	}
	limit = min(limit, 1<<31) // offsets and lengths fit the index's 32 bits
	flags := os.O_WRONLY | os.O_APPEND
	if s.seq == 0 || s.size > 0 && s.size+int64(len(batch)) > limit || !exists(s.path(s.seq)) {
		if s.seq+1 > 1<<32-1 {
			return errors.New("outbox segments: out of segment numbers")
		}
		s.seq, s.size = s.seq+1, 0
		flags |= os.O_CREATE | os.O_EXCL
	}
	f, err := os.OpenFile(s.path(s.seq), flags, 0o600)
	if err != nil {
		return fmt.Errorf("outbox segment: %w", err)
	}
	defer f.Close()
	if flags&os.O_CREATE != 0 {
		if err := syncDir(s.dir); err != nil {
			return err
		}
	}
	start := s.size
	if _, err := f.Write(batch); err != nil {
		_ = f.Truncate(start)
		return fmt.Errorf("outbox segment %s: %w", f.Name(), err)
	}
	s.syncs.Add(1)
	if err := datasync(f); err != nil {
		// What the failed sync left on disk is unknown: take the lines
		// back while the lock keeps everyone else off them.
		_ = f.Truncate(start)
		return fmt.Errorf("outbox segment %s: sync: %w", f.Name(), err)
	}
	off := start
	for _, p := range lines {
		s.index.add(p.payload.MessageID, segmentLoc{off: off, seq: uint32(s.seq), n: uint32(len(p.line))})
		off += int64(len(p.line))
	}
	s.size = off
	delete(s.resync, s.seq) // just synced
	return nil
}

// syncSegment fdatasyncs segment seq, unless it is gone.
func (s *SegmentSink) syncSegment(seq uint64) error {
	f, err := os.OpenFile(s.path(seq), os.O_WRONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	s.syncs.Add(1)
	if err := datasync(f); err != nil {
		return fmt.Errorf("outbox segment %s: sync: %w", f.Name(), err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// syncDir makes dir's entries durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
