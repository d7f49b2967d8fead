package outbox

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// createUnnamed writes data to a file with no name in dir (O_TMPFILE) and
// links it under final: the name appears with the whole content or not at
// all, and no temporary name is created and removed. It returns an error
// wrapping errors.ErrUnsupported when the file system (or /proc, needed
// for the link) does not allow it, and one wrapping os.ErrExist when
// final exists.
func createUnnamed(dir, final string, data []byte) error {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EINVAL) {
			return errors.ErrUnsupported
		}
		return &os.PathError{Op: "open O_TMPFILE", Path: dir, Err: err}
	}
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return err
	}
	err = unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, final, unix.AT_SYMLINK_FOLLOW)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EEXIST):
		return &os.LinkError{Op: "link", Old: "O_TMPFILE", New: final, Err: os.ErrExist}
	case errors.Is(err, unix.ENOENT) && !procMounted(),
		errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES), errors.Is(err, unix.EOPNOTSUPP):
		// No usable /proc, or linking an unnamed file is not allowed
		// here: the named temporary file works everywhere.
		return errors.ErrUnsupported
	}
	return &os.LinkError{Op: "link", Old: "O_TMPFILE", New: final, Err: err}
}

func procMounted() bool {
	_, err := os.Stat("/proc/self/fd")
	return err == nil
}

// syncFileSystem makes everything written to the file system holding dir
// durable with one syncfs(2) (which reports write-back errors since Linux
// 5.8): the files of a whole pass and the directory entries naming them.
func syncFileSystem(dir string) error {
	if !syncfsOK() {
		return errors.ErrUnsupported
	}
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return errors.ErrUnsupported
		}
		return &os.PathError{Op: "syncfs", Path: dir, Err: err}
	}
	return nil
}

// startWriteback starts writing f's data to disk without waiting, so
// that a pass's files are written back together and the fsyncs that
// follow find their data (mostly) on disk already.
func startWriteback(f *os.File) {
	_ = unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
}

// syncfsOK is syncfsReportsErrors, asked once.
var syncfsOK = sync.OnceValue(syncfsReportsErrors)

// syncfsReportsErrors reports whether the kernel is Linux 5.8 or later,
// whose syncfs(2) returns write-back errors; an older one's may not, and
// a message must never be recorded as delivered on a failed write.
func syncfsReportsErrors() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var major, minor int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 5 || major == 5 && minor >= 8
}

// datasync makes f's data (and the metadata needed to read it, such as
// its size) durable with fdatasync(2).
func datasync(f *os.File) error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
