//go:build !linux

package forward

import "net"

// samePeer accepts every connection where the peer's user cannot be read;
// the socket's mode (0600) keeps other users out.
func samePeer(net.Conn) bool { return true }
