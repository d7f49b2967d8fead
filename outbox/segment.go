package outbox

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
//   - A torn tail is the newest segment's last line when it does not end
//     in "\n": what a power loss before the fdatasync, or a process killed
//     in its write, leaves. The next holder of the lock (at open or at a
//     Flush) copies it to <seq>.jsonl.torn-<offset>-<n> beside the segment
//     (synced), then cuts it off, and logs a warning naming the message
//     when its id is readable. Such a message was normally not recorded
//     as delivered (its Flush did not return) and is appended again when
//     redelivered; a line cut after its delivery was recorded (a file
//     shortened by hand or by a damaged file system) is never appended
//     again, and the kept copy, the warning, TornTails and CheckSegments
//     are how it is not lost without a word.
//   - Any other line that is not a whole message line — a whole line
//     (ending in "\n") that is not a JSON object with a message_id, in
//     any segment, or an unterminated last line in an older one — is
//     damage, never a torn tail: nothing is cut, and the sink refuses it
//     with a *SegmentDamageError naming the file, line and byte, at open
//     (NewSegmentSink fails: a server does not start) and at a Flush
//     that finds it in what others appended (Flush fails and delivers
//     nothing: messages stay queued, the server keeps serving, Damaged
//     reports it). Damage is not what a crash of this sink leaves, so the
//     lines after it are messages too — some recorded as delivered — and
//     a sink cannot tell which bytes to drop: an operator repairs or
//     removes the damaged line (CheckSegments lists every one).
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
	log *slog.Logger
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

	syncs   atomic.Int64 // syncs issued (tests, benchmarks)
	cut     atomic.Int64 // torn bytes cut off (tests)
	torn    atomic.Int64 // torn tails cut off (TornTails)
	damaged atomic.Bool  // the last Flush found damage (Damaged)
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
// a torn tail off the newest (kept aside, and logged to log at warning
// level; nil log: not logged). Errors: the file system's; a
// *SegmentDamageError for a damaged line in any segment;
// errors.ErrUnsupported where flock(2) is not available.
func NewSegmentSink(outboxDir string, log *slog.Logger) (*SegmentSink, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
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
	s := &SegmentSink{dir: dir, log: log, MaxSegmentBytes: DefaultSegmentBytes, pendingIDs: map[string]int{}, resync: map[uint64]bool{}}
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
// boundary) to its end and returns the end of its last whole line. An
// unterminated last line of the newest segment (newest) is a torn tail:
// it is kept aside and cut off (cutTorn). Any other line that is not a
// message line is a *SegmentDamageError, and nothing is cut.
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
	bad := int64(-1)
	end, err := scanSegment(io.NewSectionReader(f, from, fi.Size()-from), newest, func(off int64, n int, id string) {
		s.index.add(id, segmentLoc{off: from + off, seq: uint32(seq), n: uint32(n)})
	}, func(off int64) bool {
		bad = from + off
		return false
	})
	if err != nil {
		return 0, fmt.Errorf("outbox segment %s: %w", f.Name(), err)
	}
	end += from
	switch {
	case bad >= 0:
		return 0, damageAt(f, bad)
	case end == fi.Size():
		return end, nil
	case !newest:
		return 0, damageAt(f, end) // a segment is complete before the next starts
	}
	if err := s.cutTorn(f, seq, end, fi.Size()); err != nil {
		return 0, err
	}
	return end, nil
}

// cutTorn handles the torn tail of segment seq (open as f): bytes end to
// size, an unterminated last line. It copies them to a file of their own
// beside the segment and syncs it, then cuts them off the segment, and
// logs it naming the message when the bytes show its id. The caller holds
// the lock.
func (s *SegmentSink) cutTorn(f *os.File, seq uint64, end, size int64) error {
	id := tornID(f, end) // before the cut
	kept, err := keepTorn(s.dir, seq, end, io.NewSectionReader(f, end, size-end))
	if err != nil {
		return fmt.Errorf("outbox segment %s: keeping its torn tail aside: %w", f.Name(), err)
	}
	if err := os.Truncate(f.Name(), end); err != nil {
		return fmt.Errorf("outbox segment %s: cutting its torn tail: %w", f.Name(), err)
	}
	s.cut.Add(size - end)
	s.torn.Add(1)
	s.log.Warn("outbox segment: cut off an unterminated last line (a torn write) and kept it aside",
		"segment", f.Name(), "byte", end, "bytes", size-end, "message_id", id, "kept", kept,
		"meaning", "a crash before the write was synced leaves one: its message was not recorded as delivered and is appended again when redelivered; "+
			"if the ledger records it as delivered (get_operation_status), its line was lost after delivery and is not written again: recover it from the kept file. "+
			"idemgate check lists kept files whose message is not in the segments")
	return nil
}

// keepTorn copies torn, the tail at byte off of segment seq, to a new
// file <segment>.torn-<off>-<n> in dir (n makes the name unique: a crash
// before the cut leaves the tail to be kept again), synced with its
// directory entry, and returns its path.
func keepTorn(dir string, seq uint64, off int64, torn io.Reader) (string, error) {
	f, err := os.CreateTemp(dir, fmt.Sprintf("%s.torn-%d-*", segmentName(seq), off))
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := io.Copy(f, torn); err != nil {
		return "", err
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	return f.Name(), syncDir(dir)
}

// tornID is the message id the torn line at byte off of r shows (the
// sink's lines start with it), or "(unreadable)" when it was cut before
// the id's end.
func tornID(r io.ReaderAt, off int64) string {
	b := make([]byte, 128) // more than `{"message_id":"` and an id of MessageID's
	n, _ := r.ReadAt(b, off)
	rest, ok := bytes.CutPrefix(b[:n], []byte(`{"message_id":"`))
	if i := bytes.IndexByte(rest, '"'); ok && i > 0 && bytes.IndexByte(rest[:i], '\\') < 0 {
		return strings.ToValidUTF8(string(rest[:i]), "?")
	}
	return "(unreadable)"
}

// SegmentDamageError is a line of a segment that is not a message line
// and not a torn tail (see SegmentSink): nothing of the segment was cut.
type SegmentDamageError struct {
	Path   string
	Line   int   // the damaged line's number, from 1
	Offset int64 // where it starts
	After  int   // the whole lines after it in the segment
}

func (e *SegmentDamageError) Error() string {
	return fmt.Sprintf("outbox segment %s is damaged at line %d (byte %d): a line that is not a message line, "+
		"and not a torn tail (only an unterminated last line of the newest segment is one); nothing was cut: the %d whole line(s) after it are kept. "+
		"Repair or remove that line (the lines after it are messages, some recorded as delivered: keep them); "+
		"until then no server starts on these segments and deliveries wait queued; idemgate check lists every damaged line", e.Path, e.Line, e.Offset, e.After)
}

// damageAt is the *SegmentDamageError of the line at byte off of f.
func damageAt(f *os.File, off int64) error {
	var before, rest int // newlines before off, and from it on
	buf := make([]byte, 256<<10)
	for pos := int64(0); ; {
		n, err := f.ReadAt(buf, pos)
		split := int(min(max(off-pos, 0), int64(n)))
		before += bytes.Count(buf[:split], []byte("\n"))
		rest += bytes.Count(buf[split:n], []byte("\n"))
		pos += int64(n)
		if err != nil {
			break
		}
	}
	// The first newline from off on ends the damaged line itself.
	return &SegmentDamageError{Path: f.Name(), Line: before + 1, Offset: off, After: max(rest-1, 0)}
}

// catchUpLocked indexes what other sinks appended since this one last
// read, cutting a torn tail off (readLocked); the caller holds the lock.
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

// scanSegment reads lines from r: it calls fn with each whole message
// line's offset, length (with its "\n") and message id, and damaged with
// the offset of each whole line that is not a message line (strict: also
// each line that is not valid JSON, a check worth its cost where the
// latest writes are: the newest segment); the scan stops there unless damaged returns true. A line
// of maxLineBytes or more is damaged too, and always stops the scan. It
// returns where it stopped: the end of the last whole line read, or the
// start of the damaged line it stopped at; at the end of r, what follows
// has no "\n" (an unterminated last line, or nothing). Errors: r's.
func scanSegment(r io.Reader, strict bool, fn func(off int64, n int, id string), damaged func(off int64) bool) (int64, error) {
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
		used, stop := scanLines(buf, strict, func(off, n int, id string) { fn(base+int64(off), n, id) },
			func(off int) bool { return damaged(base + int64(off)) })
		base += int64(used)
		if stop || eof {
			return base, nil
		}
		buf = buf[:copy(buf, buf[used:])]
		if len(buf) == cap(buf) { // one line fills the buffer
			if cap(buf) >= maxLineBytes {
				damaged(base) // too long to be a message line
				return base, nil
			}
			buf = slices.Grow(buf, cap(buf))
		}
	}
}

// scanLines reads the whole lines at the start of b: fn gets each message
// line, damaged each other line (stop is set, and that line left unread,
// when damaged returns false). It returns the length of the lines read; a
// last line without its "\n" is left unread: more may follow.
func scanLines(b []byte, strict bool, fn func(off, n int, id string), damaged func(off int) bool) (used int, stop bool) {
	for used < len(b) {
		i := bytes.IndexByte(b[used:], '\n')
		if i < 0 {
			return used, false
		}
		if id, ok := lineID(b[used:used+i], strict); ok {
			fn(used, i+1, id)
		} else if !damaged(used) {
			return used, true
		}
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

// TornTails is how many torn tails this sink cut off (and kept aside)
// since it was opened.
func (s *SegmentSink) TornTails() int64 { return s.torn.Load() }

// Damaged reports whether the last Flush that read the segments failed
// on a damaged line (a *SegmentDamageError): deliveries wait until an
// operator repairs it.
func (s *SegmentSink) Damaged() bool { return s.damaged.Load() }

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
	// or is empty — would read as damage, or be missed by the index.
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
	err = s.catchUpLocked()
	var damage *SegmentDamageError
	s.damaged.Store(errors.As(err, &damage))
	if err != nil {
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
