package bolt

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	bbolt "go.etcd.io/bbolt"

	"idemgate/ledger"
)

// Compaction: bbolt never shrinks a file (freed pages are reused, not
// returned), so a ledger that once held more — records past retention,
// pruned audit entries — keeps its size. Compact copies the live data into
// a new file (bbolt.Compact) and swaps it in, holding the ledger's lock
// (exclusive) until the swap is done: no other process has the ledger
// open meanwhile, and one that waited for it opens the new file.

// compactTodo is what to do about a ledger another process has open when
// compact wants it to itself.
const compactTodo = "compact in place needs the file to itself: stop the servers, consoles and commands using it (or run idemgate compact --out FILE for a compacted copy), then compact again"

// CompactOptions say where the compacted copy goes.
type CompactOptions struct {
	// Out, when set, is a new file the compacted copy is written to; the
	// ledger itself is left as it is (it is read as a read-only open
	// reads it: beside other readers, not while a process writes it).
	// When empty, the ledger is compacted in place.
	Out string
	// NoBackup drops the old file after an in-place compaction. By
	// default it is kept beside the ledger as <file>.pre-compact-<UTC
	// time>, hard-linked before the swap: nothing is ever lost to a
	// compaction that went wrong.
	NoBackup bool
	// Wait bounds how long Compact waits while another process has the
	// ledger open (then ErrLocked); 0 is DefaultWait.
	Wait time.Duration
}

// CompactResult is what Compact did.
type CompactResult struct {
	// Before and After are the file sizes in bytes.
	Before, After int64
	// Path is the compacted file: the ledger, or Out.
	Path string
	// Backup is the old file kept beside the ledger ("" when none).
	Backup string
	// Keys is the number of keys copied, each checked in the copy.
	Keys int
}

// compactTxSize bounds one transaction of the copy, so memory stays small
// however big the ledger is.
const compactTxSize = 64 << 20

// Compact writes a compacted copy of the ledger at path: the same buckets,
// keys and values in a file without free pages. The copy is written to a
// temporary file beside its destination, checked (every key of the ledger
// is in it with the same value), synced, and then linked or renamed into
// place, and the directory is synced: at every moment the destination is
// either absent (Out) or a complete ledger, the old one or the new one.
//
// In place (Out empty), it refuses with ErrLocked while any other process
// has the ledger open (a server, the console, a command), and keeps new
// ones waiting until the swap is done. With Out it never changes the
// ledger and refuses an existing Out (ErrExists); it reads the ledger as
// a read-only open does.
func Compact(path string, opts CompactOptions) (CompactResult, error) {
	res := CompactResult{Path: path}
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return res, noLedgerError(path)
	} else if err != nil {
		return res, err
	}
	res.Before = fi.Size()
	if opts.Out != "" {
		return compactTo(path, opts.Out, opts.Wait, res)
	}
	wait := opts.Wait
	if wait == 0 {
		wait = DefaultWait
	}
	src, _, err := openDB(path, false, wait, compactTodo)
	if err != nil {
		return res, err
	}
	defer src.Close()
	if err := openSchema(path, src, true, deepCheckLimit); err != nil {
		return res, err
	}
	tmp, keys, err := compactInto(src, filepath.Dir(path), filepath.Base(path), fi.Mode().Perm())
	if err != nil {
		return res, err
	}
	defer os.Remove(tmp) // after the rename, nothing is there
	res.Keys = keys
	if !opts.NoBackup {
		res.Backup = path + ".pre-compact-" + time.Now().UTC().Format("20060102T150405Z")
		// A link, not a copy: the old file stays whole under a new name,
		// and the rename below replaces only the ledger's name.
		if err := os.Link(path, res.Backup); err != nil {
			return res, fmt.Errorf("compact: keeping the old file as %s: %w", res.Backup, err)
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		if res.Backup != "" {
			os.Remove(res.Backup)
		}
		return res, fmt.Errorf("compact: swap: %w", err)
	}
	syncDir(filepath.Dir(path))
	if fi, err := os.Stat(path); err == nil {
		res.After = fi.Size()
	}
	return res, nil
}

// compactTo writes the compacted copy of the ledger at path to out,
// reading it as a read-only open does.
func compactTo(path, out string, wait time.Duration, res CompactResult) (CompactResult, error) {
	res.Path = out
	if _, err := os.Lstat(out); err == nil {
		return res, fmt.Errorf("compact --out %s: %w; choose a new name", out, ErrExists)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return res, fmt.Errorf("compact --out %s: %w", out, err)
	}
	var o []OpenOption
	if wait > 0 {
		o = append(o, Wait(wait))
	}
	f, err := OpenReadOnly(path, ledger.Options{}, o...)
	if err != nil {
		return res, err
	}
	defer f.Close()
	tmp, keys, err := compactInto(f.be.db, filepath.Dir(out), filepath.Base(out), 0o600)
	if err != nil {
		return res, err
	}
	defer os.Remove(tmp)
	res.Keys = keys
	// Link, not rename: it fails if out appeared meanwhile.
	if err := os.Link(tmp, out); err != nil {
		return res, fmt.Errorf("compact --out %s: %w", out, err)
	}
	syncDir(filepath.Dir(out))
	if fi, err := os.Stat(out); err == nil {
		res.After = fi.Size()
	}
	return res, nil
}

// compactInto copies src into a new temporary file in dir, checks the
// copy, syncs it, and returns its name and the number of keys checked.
func compactInto(src *bbolt.DB, dir, base string, perm fs.FileMode) (string, int, error) {
	t, err := os.CreateTemp(dir, "."+base+".compact-*")
	if err != nil {
		return "", 0, fmt.Errorf("compact: %w", err)
	}
	name := t.Name()
	t.Close()
	os.Remove(name) // bbolt initialises a file it creates itself
	fail := func(err error) (string, int, error) {
		os.Remove(name)
		return "", 0, fmt.Errorf("compact: %w", err)
	}
	dst, err := bbolt.Open(name, perm, &bbolt.Options{NoSync: true, Timeout: time.Second})
	if err != nil {
		return fail(err)
	}
	if err := bbolt.Compact(dst, src, compactTxSize); err != nil {
		dst.Close()
		return fail(err)
	}
	var used int64
	if err := dst.View(func(tx *bbolt.Tx) error { used = tx.Size(); return nil }); err != nil {
		dst.Close()
		return fail(err)
	}
	if err := dst.Close(); err != nil {
		return fail(err)
	}
	// bbolt grows a file in steps (doubling up to 1 GiB, then 16 MiB), so
	// the copy ends with unused space past its last page: cut it off.
	// The pages bbolt uses all lie below tx.Size(); it grows the file
	// again when it needs to.
	if err := os.Truncate(name, used); err != nil {
		return fail(err)
	}
	// The copy as it will be opened: every key there, nothing more.
	check, err := bbolt.Open(name, perm, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return fail(err)
	}
	keys, err := sameContent(src, check)
	if cerr := check.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return fail(err)
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	if err := os.Chmod(name, perm); err != nil {
		return fail(err)
	}
	return name, keys, nil
}

// sameContent checks that every bucket and key of a is in b with the same
// value and that b has nothing more, and returns the number of keys.
func sameContent(a, b *bbolt.DB) (int, error) {
	count := func(db *bbolt.DB) (int, error) {
		n := 0
		err := db.View(func(tx *bbolt.Tx) error {
			return tx.ForEach(func(name []byte, bk *bbolt.Bucket) error {
				n++
				return walkBucket(bk, func(k, v []byte) error { n++; return nil })
			})
		})
		return n, err
	}
	na, err := count(a)
	if err != nil {
		return 0, err
	}
	nb, err := count(b)
	if err != nil {
		return 0, err
	}
	if na != nb {
		return 0, fmt.Errorf("the copy holds %d keys, the ledger %d", nb, na)
	}
	err = a.View(func(ta *bbolt.Tx) error {
		return b.View(func(tb *bbolt.Tx) error {
			return ta.ForEach(func(name []byte, ba *bbolt.Bucket) error {
				bb := tb.Bucket(name)
				if bb == nil {
					return fmt.Errorf("the copy lacks bucket %q", name)
				}
				return sameBucket(ba, bb, string(name))
			})
		})
	})
	return na, err
}

// sameBucket checks that b holds every key of a with the same value,
// nested buckets included.
func sameBucket(a, b *bbolt.Bucket, where string) error {
	return a.ForEach(func(k, v []byte) error {
		if v == nil {
			nb := b.Bucket(k)
			if nb == nil {
				return fmt.Errorf("the copy lacks bucket %s/%q", where, k)
			}
			return sameBucket(a.Bucket(k), nb, where+"/"+string(k))
		}
		if got := b.Get(k); got == nil || string(got) != string(v) {
			return fmt.Errorf("the copy's value of %s/%q differs", where, k)
		}
		return nil
	})
}

// walkBucket calls fn for every key of bk and its nested buckets.
func walkBucket(bk *bbolt.Bucket, fn func(k, v []byte) error) error {
	return bk.ForEach(func(k, v []byte) error {
		if err := fn(k, v); err != nil {
			return err
		}
		if v == nil {
			return walkBucket(bk.Bucket(k), fn)
		}
		return nil
	})
}

// syncDir makes the names in dir durable (best effort: some systems
// cannot sync a directory).
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
