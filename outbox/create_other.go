//go:build !linux

package outbox

import (
	"errors"
	"os"
)

// createUnnamed is not available here: the portable temporary file is used.
func createUnnamed(dir, final string, data []byte) error { return errors.ErrUnsupported }

// syncFileSystem is not available here: Flush fsyncs each file.
func syncFileSystem(dir string) error { return errors.ErrUnsupported }

// startWriteback does nothing here.
func startWriteback(f *os.File) {}

// datasync makes f's data durable (fsync; no fdatasync here).
func datasync(f *os.File) error { return f.Sync() }
