package bolt

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	bbolt "go.etcd.io/bbolt"
)

// Backup writes a consistent copy of the ledger to dst: the state of one
// read transaction (bbolt Tx.WriteTo), taken while f keeps serving. The
// copy is written to a temporary file beside dst, synced, and renamed into
// place, so dst is either absent or complete; an existing dst is never
// overwritten. It returns the number of bytes written.
func (f *File) Backup(dst string) (int64, error) {
	s := f.be
	if _, err := os.Lstat(dst); err == nil {
		return 0, fmt.Errorf("backup %s: %w; choose a new name", dst, ErrExists)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("backup %s: %w", dst, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-*")
	if err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	defer os.Remove(tmp.Name())
	var n int64
	err = s.view(func(tx *bbolt.Tx) error {
		var err error
		n, err = tx.WriteTo(tmp)
		return err
	})
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o600)
	}
	if err == nil {
		// Link, not rename: it fails if dst appeared meanwhile.
		err = os.Link(tmp.Name(), dst)
	}
	if err != nil {
		return 0, fmt.Errorf("backup %s: %w", dst, err)
	}
	if d, err := os.Open(filepath.Dir(dst)); err == nil {
		d.Sync()
		d.Close()
	}
	return n, nil
}
