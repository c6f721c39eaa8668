package msg

import (
	"crypto/rand"
	"encoding/hex"
)

// EnsureID gives a message published without a message id one of its own,
// a random UUID (version 4), and says whether it did. Two messages with
// the same routing key and body are two messages: an id derived from
// their content would make an app that skips an id it has seen drop the
// second. Every copy Hopper makes of the message (a retry, a requeue, a
// give-back, the DLQ) carries the id as its message id, so every later
// attempt of the message shows the same id. Only a redelivery of the
// delivery Hopper first read, before any copy (Hopper or its channel gone
// before it settled the message), comes without it and gets a new one.
func EnsureID(m *Message) bool {
	if m.MessageID != "" {
		return false
	}
	var b [16]byte
	rand.Read(b[:])         // never fails: the runtime aborts rather than return an error
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // the RFC 4122 variant
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	m.MessageID = string(s[:])
	return true
}
