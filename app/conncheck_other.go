//go:build !linux

package app

import "net"

// peerClosed cannot peek at a socket on this platform: a dead idle
// connection shows as a cut request instead.
func peerClosed(net.Conn) bool { return false }

// peerGone cannot peek either.
func peerGone(net.Conn) bool { return false }
