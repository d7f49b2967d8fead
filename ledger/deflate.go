package ledger

import (
	"encoding/binary"
	"hash/adler32"
	"math/bits"
)

// A small zlib compressor for the records the retention sweep writes
// (tombstones), as format 2 stores them: the zlib format (RFC 1950) with
// the preset dictionary recordDict, one DEFLATE block (RFC 1951) of the
// fixed Huffman codes, and greedy LZ77 matches found through a small hash
// table. Any zlib reader given recordDict decodes it, so it is not a new
// format, only another writer of format 2.
//
// compress/flate, which EncodeRecord uses, clears some 640 KB of tables
// and builds Huffman trees for every record; for a tombstone, a few
// hundred bytes, that is nearly all of the sweep's work per record (a
// profile of BenchmarkSweepClaimWait: half of the sweep's CPU). This one
// starts from tables of the dictionary built once and copies 32 KB of
// them; its output is a few percent longer than compress/flate's at
// recordLevel for a tombstone (TestDeflateFixedSize).

const (
	fixedHashBits  = 13
	fixedMinMatch  = 4 // the hash covers 4 bytes
	fixedMaxMatch  = 258
	fixedMaxDist   = 32768
	fixedChainLen  = 16 // candidates tried per position
	fixedNiceMatch = 64 // a match this long is taken without looking further
)

// fixedDict holds the hash chains of recordDict, built once: a record's
// compression starts from a copy.
var fixedDict = func() (d struct {
	head [1 << fixedHashBits]int32 // hash → position+1 of its newest occurrence (0: none)
	prev []int32                   // position → position+1 of the previous one with its hash
}) {
	dict := []byte(recordDict)
	d.prev = make([]int32, len(dict))
	for i := 0; i+fixedMinMatch <= len(dict); i++ {
		h := fixedHash(dict[i:])
		d.prev[i] = d.head[h]
		d.head[h] = int32(i + 1)
	}
	return d
}()

var recordDictAdler = adler32.Checksum([]byte(recordDict))

func fixedHash(b []byte) uint32 {
	return (binary.LittleEndian.Uint32(b) * 0x9E3779B1) >> (32 - fixedHashBits)
}

// deflateFixed appends to dst the zlib stream (with recordDict) of plain.
func deflateFixed(dst, plain []byte) []byte {
	n := len(recordDict)
	win := make([]byte, 0, n+len(plain))
	win = append(append(win, recordDict...), plain...)
	head := fixedDict.head // a copy
	prev := make([]int32, len(win))
	copy(prev, fixedDict.prev)
	// The dictionary's last few positions were not hashed (they need
	// bytes of plain): hash them now.
	for i := max(0, n-fixedMinMatch+1); i < n && i+fixedMinMatch <= len(win); i++ {
		h := fixedHash(win[i:])
		prev[i] = head[h]
		head[h] = int32(i + 1)
	}

	// zlib header: deflate, 32 KB window, a preset dictionary (FDICT),
	// FLEVEL 1 ("fast"); the check bits make it a multiple of 31.
	cmf, flg := uint16(0x78), uint16(1<<6|1<<5)
	flg += 31 - (cmf<<8|flg)%31
	dst = append(dst, byte(cmf), byte(flg))
	dst = binary.BigEndian.AppendUint32(dst, recordDictAdler)

	w := bitWriter{out: dst}
	w.put(1, 1) // BFINAL
	w.put(1, 2) // BTYPE 01: fixed Huffman codes
	for i := n; i < len(win); {
		length, dist := 0, 0
		if i+fixedMinMatch <= len(win) {
			h := fixedHash(win[i:])
			limit := min(len(win)-i, fixedMaxMatch)
			for c, tries := head[h], 0; c > 0 && tries < fixedChainLen; c, tries = prev[c-1], tries+1 {
				j := int(c - 1)
				if i-j > fixedMaxDist {
					break
				}
				l := matchLen(win[j:j+limit], win[i:i+limit])
				if l > length {
					length, dist = l, i-j
					if l >= fixedNiceMatch {
						break
					}
				}
			}
			prev[i] = head[h]
			head[h] = int32(i + 1)
		}
		if length < fixedMinMatch {
			w.literal(win[i])
			i++
			continue
		}
		w.match(length, dist)
		// The positions inside the match are hashed too, for later matches.
		for k := i + 1; k < i+length && k+fixedMinMatch <= len(win); k++ {
			h := fixedHash(win[k:])
			prev[k] = head[h]
			head[h] = int32(k + 1)
		}
		i += length
	}
	w.code(fixedLitCode(256)) // end of block
	w.flush()
	return binary.BigEndian.AppendUint32(w.out, adler32.Checksum(plain))
}

// matchLen is the length of the common prefix of a and b (len(a) == len(b)).
func matchLen(a, b []byte) int {
	i := 0
	for ; i+8 <= len(a); i += 8 {
		if x := binary.LittleEndian.Uint64(a[i:]) ^ binary.LittleEndian.Uint64(b[i:]); x != 0 {
			return i + bits.TrailingZeros64(x)/8
		}
	}
	for ; i < len(a) && a[i] == b[i]; i++ {
	}
	return i
}

// bitWriter writes DEFLATE's bit stream: values least significant bit
// first, Huffman codes most significant bit first.
type bitWriter struct {
	out  []byte
	bits uint64
	n    uint
}

func (w *bitWriter) put(v uint32, n uint) {
	w.bits |= uint64(v) << w.n
	w.n += n
	for w.n >= 8 {
		w.out = append(w.out, byte(w.bits))
		w.bits >>= 8
		w.n -= 8
	}
}

// code writes a Huffman code of n bits given most significant bit first.
func (w *bitWriter) code(c uint32, n uint) {
	w.put(bits.Reverse32(c)>>(32-n), n)
}

func (w *bitWriter) flush() {
	if w.n > 0 {
		w.out = append(w.out, byte(w.bits))
		w.bits, w.n = 0, 0
	}
}

func (w *bitWriter) literal(b byte) { w.code(fixedLitCode(int(b))) }

// match writes a length (3-258) and a distance (1-32768).
func (w *bitWriter) match(length, dist int) {
	li := searchBase(lengthBase[:], length)
	w.code(fixedLitCode(257 + li))
	w.put(uint32(length-lengthBase[li]), lengthExtra[li])
	di := searchBase(distBase[:], dist)
	w.code(uint32(di), 5) // the fixed distance codes are 5 bits each
	w.put(uint32(dist-distBase[di]), distExtra[di])
}

// fixedLitCode is the fixed Huffman code of literal/length symbol s
// (RFC 1951 3.2.6).
func fixedLitCode(s int) (uint32, uint) {
	switch {
	case s < 144:
		return uint32(0x30 + s), 8
	case s < 256:
		return uint32(0x190 + s - 144), 9
	case s < 280:
		return uint32(s - 256), 7
	default:
		return uint32(0xC0 + s - 280), 8
	}
}

// searchBase returns the index of the last base at most v.
func searchBase(base []int, v int) int {
	i := len(base) - 1
	for base[i] > v {
		i--
	}
	return i
}

// The length and distance codes' bases and extra bits (RFC 1951 3.2.5).
var (
	lengthBase  = [29]int{3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258}
	lengthExtra = [29]uint{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0}
	distBase    = [30]int{1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577}
	distExtra   = [30]uint{0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13}
)
