package app

import (
	"errors"
	"net"
	"syscall"
)

// rawConn is c's descriptor access, for peerClosed and peerGone; nil when
// c has none. A connection looks it up once: each lookup allocates, and
// every request on a reused connection peeks.
func rawConn(c net.Conn) syscall.RawConn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// peerClosed reports whether the app has closed (or reset) an idle
// keep-alive connection, without taking anything off it: a non-blocking
// peek that finds end-of-file, an error, or bytes nobody asked for (an
// idle HTTP/1.1 connection has nothing to read). It reports false when it
// cannot tell.
func peerClosed(rc syscall.RawConn) bool { return peek(rc, true) }

// peerGone is peerClosed without counting bytes waiting to be read: only
// end-of-file or a reset say the app closed the connection.
func peerGone(rc syscall.RawConn) bool { return peek(rc, false) }

func peek(rc syscall.RawConn, unexpectedBytes bool) bool {
	if rc == nil {
		return false
	}
	closed := false
	// Control, not Read: it takes no read lock, so a peek never waits for
	// a read another goroutine has under way on the same connection; a
	// non-blocking MSG_PEEK neither waits nor takes anything off it.
	err := rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINTR):
			// Nothing to read: the connection is open and idle.
		case err != nil, n == 0:
			closed = true
		case n > 0:
			closed = unexpectedBytes
		}
	})
	return err == nil && closed
}
