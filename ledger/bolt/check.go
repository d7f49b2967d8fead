package bolt

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"idemgate/ledger"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	bbolt "go.etcd.io/bbolt"
)

// Errors of the ledger file itself. Each is returned wrapped in a message
// that names the file and says what to do; errors.Is finds the kind.
var (
	// ErrNoLedger: no file at the path, and the caller may not create one
	// (read-only commands, or a file that vanished while the process ran).
	ErrNoLedger = errors.New("no ledger file")

	// ErrEmptyFile: the file exists but holds no bytes. A ledger is never
	// empty once created, so this is a file truncated by a fault.
	ErrEmptyFile = errors.New("the ledger file is empty")

	// ErrNotLedger: the file is not an idemgate ledger (another program's
	// bbolt file, or not a bbolt file at all).
	ErrNotLedger = errors.New("not an idemgate ledger")

	// ErrDamaged: the file is an idemgate ledger whose pages or records are
	// damaged (cut short, overwritten).
	ErrDamaged = errors.New("the ledger file is damaged")

	// ErrReadOnly: a write on a store opened with OpenReadOnly.
	ErrReadOnly = errors.New("ledger: opened read-only")

	// ErrExists: Init found a file at the path.
	ErrExists = errors.New("a file already exists")
)

// fileError is the one-line message of a failure of the file: what is
// wrong with which file, and what to do.
type fileError struct {
	kind   error
	path   string
	detail string
	todo   string
}

func (e *fileError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ledger %s: %v", e.path, e.kind)
	if e.detail != "" {
		fmt.Fprintf(&b, " (%s)", oneLine(e.detail, 300))
	}
	if e.todo != "" {
		b.WriteString(": ")
		b.WriteString(e.todo)
	}
	return b.String()
}

func (e *fileError) Unwrap() error { return e.kind }

// oneLine flattens s to one line of at most n bytes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

func damagedError(path, detail string) error {
	return &fileError{kind: ErrDamaged, path: path, detail: detail,
		todo: "stop every process using it and restore it from a backup (idemgate backup); \"idemgate check --db " + path + "\" lists the problems"}
}

func notLedgerError(path, detail string) error {
	return &fileError{kind: ErrNotLedger, path: path, detail: detail,
		todo: "point --db at an idemgate ledger, or create a new one with \"idemgate init --db NEWPATH\""}
}

func emptyError(path string) error {
	return &fileError{kind: ErrEmptyFile, path: path,
		todo: "it may have been truncated by a fault; restore a backup, or delete it and run idemgate init"}
}

func noLedgerError(path string) error {
	return &fileError{kind: ErrNoLedger, path: path,
		todo: "create one with \"idemgate init --db " + path + "\" (or check --db / IDEMGATE_DB)"}
}

// bbolt's on-disk meta page (go.etcd.io/bbolt/internal/common): a 16-byte
// page header, then magic, version, page size, flags (4 bytes each), the
// root bucket (pgid, sequence), the freelist pgid, the high-water pgid, the
// txid and an FNV-64a checksum of everything before it.
const (
	boltMagic       = 0xED0CDAED
	boltVersion     = 2
	pageHeaderSize  = 16
	metaChecksumOff = 56
	metaSize        = 64
	noFreelist      = ^uint64(0)
)

var errNoMagic = errors.New("no bbolt magic number")

type diskMeta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64
	txid     uint64
}

func parseMeta(b []byte) (diskMeta, error) {
	if len(b) < pageHeaderSize+metaSize {
		return diskMeta{}, errors.New("short meta page")
	}
	m := b[pageHeaderSize : pageHeaderSize+metaSize]
	le := binary.NativeEndian // bbolt writes its structs in the host's byte order
	if le.Uint32(m[0:]) != boltMagic {
		return diskMeta{}, errNoMagic
	}
	if le.Uint32(m[4:]) != boltVersion {
		return diskMeta{}, fmt.Errorf("bbolt format version %d", le.Uint32(m[4:]))
	}
	h := fnv.New64a()
	h.Write(m[:metaChecksumOff])
	if h.Sum64() != le.Uint64(m[metaChecksumOff:]) {
		return diskMeta{}, errors.New("meta page checksum mismatch")
	}
	return diskMeta{pageSize: le.Uint32(m[8:]), root: le.Uint64(m[16:]), freelist: le.Uint64(m[32:]), pgid: le.Uint64(m[40:]), txid: le.Uint64(m[48:])}, nil
}

// precheck inspects the file before bbolt maps it: it must not be empty,
// must start with a valid bbolt meta page, and every page the newest valid
// meta page refers to must lie inside the file (a file cut short would
// otherwise make bbolt fault on its mapping). It reads two pages.
func precheck(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return notLedgerError(path, "not a regular file")
	}
	size := fi.Size()
	if size == 0 {
		return emptyError(path)
	}
	buf := make([]byte, 4096)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	m0, err0 := parseMeta(buf[:n])
	ps := int64(4096)
	if err0 == nil {
		ps = int64(m0.pageSize)
		if ps < 512 || ps > 1<<20 || ps&(ps-1) != 0 {
			return damagedError(path, fmt.Sprintf("meta page 0 names page size %d", ps))
		}
	}
	buf1 := make([]byte, ps)
	n, err = f.ReadAt(buf1, ps)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	m1, err1 := parseMeta(buf1[:n])
	switch {
	case err0 != nil && err1 != nil:
		if n == 0 || errors.Is(err0, errNoMagic) && errors.Is(err1, errNoMagic) {
			return notLedgerError(path, "not a bbolt database")
		}
		return damagedError(path, "both meta pages are invalid: "+err0.Error())
	case err0 != nil || (err1 == nil && m1.txid > m0.txid):
		m0 = m1
	}
	if int64(m0.pageSize) != ps && err0 == nil {
		return damagedError(path, "the meta pages disagree on the page size")
	}
	end := int64(m0.pgid) * ps
	if m0.pgid < 2 || end/ps != int64(m0.pgid) || end > size {
		return damagedError(path, fmt.Sprintf("the file is %d bytes but its pages reach %d bytes: it was cut short", size, end))
	}
	if m0.root >= m0.pgid || (m0.freelist != noFreelist && m0.freelist >= m0.pgid) {
		return damagedError(path, "the meta page points past the end of the data")
	}
	return nil
}

// guard runs fn with memory faults turned into panics (bbolt reads a
// memory-mapped file: a damaged or shortened file faults) and turns a panic
// raised inside bbolt, or by a memory fault, into ErrDamaged naming path.
// Panics of fn's own code are re-raised.
//
// guard is what stands between the process and a damaged page that the
// checks at open did not read (a file over deepCheckLimit is not checked
// in full). With the backend's use of it, a damaged page guarantees this:
//
//   - The transaction that meets the page gets ErrDamaged, one line naming
//     the file and what to do; the process does not crash.
//   - That transaction commits nothing: bbolt rolls a transaction back
//     when its function or its commit panics, so no part of it, and no
//     copy of the damaged page, is written.
//   - The damaged page is never written over or freed: bbolt writes a
//     changed page to a new place, and a transaction rewrites or frees a
//     page only after reading it, which is the read that fails.
//   - Other transactions are served: a group commit that failed on the
//     damage runs its members again one by one (backend.commit), so only
//     those whose reads or writes reach the page fail. The file is then
//     checked in full again if it is within deepCheckLimit (backend.damaged),
//     which fails every later transaction; a bigger file is served as
//     before, each transaction that reaches the page failing alike.
//
// Not guaranteed: damage that still looks like a sound page (a valid
// header, elements within the page) raises no panic and is read as data.
// A record that then does not decode is an error naming its key, but bytes
// that decode are returned as they are, and a write to that page carries
// them on. "idemgate check" (bbolt's Tx.Check, then every record and audit
// entry decoded) finds what can be found.
func guard(path string, fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if !isDamagePanic(r) {
				panic(r)
			}
			detail := fmt.Sprint(r)
			if _, fault := r.(interface{ Addr() uintptr }); fault {
				// Not "invalid memory address or nil pointer dereference",
				// as the runtime words it.
				detail = "a read of the mapped file faulted: it was cut short or changed while in use"
			}
			err = damagedError(path, detail)
		}
	}()
	return fn()
}

// isDamagePanic reports whether the panic being recovered (r) came from a
// memory fault or from bbolt's own code (its assertions on page contents),
// as opposed to a bug in a caller's function. It must be called from the
// deferred function that recovered r.
func isDamagePanic(r any) bool {
	if a, ok := r.(interface{ Addr() uintptr }); ok && a.Addr() >= 4096 {
		return true // a fault on the mapped file (debug.SetPanicOnFault); not a nil dereference
	}
	pc := make([]uintptr, 64)
	n := runtime.Callers(3, pc)
	frames := runtime.CallersFrames(pc[:n])
	afterPanic := false
	for {
		f, more := frames.Next()
		switch {
		case f.Function == "runtime.gopanic":
			afterPanic = true
		case afterPanic && strings.HasPrefix(f.Function, "runtime."):
			// runtime.panicIndex and friends: look at their caller
		case afterPanic:
			return strings.HasPrefix(f.Function, "go.etcd.io/bbolt")
		}
		if !more {
			return false
		}
	}
}

// deepCheck walks every bucket, key and value of the file (in this
// goroutine, under guard, so a damaged page is an error and not a crash)
// and then runs bbolt's own consistency check (Tx.Check). It returns at
// most limit problems.
func deepCheck(path string, db *bbolt.DB, limit int) []error {
	var problems []error
	err := guard(path, func() error {
		return db.View(func(tx *bbolt.Tx) error {
			var sum byte
			var walk func(b *bbolt.Bucket, depth int) error
			walk = func(b *bbolt.Bucket, depth int) error {
				return b.ForEach(func(k, v []byte) error {
					sum ^= touch(k)
					if v == nil && depth < 8 {
						if child := b.Bucket(k); child != nil {
							return walk(child, depth+1)
						}
						return nil
					}
					sum ^= touch(v)
					return nil
				})
			}
			err := tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
				return walk(b, 0)
			})
			runtime.KeepAlive(sum) // the reads above must happen
			return err
		})
	})
	if err != nil {
		return []error{err}
	}
	err = db.View(func(tx *bbolt.Tx) error {
		for e := range tx.Check() {
			if len(problems) < limit {
				problems = append(problems, damagedError(path, e.Error()))
			}
		}
		return nil
	})
	if err != nil {
		problems = append(problems, damagedError(path, err.Error()))
	}
	return problems
}

// touch reads the first and last byte of b, so a slice that points outside
// the mapped file faults here, under guard.
func touch(b []byte) byte {
	if len(b) == 0 {
		return 0
	}
	return b[0] ^ b[len(b)-1]
}

// CheckReport is what Check found.
type CheckReport struct {
	Records  int     // records decoded
	Audit    int     // audit entries decoded
	Problems []error // each one line; empty when the file is sound
}

// maxProblems bounds the problems one Check reports.
const maxProblems = 50

// Check opens the ledger at path read-only and checks all of it: bbolt's
// page consistency check (Tx.Check, every page), then every operation
// record and audit entry must decode. It never writes. A file that cannot
// be opened at all is returned as the error; problems found inside an
// opened file are in the report. o are OpenReadOnly's options.
func Check(path string, o ...OpenOption) (CheckReport, error) {
	s, err := open(path, ledger.Options{}, openReadOnly, false, 0, o...) // Check reports every problem
	if err != nil {
		return CheckReport{}, err
	}
	defer s.Close()
	return s.Check()
}

// Check checks all of the open ledger f as the function Check checks a
// file: in read transactions beside f's calls (the owner of a ledger runs
// `idemgate check` so).
func (f *File) Check() (CheckReport, error) {
	var rep CheckReport
	path := f.be.path
	db, err := f.be.acquire()
	if err != nil {
		return rep, err
	}
	defer f.be.release()
	rep.Problems = deepCheck(path, db, maxProblems)
	if len(rep.Problems) > 0 {
		return rep, nil
	}
	add := func(e error) {
		if len(rep.Problems) < maxProblems {
			rep.Problems = append(rep.Problems, e)
		}
	}
	err = guard(path, func() error {
		return db.View(func(tx *bbolt.Tx) error {
			if b := tx.Bucket(bucketRecords); b != nil {
				b.ForEach(func(k, v []byte) error {
					// A record of a newer build's format is not damage:
					// this build refuses to use it, and says so then.
					if _, err := ledger.DecodeRecord(v); err != nil && !errors.Is(err, ledger.ErrSchemaVersion) {
						add(damagedError(path, fmt.Sprintf("record %q cannot be decoded: %v", strings.ReplaceAll(string(k), "\x00", "/"), err)))
					} else {
						rep.Records++
					}
					return nil
				})
			}
			if b := tx.Bucket(bucketAudit); b != nil {
				b.ForEach(func(k, v []byte) error {
					var e ledger.AuditEntry
					if err := json.Unmarshal(v, &e); err != nil {
						add(damagedError(path, fmt.Sprintf("audit entry %x cannot be decoded: %v", k, err)))
					} else {
						rep.Audit++
					}
					return nil
				})
			}
			return nil
		})
	})
	if err != nil {
		add(err)
	}
	return rep, nil
}
