//go:build !linux

package app

import (
	"net"
	"syscall"
)

// rawConn has nothing to look up on this platform: nothing peeks.
func rawConn(net.Conn) syscall.RawConn { return nil }

// peerClosed cannot peek at a socket on this platform: a dead idle
// connection shows as a cut request instead.
func peerClosed(syscall.RawConn) bool { return false }

// peerGone cannot peek either.
func peerGone(syscall.RawConn) bool { return false }
