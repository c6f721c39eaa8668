package msg

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"
)

// Headers of an edited copy: an operator changed the body or the
// application headers of a dead letter before it was replayed. They stay
// on the message through every later move, so whoever looks at it — the
// app, the DLQ console, a later replay — can tell it is not what was first
// published.
const (
	// HeaderEditedBy names who made the last change (the console's token
	// label, or the command-line user).
	HeaderEditedBy = "x-hopper-edited-by"
	// HeaderEditedTime is when the last change was made (RFC 3339).
	HeaderEditedTime = "x-hopper-edited-time"
	// HeaderEdited says what the last change was, in words.
	HeaderEdited = "x-hopper-edited"
	// HeaderEditCount counts the changes made to the message.
	HeaderEditCount = "x-hopper-edit-count"
	// HeaderOriginalBodyDigest is "sha256:" and the hex SHA-256 of the body
	// before the first change. A later change keeps it, so it always
	// identifies the body as first published.
	HeaderOriginalBodyDigest = "x-hopper-original-body-sha256"
)

// historyHeaders are Hopper's and the broker's headers outside the
// x-hopper- prefix: the record of what happened to a message, which an
// operator's edit may not rewrite (a replay cap that could be reset by
// hand would no longer stop a message that fails for ever).
var historyHeaders = map[string]bool{
	HeaderRetryCount: true, HeaderRequeueCount: true,
	HeaderOriginalExchange: true, HeaderOriginalRoutingKey: true, HeaderOriginalQueue: true,
	HeaderFirstFailureTime: true, HeaderLastFailureTime: true, HeaderLastStatusCode: true,
	HeaderFinalStatusCode: true, HeaderFinalError: true, HeaderFinalRetryCount: true,
	HeaderDeadLetterReason: true, HeaderDeadLetterTime: true, HeaderTraceID: true,
	HeaderReplayCount: true, HeaderReplayTime: true, HeaderReplayedFrom: true,
	HeaderDeath: true, HeaderFirstDeathQueue: true, HeaderFirstDeathReason: true, HeaderFirstDeathExchange: true,
	HeaderDeliveryCount: true, HeaderAcquiredCount: true,
}

// IsHistory reports whether a header is part of the history Hopper or the
// broker keeps on a message (every x-hopper- header included) rather than
// an application header the publisher set. Names are compared as AMQP
// compares them: exactly.
func IsHistory(name string) bool {
	return historyHeaders[name] || strings.HasPrefix(name, "x-hopper-") || strings.HasPrefix(name, "x-first-death-")
}

// BodyDigest is the digest HeaderOriginalBodyDigest holds for body.
func BodyDigest(body []byte) string {
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Change is what an operator changes on a dead letter before it goes back.
type Change struct {
	// Body replaces the body when non-nil.
	Body []byte
	// Headers replace every application header when non-nil (history
	// headers in it are ignored: see IsHistory); nil keeps them.
	Headers map[string]any
	// By names who made the change, What says what it was.
	By, What string
	Now      time.Time
}

// EditedCopy is m with c applied: the body and application headers
// replaced as c says, every history header kept as it was, and the change
// recorded (who, when, what, how many changes so far, and the digest of
// the body as first published). It is what a replay then copies out of the
// DLQ; the original is left as it was.
func EditedCopy(m *Message, c Change) *Message {
	cp := m.Clone()
	if c.Headers != nil {
		for k := range cp.Headers {
			if !IsHistory(k) {
				delete(cp.Headers, k)
			}
		}
		for k, v := range c.Headers {
			if !IsHistory(k) {
				cp.Headers[k] = v
			}
		}
	}
	if _, ok := cp.Headers[HeaderOriginalBodyDigest]; !ok {
		cp.Headers[HeaderOriginalBodyDigest] = BodyDigest(m.Body)
	}
	if c.Body != nil {
		cp.Body = c.Body
	}
	cp.Headers[HeaderEditedBy] = c.By
	cp.Headers[HeaderEditedTime] = c.Now.UTC().Format(time.RFC3339Nano)
	cp.Headers[HeaderEdited] = c.What
	cp.Headers[HeaderEditCount] = int64(min(Counter(m.Headers[HeaderEditCount])+1, MaxCount))
	return cp
}
