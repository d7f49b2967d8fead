package ledgertest_test

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"
	"testing"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
)

// TestMemoryBackendContract builds a toy backend from the ledger.Backend
// interface alone — sorted maps under one lock, an undo log for rollback —
// and runs the whole contract against it: proof that the interface is
// complete and says nothing of bbolt.
func TestMemoryBackendContract(t *testing.T) {
	ledgertest.Run(t, func(t *testing.T, o ledger.Options) ledger.Store {
		s := ledger.New(newMemBackend(), o)
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		return s
	})
}

// journalingMem is the toy backend declared Concurrent, so the whole
// contract also runs on the ledger's journal and sealer (what a
// PostgreSQL ledger uses) without a database.
type journalingMem struct{ *memBackend }

func (journalingMem) Concurrent() bool { return true }

// TestJournalingBackendContract runs the contract on a Concurrent backend:
// transitions journal their audit entries and the sealer chains them.
func TestJournalingBackendContract(t *testing.T) {
	ledgertest.Run(t, func(t *testing.T, o ledger.Options) ledger.Store {
		s := ledger.New(journalingMem{newMemBackend()}, o)
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		return s
	})
}

// memBackend keeps every collection in memory. Update holds the write
// lock (so Update transactions are serial, hence serializable), View the
// read lock; a failed Update is undone from its log.
type memBackend struct {
	mu      sync.RWMutex
	buckets map[string]*memBucket // ledger collections by name; data collections as "data\x00" + name
	closed  bool
}

func newMemBackend() *memBackend {
	b := &memBackend{buckets: map[string]*memBucket{}}
	for _, c := range ledger.Collections() {
		b.buckets[c] = &memBucket{vals: map[string][]byte{}}
	}
	return b
}

var errViewWrite = errors.New("memory backend: write in a read-only transaction")

func (b *memBackend) Update(ctx context.Context, fn func(ledger.BTx) error) (err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ledger.ErrClosed
	}
	tx := &memTx{b: b, writable: true}
	done := false
	defer func() {
		if !done || err != nil {
			tx.rollback()
		}
	}()
	err = fn(tx)
	done = true
	return err
}

func (b *memBackend) View(ctx context.Context, fn func(ledger.BTx) error) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ledger.ErrClosed
	}
	return fn(&memTx{b: b})
}

func (b *memBackend) ReadOnly() bool { return false }

func (b *memBackend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return nil
}

// memBucket is one sorted collection.
type memBucket struct {
	keys []string // sorted
	vals map[string][]byte
}

// undo restores one key of a bucket, or removes a bucket created by the
// transaction.
type undo struct {
	bk      *memBucket
	key     string
	old     []byte
	existed bool
	created string // a data collection created by the transaction
}

type memTx struct {
	b        *memBackend
	writable bool
	log      []undo
}

func (t *memTx) rollback() {
	for i := len(t.log) - 1; i >= 0; i-- {
		u := t.log[i]
		if u.created != "" {
			delete(t.b.buckets, u.created)
			continue
		}
		if u.existed {
			u.bk.set(u.key, u.old)
		} else {
			u.bk.del(u.key)
		}
	}
	t.log = nil
}

func (t *memTx) Bucket(name []byte) ledger.Bucket {
	bk := t.b.buckets[string(name)]
	if bk == nil {
		return nil
	}
	return &memView{tx: t, bk: bk}
}

func (t *memTx) Data(name string, create bool) (ledger.Bucket, error) {
	full := "data\x00" + name
	bk := t.b.buckets[full]
	if bk == nil {
		if !create {
			return nil, nil
		}
		if !t.writable {
			return nil, errViewWrite
		}
		bk = &memBucket{vals: map[string][]byte{}}
		t.b.buckets[full] = bk
		t.log = append(t.log, undo{created: full})
	}
	return &memView{tx: t, bk: bk}, nil
}

func (bk *memBucket) set(k string, v []byte) {
	if _, ok := bk.vals[k]; !ok {
		i := sort.SearchStrings(bk.keys, k)
		bk.keys = slices.Insert(bk.keys, i, k)
	}
	bk.vals[k] = v
}

func (bk *memBucket) del(k string) {
	if _, ok := bk.vals[k]; !ok {
		return
	}
	i := sort.SearchStrings(bk.keys, k)
	bk.keys = slices.Delete(bk.keys, i, i+1)
	delete(bk.vals, k)
}

// memView is a bucket seen from one transaction.
type memView struct {
	tx *memTx
	bk *memBucket
}

func (v *memView) Get(key []byte) []byte { return v.bk.vals[string(key)] }

func (v *memView) Put(key, value []byte) error {
	if !v.tx.writable {
		return errViewWrite
	}
	if len(key) == 0 {
		return errors.New("memory backend: empty key")
	}
	k := string(key)
	old, existed := v.bk.vals[k]
	v.tx.log = append(v.tx.log, undo{bk: v.bk, key: k, old: old, existed: existed})
	v.bk.set(k, append([]byte{}, value...)) // a copy, never nil
	return nil
}

func (v *memView) Delete(key []byte) error {
	if !v.tx.writable {
		return errViewWrite
	}
	k := string(key)
	old, existed := v.bk.vals[k]
	if !existed {
		return nil
	}
	v.tx.log = append(v.tx.log, undo{bk: v.bk, key: k, old: old, existed: true})
	v.bk.del(k)
	return nil
}

func (v *memView) Cursor() ledger.Cursor { return &memCursor{bk: v.bk} }

// memCursor remembers the key it is at, not an index, so writes during a
// walk never make it skip or repeat a key.
type memCursor struct {
	bk  *memBucket
	cur string
	at  bool
}

func (c *memCursor) move(i int) ([]byte, []byte) {
	if i < 0 || i >= len(c.bk.keys) {
		c.at = false
		return nil, nil
	}
	c.cur, c.at = c.bk.keys[i], true
	return []byte(c.cur), c.bk.vals[c.cur]
}

func (c *memCursor) First() ([]byte, []byte) { return c.move(0) }
func (c *memCursor) Last() ([]byte, []byte)  { return c.move(len(c.bk.keys) - 1) }

func (c *memCursor) Seek(seek []byte) ([]byte, []byte) {
	return c.move(sort.SearchStrings(c.bk.keys, string(seek)))
}

func (c *memCursor) Next() ([]byte, []byte) {
	if !c.at {
		return nil, nil
	}
	i := sort.Search(len(c.bk.keys), func(i int) bool { return c.bk.keys[i] > c.cur })
	return c.move(i)
}

func (c *memCursor) Prev() ([]byte, []byte) {
	if !c.at {
		return nil, nil
	}
	i := sort.SearchStrings(c.bk.keys, c.cur) // the first key >= cur
	return c.move(i - 1)
}

// TestMemoryCursorWalk checks the toy backend's cursor against the
// ordering the Backend interface promises (bytewise, 0xff after the rest).
func TestMemoryCursorWalk(t *testing.T) {
	b := newMemBackend()
	err := b.Update(context.Background(), func(tx ledger.BTx) error {
		d, err := tx.Data("c", true)
		if err != nil {
			return err
		}
		for _, k := range []string{"b", "a\xff", "a", "c"} {
			if err := d.Put([]byte(k), []byte(k)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	b.View(context.Background(), func(tx ledger.BTx) error {
		d, _ := tx.Data("c", false)
		c := d.Cursor()
		for k, _ := c.Last(); k != nil; k, _ = c.Prev() {
			got = append(got, string(k))
		}
		return nil
	})
	if want := []string{"c", "b", "a\xff", "a"}; !slices.Equal(got, want) {
		t.Errorf("reverse walk = %q, want %q", got, want)
	}
}

// TestMemoryBackend runs the backend-level checks on the toy backend.
func TestMemoryBackend(t *testing.T) {
	ledgertest.RunBackend(t, func(t *testing.T) ledger.Backend { return newMemBackend() })
}
