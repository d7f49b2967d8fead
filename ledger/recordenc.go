package ledger

import (
	"bytes"
	"compress/zlib"
	"encoding/json"
	"fmt"
	"io"
)

// The stored form of a record, the value kept under tenant \x00 key in the
// records collection of every backend, has one format: the Record's JSON
// as encoding/json writes it, compressed by compress/zlib at BestSpeed
// without a preset dictionary (RFC 1950: DEFLATE, and an Adler-32
// checksum of the JSON, so that damaged bytes are an error rather than
// another record). The saved result is inside it byte for byte: a replay
// returns exactly what the first call returned.
//
// What record size costs, measured on 100 000 create_orders made through
// the tool service (idemgate bench __in-process --fill 100000): nothing in
// pages per create commit (34.1 with plain JSON records, 34.0 with this
// format: a commit writes one leaf per tree it touches, whatever the
// record's size), and file size: 389 MB with plain JSON records (988
// bytes each on average), 304 MB with this format (501), 288 MB with the
// development format before it, whose preset dictionary was made of one
// tool's JSON (366). At 1 000 000 creates (--fill 1000000): 2.90 GB
// and 38.9 pages per create commit with this format, 2.71 GB and 37.9
// with the dictionary (the larger records make a tree one level deeper).
// Compressing costs some 14 µs of CPU per write and
// 9 µs per read, against some 700 µs of CPU per create; zlib's default
// level makes a record 3 % smaller for 70 % more CPU. So records are
// compressed, by the standard library, with nothing of any one tool in
// the format.

// recordLevel is the DEFLATE level records are written at. It is not part
// of the format: any level decodes.
const recordLevel = zlib.BestSpeed

// Compressors and decompressors are kept for reuse: a DEFLATE writer
// holds some 700 KB of tables and a reader some 40 KB, too much to
// allocate per record. They are caches, not state (every record is
// encoded and decoded alone), in bounded free lists rather than
// sync.Pools, which every garbage collection empties: a writer allocated
// again after each collection would make the collections more frequent.
// Writes are serialised by the backend's writer, so a few writers serve
// every caller; reads run side by side.
var (
	recordWriters = make(chan *zlib.Writer, 2)
	recordReaders = make(chan io.ReadCloser, 8) // each a zlib.Resetter
)

func getRecordWriter(dst io.Writer) *zlib.Writer {
	select {
	case w := <-recordWriters:
		w.Reset(dst)
		return w
	default:
	}
	w, err := zlib.NewWriterLevel(dst, recordLevel)
	if err != nil {
		panic("ledger: record compressor: " + err.Error()) // only for an invalid level
	}
	return w
}

// putRecordWriter keeps w for the next record. It is reset when taken,
// so until then it refers to the last record's buffer.
func putRecordWriter(w *zlib.Writer) {
	select {
	case recordWriters <- w:
	default:
	}
}

// EncodeRecord returns r in its stored form. It does not change r.
func EncodeRecord(r *Record) ([]byte, error) {
	plain, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	var z bytes.Buffer
	z.Grow(len(plain) / 2)
	w := getRecordWriter(&z)
	_, err = w.Write(plain)
	if err == nil {
		err = w.Close()
	}
	putRecordWriter(w)
	if err != nil {
		return nil, err
	}
	return z.Bytes(), nil
}

// DecodeRecord decodes a record's stored form. A record of a result
// format newer than this build's (ResultFormat), or one stored by a
// development build before the format was reset (JSON beginning as those
// builds wrote it), is ErrSchemaVersion; bytes that are not a record are
// another error.
func DecodeRecord(v []byte) (*Record, error) {
	if bytes.HasPrefix(v, []byte(`{"tenant":`)) || bytes.HasPrefix(v, []byte(`{"result_format":`)) {
		return nil, fmt.Errorf("%w: the record was stored by a development build before the record format was reset", ErrSchemaVersion)
	}
	plain, err := inflateRecord(v, maxRecordSize)
	if err != nil {
		return nil, fmt.Errorf("compressed record: %w", err)
	}
	var r Record
	if err := json.Unmarshal(plain, &r); err != nil {
		return nil, err
	}
	if r.ResultFormat > ResultFormat {
		// Written by a newer idemgate: replaying a result this build does
		// not understand could hand back something it never returned.
		return nil, fmt.Errorf("%w: the record has result format %d, this build reads up to %d", ErrSchemaVersion, r.ResultFormat, ResultFormat)
	}
	return &r, nil
}

// maxRecordSize bounds a decompressed record, so that damaged or hostile
// bytes cannot make a read allocate without limit. No record the ledger
// writes comes near it (arguments and results are bounded far below).
const maxRecordSize = 64 << 20

// inflateRecord decompresses a stored record, refusing more than limit
// bytes.
func inflateRecord(z []byte, limit int64) ([]byte, error) {
	src := bytes.NewReader(z)
	var fr io.ReadCloser
	var err error
	select {
	case fr = <-recordReaders:
		err = fr.(zlib.Resetter).Reset(src, nil)
	default:
		fr, err = zlib.NewReader(src)
	}
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.Grow(3*len(z) + bytes.MinRead) // ReadFrom wants MinRead spare bytes
	n, err := out.ReadFrom(io.LimitReader(fr, limit+1))
	if err == nil {
		select {
		case recordReaders <- fr:
		default:
		}
	}
	if err != nil {
		return nil, err
	}
	if n > limit {
		return nil, fmt.Errorf("more than %d bytes decompressed", limit)
	}
	return out.Bytes(), nil
}
