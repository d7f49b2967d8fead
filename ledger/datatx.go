package ledger

import (
	"bytes"
	"time"
)

// dataTx is the Tx given to downstreams: the backend's data collections.
type dataTx struct {
	tx  *ltx
	now time.Time
}

func (t *dataTx) Now() time.Time { return t.now }

func (t *dataTx) Get(collection, key string) ([]byte, error) {
	b, err := t.tx.Data(collection, false)
	if b == nil || err != nil {
		return nil, err
	}
	return b.Get([]byte(key)), nil
}

// Prefetch implements the optional method Prefetch of Tx (see Prefetch).
func (t *dataTx) Prefetch(collection string, keys ...string) {
	b, err := t.tx.Data(collection, false)
	p, ok := b.(Prefetcher)
	if err != nil || !ok {
		return
	}
	bs := make([][]byte, len(keys))
	for i, k := range keys {
		bs[i] = []byte(k)
	}
	p.Prefetch(bs...)
}

// Prefetch says tx will soon read keys of collection: on a backend that
// reads several keys in one exchange (PostgreSQL: one round trip; see
// Prefetcher) their reads go together with the next one. It is a hint
// and changes nothing else; on other backends it does nothing.
func Prefetch(tx Tx, collection string, keys ...string) {
	if p, ok := tx.(interface{ Prefetch(string, ...string) }); ok && len(keys) > 0 {
		p.Prefetch(collection, keys...)
	}
}

func (t *dataTx) Put(collection, key string, value []byte) error {
	b, err := t.tx.Data(collection, true)
	if err != nil {
		return err
	}
	return b.Put([]byte(key), value)
}

func (t *dataTx) Delete(collection, key string) error {
	b, err := t.tx.Data(collection, false)
	if b == nil || err != nil {
		return err
	}
	return b.Delete([]byte(key))
}

func (t *dataTx) Scan(collection, prefix string, reverse bool, fn func(key string, value []byte) (bool, error)) error {
	b, err := t.tx.Data(collection, false)
	if b == nil || err != nil {
		return err
	}
	c := b.Cursor()
	p := []byte(prefix)
	var k, v []byte
	if !reverse {
		k, v = c.Seek(p)
	} else {
		k, v = seekLast(c, p)
	}
	for k != nil && bytes.HasPrefix(k, p) {
		more, err := fn(string(k), v)
		if err != nil || !more {
			return err
		}
		if reverse {
			k, v = c.Prev()
		} else {
			k, v = c.Next()
		}
	}
	return nil
}

// seekLast positions c at the last key with prefix p.
func seekLast(c Cursor, p []byte) ([]byte, []byte) {
	end := bytes.Clone(p)
	for len(end) > 0 && end[len(end)-1] == 0xff {
		end = end[:len(end)-1]
	}
	if len(end) == 0 {
		return c.Last()
	}
	end[len(end)-1]++ // the first key after every key with prefix p
	if k, _ := c.Seek(end); k == nil {
		return c.Last()
	}
	return c.Prev()
}
