package bolt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
)

// PageMap is a diagnostic: the pages of a ledger file's newest committed
// state, each with the tree it belongs to, read from the file itself
// (bbolt's page layout: a 16-byte header id/flags/count/overflow; branch
// elements pos/ksize/pgid; leaf elements flags/pos/ksize/vsize, a bucket's
// value its root pgid and sequence, an inline bucket's page after them).
// Written compares two maps: bbolt writes a changed page to a new place
// and frees the old one only for later transactions, so the pages one
// commit wrote are exactly those its state reaches and the state before
// it did not. It is how the pages a create's commit writes are broken
// down by bucket (idemgate bench __in-process --pages, TestCreatePages).
//
// A PageMap is read without bbolt and without a lock: it is consistent
// when no commit runs while it is read (ReadPageMap retries when the
// newest meta page changed under it).
type PageMap struct {
	pageSize int
	txid     uint64
	pages    map[uint64]pageInfo
}

// pageInfo is one page (with its overflow pages) of a PageMap.
type pageInfo struct {
	owner    string   // the tree: a bucket's path ("records", "data/orders"), (root), (freelist)
	span     uint32   // 1 + overflow
	children []uint64 // the pages it refers to (branch children, nested buckets' roots)
}

// The owners of the pages that are no bucket's.
const (
	OwnerRoot     = "(root)"     // the root bucket: the top-level buckets' headers, inline buckets
	OwnerFreelist = "(freelist)" // the freelist page(s)
	OwnerMeta     = "(meta)"     // the meta page, written once per commit and reached by no tree
)

// ReadPageMap reads the pages of the ledger file at path. With prev (a map
// of the same file read earlier), the pages both reach are not read again.
func ReadPageMap(path string, prev *PageMap) (*PageMap, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	for range 10 {
		m, err := readPageMap(f, prev)
		if err != nil {
			return nil, err
		}
		if again, err := newestMeta(f); err != nil {
			return nil, err
		} else if again.txid == m.txid {
			return m, nil
		}
	}
	return nil, errors.New("ledger: the file was committed to throughout ten reads of its pages")
}

// newestMeta is the valid meta page with the highest txid.
func newestMeta(f *os.File) (diskMeta, error) {
	var best diskMeta
	found := false
	ps := int64(4096)
	for i := range int64(2) {
		buf := make([]byte, pageHeaderSize+metaSize)
		if _, err := f.ReadAt(buf, i*ps); err != nil {
			return diskMeta{}, err
		}
		m, err := parseMeta(buf)
		if err != nil {
			continue
		}
		if i == 0 {
			ps = int64(m.pageSize)
		}
		if !found || m.txid > best.txid {
			best, found = m, true
		}
	}
	if !found {
		return diskMeta{}, errors.New("ledger: no valid meta page")
	}
	return best, nil
}

func readPageMap(f *os.File, prev *PageMap) (*PageMap, error) {
	meta, err := newestMeta(f)
	if err != nil {
		return nil, err
	}
	m := &PageMap{pageSize: int(meta.pageSize), txid: meta.txid, pages: map[uint64]pageInfo{}}
	if prev != nil && prev.pageSize != m.pageSize {
		prev = nil
	}
	ps := int64(meta.pageSize)
	readPage := func(id uint64) ([]byte, error) {
		if id < 2 || id >= meta.pgid {
			return nil, fmt.Errorf("page %d outside the file's %d pages", id, meta.pgid)
		}
		hdr := make([]byte, ps)
		if _, err := f.ReadAt(hdr, int64(id)*ps); err != nil {
			return nil, err
		}
		if ov := binary.NativeEndian.Uint32(hdr[12:]); ov > 0 {
			full := make([]byte, int64(ov+1)*ps)
			if _, err := f.ReadAt(full, int64(id)*ps); err != nil {
				return nil, err
			}
			return full, nil
		}
		return hdr, nil
	}
	// keep copies a page prev reaches, and everything under it, from prev.
	var keep func(id uint64)
	keep = func(id uint64) {
		p := prev.pages[id]
		m.pages[id] = p
		for _, c := range p.children {
			keep(c)
		}
	}
	var visit func(id uint64, owner string) error
	// leaf reads a leaf page's elements (b is the page, at a page's start
	// or an inline bucket's), visiting the buckets it holds; it returns
	// the pages it refers to.
	leaf := func(b []byte, owner string) ([]uint64, error) {
		var children []uint64
		n := int(binary.NativeEndian.Uint16(b[10:]))
		for i := range n {
			at := pageHeaderSize + 16*i
			if at+16 > len(b) {
				return nil, fmt.Errorf("leaf of %s: element %d past the page", owner, i)
			}
			e := b[at:]
			flags, pos, ksize, vsize := binary.NativeEndian.Uint32(e), int(binary.NativeEndian.Uint32(e[4:])), int(binary.NativeEndian.Uint32(e[8:])), int(binary.NativeEndian.Uint32(e[12:]))
			if flags&0x01 == 0 {
				continue
			}
			if at+pos+ksize+vsize > len(b) || vsize < 16 {
				return nil, fmt.Errorf("leaf of %s: bucket element %d past the page", owner, i)
			}
			name := string(b[at+pos : at+pos+ksize])
			val := b[at+pos+ksize : at+pos+ksize+vsize]
			child := name
			if owner != OwnerRoot {
				child = owner + "/" + name
			}
			root := binary.NativeEndian.Uint64(val)
			if root == 0 {
				continue // inline: its keys are in this page
			}
			children = append(children, root)
			if err := visit(root, child); err != nil {
				return nil, err
			}
		}
		return children, nil
	}
	visit = func(id uint64, owner string) error {
		if prev != nil {
			if p, ok := prev.pages[id]; ok && p.owner == owner {
				keep(id)
				return nil
			}
		}
		if _, ok := m.pages[id]; ok {
			return fmt.Errorf("page %d reached twice", id)
		}
		b, err := readPage(id)
		if err != nil {
			return err
		}
		info := pageInfo{owner: owner, span: binary.NativeEndian.Uint32(b[12:]) + 1}
		m.pages[id] = info // before the children: a loop is an error, not a hang
		switch flags := binary.NativeEndian.Uint16(b[8:]); flags {
		case 0x01: // branch
			n := int(binary.NativeEndian.Uint16(b[10:]))
			for i := range n {
				at := pageHeaderSize + 16*i
				if at+16 > len(b) {
					return fmt.Errorf("branch of %s: element %d past the page", owner, i)
				}
				c := binary.NativeEndian.Uint64(b[at+8:])
				info.children = append(info.children, c)
				if err := visit(c, owner); err != nil {
					return err
				}
			}
		case 0x02: // leaf
			if info.children, err = leaf(b, owner); err != nil {
				return err
			}
		default:
			return fmt.Errorf("page %d of %s has flags %#x", id, owner, flags)
		}
		m.pages[id] = info
		return nil
	}
	if err := visit(meta.root, OwnerRoot); err != nil {
		return nil, err
	}
	if meta.freelist != noFreelist {
		b, err := readPage(meta.freelist)
		if err != nil {
			return nil, err
		}
		m.pages[meta.freelist] = pageInfo{owner: OwnerFreelist, span: binary.NativeEndian.Uint32(b[12:]) + 1}
	}
	return m, nil
}

// TreeWrites is what a span of commits wrote to one tree.
type TreeWrites struct {
	Owner string
	Pages int64 // page writes, as bbolt counts them: a page with its overflow pages is one
	Bytes int64
}

// Written returns the commits between prev and m (by their transaction
// ids) and what they wrote, by tree, most pages first. Across one commit
// the pages add up to bbolt's write count (TxStats.Write), the meta page
// included; across several, a page written by one and replaced by a
// later one is not seen.
func (m *PageMap) Written(prev *PageMap) (commits int64, trees []TreeWrites) {
	by := map[string]*TreeWrites{}
	add := func(owner string, span uint32) {
		t := by[owner]
		if t == nil {
			t = &TreeWrites{Owner: owner}
			by[owner] = t
		}
		t.Pages++
		t.Bytes += int64(span) * int64(m.pageSize)
	}
	for id, p := range m.pages {
		if q, ok := prev.pages[id]; ok && q.owner == p.owner && q.span == p.span {
			continue
		}
		add(p.owner, p.span)
	}
	commits = int64(m.txid - prev.txid)
	for range commits {
		add(OwnerMeta, 1)
	}
	for _, t := range by {
		trees = append(trees, *t)
	}
	slices.SortFunc(trees, func(a, b TreeWrites) int {
		if a.Pages != b.Pages {
			return int(b.Pages - a.Pages)
		}
		if a.Owner < b.Owner {
			return -1
		}
		return 1
	})
	return commits, trees
}
