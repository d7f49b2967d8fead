// Package owner lets one process own a ledger file while every other
// process on it talks to that one: where a ledger's owner listens, the
// hello a client opens a connection with, starting an owner when none
// answers, and the pipe that carries an MCP client's stdio to it.
//
// The shape is gopls -remote=auto's: a stdio server dials the owner's
// socket, starts a detached owner when none answers, and then copies
// JSON-RPC lines. A tool call re-sent with the same operation key is
// safe, so a call lost with a connection is answered with an error that
// says to repeat it, and the pipe dials again.
package owner

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// maxSocketPath is the longest socket path every unix platform takes
// (sockaddr_un's sun_path is 104 bytes on the BSDs, 108 on Linux, with
// its NUL).
const maxSocketPath = 103

// Place is where the owner of one ledger file listens and writes.
type Place struct {
	Ledger string // the ledger file, absolute
	Socket string // the owner's socket (mode 0600)
	Log    string // the owner's log, once it has started
}

// PlaceOf returns the place of the owner of the ledger file db. The
// socket is in $XDG_RUNTIME_DIR/idemgate when that directory is set and
// this user's, named from the ledger's absolute path; otherwise beside
// the ledger, as db + ".owner.sock". A path longer than a socket may have is an
// error that says what to do.
func PlaceOf(db string) (Place, error) {
	abs, err := filepath.Abs(db)
	if err != nil {
		return Place{}, fmt.Errorf("ledger path %s: %w", db, err)
	}
	// Two spellings of one directory name one owner.
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		abs = filepath.Join(dir, filepath.Base(abs))
	}
	base := abs + ".owner.sock"
	if dir, ok := runtimeDir(); ok {
		sum := sha256.Sum256([]byte(abs))
		name := filepath.Base(abs)
		if len(name) > 32 {
			name = name[:32]
		}
		base = filepath.Join(dir, name+"-"+hex.EncodeToString(sum[:8])+".owner.sock")
	}
	if len(base) > maxSocketPath {
		return Place{}, fmt.Errorf("the socket for ledger %s would be %s, longer than a unix socket path may be (%d bytes): set XDG_RUNTIME_DIR to a short directory of yours, or keep the ledger in a shorter path", abs, base, maxSocketPath)
	}
	stem := strings.TrimSuffix(strings.TrimSuffix(base, ".sock"), ".owner")
	return Place{Ledger: abs, Socket: base, Log: stem + ".owner.log"}, nil
}

// runtimeDir returns $XDG_RUNTIME_DIR/idemgate, creating it (mode 0700),
// when XDG_RUNTIME_DIR names a directory that belongs to this user.
func runtimeDir() (string, bool) {
	root := os.Getenv("XDG_RUNTIME_DIR")
	if root == "" || !filepath.IsAbs(root) {
		return "", false
	}
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() || !ownedByMe(fi) {
		return "", false
	}
	dir := filepath.Join(root, "idemgate")
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", false
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() || !ownedByMe(fi) {
		return "", false
	}
	return dir, true
}
