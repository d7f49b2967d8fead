package ledger

import (
	"bytes"
	"compress/zlib"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// The stored form of a record: the value kept under tenant \x00 key in the
// records collection. Two formats exist, told apart by the value itself.
//
// Format 1, written by builds before format 2: the Record's JSON as
// json.Marshal writes it (it starts with {"tenant":).
//
// Format 2, written by this build: a JSON object of three members,
//
//	{"result_format":2,"audit_seqs":[…],"z":"<base64>"}
//
// whose z is the Record's JSON (format 1, with audit_seqs left out)
// compressed in the zlib format (RFC 1950: DEFLATE with the preset
// dictionary recordDict, and a checksum of the uncompressed bytes, so that
// damaged bytes are an error rather than another record). result_format and audit_seqs stay outside the
// compressed part under their format-1 names, for builds that read format
// 1 only: such a build decodes result_format, finds it above the format it
// reads and refuses the record (ErrSchemaVersion) instead of taking it
// for an empty one, and still finds the record's audit entries from
// audit_seqs. The saved result is inside the compressed part byte for
// byte: a replay returns exactly what the first call returned.
//
// Format 2 makes a finished create_order's record about 37 % of its
// format-1 size (400 bytes instead of 1 080), for some 15–20 µs of CPU
// more per write (most of it compress/flate clearing its tables) and
// 5–10 µs per read. recordDict is part of the
// format: changing a byte of it makes every format-2 record unreadable, so
// a different dictionary is a new format (TestRecordDictPinned).

// recordFormatCompressed is the first format in which records are stored
// compressed (ResultFormat is the newest this build writes).
const recordFormatCompressed = 2

// recordLevel is the DEFLATE level format 2 is written at: the lowest
// that uses the preset dictionary (compress/flate's BestSpeed ignores it);
// higher levels make this project's records a few percent smaller for
// more CPU. The level is not part of the format: any level decodes.
const recordLevel = 2

// storedRecord is the outer JSON of a format-2 record.
type storedRecord struct {
	Format    int      `json:"result_format"`
	AuditSeqs []uint64 `json:"audit_seqs,omitempty"`
	Z         []byte   `json:"z"`
}

// recordDict is format 2's preset DEFLATE dictionary: the JSON of the
// records this project writes most, a finished create_order last (nearest
// to the data, so cheapest to refer to). It is short because its length is
// CPU: every record's compression hashes it and every decompression
// copies it. Never change it (see above).
const recordDict = `"lease_owner":"","lease_expires_at":"20","state":"in_progress","error":{"code":"","message":""},` +
	`"approval":{"approval_id":"apr_","status":"pending","reason":"","rule":"","requested_by":"","diff":,"diff_text":"","created_at":"20","expires_at":"20"},` +
	`"args":{"customer_id":"","items":[{"sku":"","quantity":1,"unit_price_minor":}],"currency":"EUR","notify_customer":true},` +
	`"result":{"message":{"message_id":"msg_","channel":"email","recipients":1,"state":"queued"}},` +
	`{"tenant":"default","key":"","tool":"create_order","fingerprint":"","state":"succeeded","attempts":1,"generation":1,"incarnation":"t","on_lease_expiry":"retryable","principal":"","downstream":"embedded","result_format":2,` +
	`"result":{"confirmation":{"message_id":"msg_","state":"queued"},"order":{"order_id":"ord_","version":1,"status":"placed","customer_id":"","items":[{"sku":"","quantity":1,"unit_price_minor":}],"currency":"EUR","total_minor":,"operation_key":"","created_at":"20","updated_at":"20"}},` +
	`"summary":"order ord_","downstream_ref":"ord_","first_seen_at":"20","updated_at":"20","completed_at":"20`

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
	w, err := zlib.NewWriterLevelDict(dst, recordLevel, []byte(recordDict))
	if err != nil {
		panic("ledger: record compressor: " + err.Error()) // only for an invalid level
	}
	return w
}

// putRecordWriter keeps w for the next record. It is reset when taken
// (a reset clears its tables, the dearest part of a small record's
// compression), so until then it refers to the last record's buffer.
func putRecordWriter(w *zlib.Writer) {
	select {
	case recordWriters <- w:
	default:
	}
}

// EncodeRecord returns r in the stored form this build writes (format 2).
// It does not change r.
func EncodeRecord(r *Record) ([]byte, error) {
	body := *r
	body.AuditSeqs = nil // kept outside, see above
	plain, err := json.Marshal(&body)
	if err != nil {
		return nil, err
	}
	z, err := deflateRecord(plain)
	if err != nil {
		return nil, err
	}
	// storedRecord's JSON, written out: it is on the path of every write.
	out := make([]byte, 0, 48+20*len(r.AuditSeqs)+base64.StdEncoding.EncodedLen(len(z)))
	out = append(out, `{"result_format":`...)
	out = strconv.AppendInt(out, recordFormatCompressed, 10)
	if len(r.AuditSeqs) > 0 {
		out = append(out, `,"audit_seqs":[`...)
		for i, seq := range r.AuditSeqs {
			if i > 0 {
				out = append(out, ',')
			}
			out = strconv.AppendUint(out, seq, 10)
		}
		out = append(out, ']')
	}
	out = append(out, `,"z":"`...)
	out = base64.StdEncoding.AppendEncode(out, z)
	return append(out, `"}`...), nil
}

// deflateRecord is plain in the zlib format with recordDict, by
// compress/flate at recordLevel.
func deflateRecord(plain []byte) ([]byte, error) {
	var z bytes.Buffer
	z.Grow(len(plain) / 2)
	w := getRecordWriter(&z)
	_, err := w.Write(plain)
	if err == nil {
		err = w.Close()
	}
	putRecordWriter(w)
	return z.Bytes(), err
}

// format1Prefix starts every format-1 record.
var format1Prefix = []byte(`{"tenant":`)

// errRecordEncoding: the value is JSON but neither format.
var errRecordEncoding = errors.New("not a record in a known encoding")

// DecodeRecord decodes a record's stored form, in either format. A
// record of a result format newer than this build's (ResultFormat) is
// ErrSchemaVersion; bytes that are not a record are another error.
func DecodeRecord(v []byte) (*Record, error) {
	var r Record
	if bytes.HasPrefix(v, format1Prefix) {
		if err := json.Unmarshal(v, &r); err != nil {
			return nil, err
		}
	} else {
		s, ok := parseStoredRecord(v)
		if !ok {
			if err := json.Unmarshal(v, &s); err != nil {
				return nil, err
			}
		}
		if s.Format > ResultFormat {
			return nil, formatError(s.Format)
		}
		if s.Format < recordFormatCompressed || s.Z == nil {
			return nil, errRecordEncoding
		}
		plain, err := inflateRecord(s.Z, maxRecordSize)
		if err != nil {
			return nil, fmt.Errorf("compressed record: %w", err)
		}
		if err := json.Unmarshal(plain, &r); err != nil {
			return nil, err
		}
		r.AuditSeqs = s.AuditSeqs
	}
	if r.ResultFormat > ResultFormat {
		// Written by a newer idemgate: replaying a result this build does
		// not understand could hand back something it never returned.
		return nil, formatError(r.ResultFormat)
	}
	return &r, nil
}

func formatError(f int) error {
	return fmt.Errorf("%w: the record has result format %d, this build reads up to %d", ErrSchemaVersion, f, ResultFormat)
}

// maxRecordSize bounds a decompressed record, so that damaged or hostile
// bytes cannot make a read allocate without limit. No record the ledger
// writes comes near it (arguments and results are bounded far below).
const maxRecordSize = 64 << 20

// inflateRecord decompresses a format-2 record's z, refusing more than
// limit bytes.
func inflateRecord(z []byte, limit int64) ([]byte, error) {
	src := bytes.NewReader(z)
	var fr io.ReadCloser
	var err error
	select {
	case fr = <-recordReaders:
		err = fr.(zlib.Resetter).Reset(src, []byte(recordDict))
	default:
		fr, err = zlib.NewReaderDict(src, []byte(recordDict))
	}
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.Grow(5*len(z) + bytes.MinRead) // ReadFrom wants MinRead spare bytes
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

// parseStoredRecord reads the outer JSON of a format-2 record laid out as
// EncodeRecord writes it, without encoding/json's reflection (a replay
// reads one); ok is false for any other text — members in another order,
// spaces, escapes — which json.Unmarshal then decodes, or refuses.
func parseStoredRecord(v []byte) (s storedRecord, ok bool) {
	rest, ok := bytes.CutPrefix(v, []byte(`{"result_format":`))
	if !ok {
		return s, false
	}
	f, rest, ok := cutUint(rest)
	if !ok || f > 1<<20 {
		return s, false
	}
	s.Format = int(f)
	if r, found := bytes.CutPrefix(rest, []byte(`,"audit_seqs":[`)); found {
		rest = r
		for {
			var seq uint64
			if seq, rest, ok = cutUint(rest); !ok || len(rest) == 0 {
				return s, false
			}
			s.AuditSeqs = append(s.AuditSeqs, seq)
			c := rest[0]
			rest = rest[1:]
			if c == ']' {
				break
			}
			if c != ',' {
				return s, false
			}
		}
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`,"z":"`)); !ok {
		return s, false
	}
	b64, ok := bytes.CutSuffix(rest, []byte(`"}`))
	if !ok || bytes.ContainsAny(b64, "\r\n\"\\") { // base64 skips newlines; JSON does not
		return s, false
	}
	z := make([]byte, base64.StdEncoding.DecodedLen(len(b64)))
	n, err := base64.StdEncoding.Decode(z, b64)
	if err != nil {
		return s, false
	}
	s.Z = z[:n]
	return s, true
}

// cutUint reads the JSON number at the start of b, a non-negative integer
// that fits in a uint64, and returns it and what follows.
func cutUint(b []byte) (uint64, []byte, bool) {
	i := 0
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	if i == 0 || i > 20 || (i > 1 && b[0] == '0') {
		return 0, b, false
	}
	n, err := strconv.ParseUint(string(b[:i]), 10, 64)
	if err != nil {
		return 0, b, false
	}
	return n, b[i:], true
}
