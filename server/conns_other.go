//go:build !unix

package server

import "net"

// pendingInput cannot peek here: a connection counts as idle after
// idleGrace without a read.
func pendingInput(net.Conn) bool { return false }

// fileLimit is a usual limit on open files: this system has none to read.
func fileLimit() int { return 8192 }
