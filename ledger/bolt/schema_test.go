package bolt

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
)

// rawContent is every key and value of the file at path, by the path of
// its bucket ("records", "data/orders"), read with bbolt directly.
func rawContent(t *testing.T, path string) map[string]map[string]string {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string]map[string]string{}
	var walk func(name string, b *bbolt.Bucket) error
	walk = func(name string, b *bbolt.Bucket) error {
		out[name] = map[string]string{}
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				if c := b.Bucket(k); c != nil {
					return walk(name+"/"+string(k), c)
				}
			}
			out[name][string(k)] = string(v)
			return nil
		})
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error { return walk(string(name), b) })
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// schema1File writes a ledger as a build of schema version 1 left it:
// operations executed (their effects in a downstream collection), then
// the downstream collections moved into "data" and the version set to 1.
// It returns the file's path, the records and effects a store serves from
// it, and its content as this build wrote it (downstream collections at
// the top level).
func schema1File(t *testing.T) (path string, records map[string]string, eff map[string]string, content map[string]map[string]string) {
	t.Helper()
	ctx := context.Background()
	path = filepath.Join(t.TempDir(), "ledger.db")
	s := mustOpenPath(t, path, ledger.Options{})
	ap := &applier{}
	records = map[string]string{}
	for i := range 50 {
		c := newClaim("t1", "create_order", "fp"+strconv.Itoa(i))
		d, err := s.Execute(ctx, c, ap.succeed(ledgertest.ResultOrder))
		if err != nil {
			t.Fatal(err)
		}
		records[d.Record.Key] = recordJSON(t, mustGet(t, s, "t1", d.Record.Key))
	}
	eff = effects(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	content = rawContent(t, path)
	rawUpdate(t, path, func(tx *bbolt.Tx) error {
		data, err := tx.CreateBucket(bucketData)
		if err != nil {
			return err
		}
		var names [][]byte
		tx.ForEach(func(name []byte, _ *bbolt.Bucket) error {
			if !isLedgerBucket(name) {
				names = append(names, bytes.Clone(name))
			}
			return nil
		})
		if len(names) == 0 {
			return errors.New("no downstream collection to nest")
		}
		for _, name := range names {
			if err := tx.MoveBucket(name, nil, data); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, []byte("1"))
	})
	return path, records, eff, content
}

// serves checks that s serves exactly records and eff.
func serves(t *testing.T, s *File, records, eff map[string]string) {
	t.Helper()
	for key, want := range records {
		if got := recordJSON(t, mustGet(t, s, "t1", key)); got != want {
			t.Errorf("record %s = %s, want %s", key, got, want)
		}
	}
	if got := effects(t, s); !maps.Equal(got, eff) {
		t.Errorf("effects = %v, want %v", got, eff)
	}
}

// TestSchema1FileMigrates: a file of schema version 1 (downstream
// collections nested in "data") is served as it is by a read-only open,
// which leaves every byte of it alone; a writable open moves the
// collections to the top level and marks it version 2, and then the file
// holds byte for byte the keys and values it held, where this build puts
// them, and serves the same records and downstream data, and takes new
// writes.
func TestSchema1FileMigrates(t *testing.T) {
	ctx := context.Background()
	path, records, eff, content := schema1File(t)
	v1 := readFile(t, path)
	if c := rawContent(t, path); c["data/"+effectsCollection] == nil || c[effectsCollection] != nil {
		t.Fatalf("the schema-1 file does not nest the effects in data: %v", slices.Sorted(maps.Keys(c)))
	}

	ro, err := OpenReadOnly(path, ledger.Options{})
	if err != nil {
		t.Fatalf("read-only open of a schema-1 file: %v", err)
	}
	serves(t, ro, records, eff)
	ro.Close()
	if !bytes.Equal(v1, readFile(t, path)) {
		t.Fatal("a read-only open changed the schema-1 file")
	}

	s := mustOpenPath(t, path, ledger.Options{})
	serves(t, s, records, eff)
	s.Close()
	got := rawContent(t, path)
	if v := got[string(bucketMeta)][string(keySchemaVersion)]; v != "2" {
		t.Errorf("schema version after a writable open = %q, want 2", v)
	}
	// Everything the file held before it was nested, and nothing else.
	if !maps.EqualFunc(got, content, maps.Equal) {
		for name := range maps.Keys(content) {
			if !maps.Equal(got[name], content[name]) {
				t.Errorf("bucket %s: %d keys after the migration, %d before it was nested", name, len(got[name]), len(content[name]))
			}
		}
		t.Fatalf("the migrated file's buckets %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(content)))
	}

	s = mustOpenPath(t, path, ledger.Options{})
	serves(t, s, records, eff)
	ap := &applier{}
	d, err := s.Execute(ctx, newClaim("t1", "create_order", "fp-new"), ap.succeed(ledgertest.ResultOrder))
	if err != nil {
		t.Fatal(err)
	}
	if got := effects(t, s); len(got) != len(eff)+1 || got[effectKey(d.Record)] == "" {
		t.Errorf("effects after a new operation: %d, want %d with %s", len(got), len(eff)+1, effectKey(d.Record))
	}
}

// TestSchema1FileNotMigratedWhenDataIsOdd: a "data" bucket holding a
// plain key (no build wrote one) is refused at a writable open, and the
// file is left as it was.
func TestSchema1FileNotMigratedWhenDataIsOdd(t *testing.T) {
	path, _, _, _ := schema1File(t)
	rawUpdate(t, path, func(tx *bbolt.Tx) error { return tx.Bucket(bucketData).Put([]byte("stray"), []byte("v")) })
	before := rawContent(t, path)
	if s, err := Open(path, ledger.Options{}); err == nil {
		s.Close()
		t.Fatal("a writable open migrated a data bucket holding a plain key")
	}
	if after := rawContent(t, path); !maps.EqualFunc(after, before, maps.Equal) {
		t.Error("a refused migration changed the file")
	}
}

// TestDataRefusesLedgerNames: a downstream collection cannot take the name
// of a ledger collection (they share the top level of the file).
func TestDataRefusesLedgerNames(t *testing.T) {
	s := mustOpen(t, ledger.Options{})
	for _, name := range []string{"records", "meta", "audit", "data"} {
		err := s.Update(context.Background(), func(tx ledger.Tx) error { return tx.Put(name, "k", []byte("v")) })
		if err == nil {
			t.Errorf("a downstream write to %q succeeded", name)
		}
	}
}
