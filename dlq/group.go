package dlq

import (
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/hopper-sidecar/hopper/msg"
)

// A DLQ of a hundred thousand messages usually holds a handful of causes.
// Messages are grouped by what they failed with: the dead-letter reason,
// the final status, the original routing key and the fingerprint of the
// last error, which is that error with what differs from message to
// message (ids, uuids, hex, numbers, timestamps) masked. The grouping
// lives here, beside Filter, so that a group selected by the console and
// the messages a replay, export or purge of that group takes are the same
// by construction.

// GroupKey is the failure group of a dead-lettered message. Every field
// is compared exactly.
type GroupKey struct {
	// Reason is x-dead-letter-reason (or the broker's reason).
	Reason string `json:"reason"`
	// Status is x-final-status-code, or Unknown without one.
	Status string `json:"status"`
	// Fingerprint is Fingerprint of x-final-error.
	Fingerprint string `json:"fingerprint"`
	// RoutingKey is the routing key the message was first published with.
	RoutingKey string `json:"routingKey"`
	// ReplayRun names the replay run after which the message failed again
	// (x-hopper-replay-run); "" for a message never replayed. A fix that
	// did not hold shows as groups of its own, one per run.
	ReplayRun string `json:"replayRun,omitempty"`
}

// GroupOf returns m's failure group.
func GroupOf(m *msg.Message) GroupKey {
	return GroupKey{
		Reason:      msg.DeadLetterReason(m),
		Status:      statusKey(m),
		Fingerprint: Fingerprint(m.String(msg.HeaderFinalError)),
		RoutingKey:  msg.OriginalRoutingKey(m),
		ReplayRun:   m.String(msg.HeaderReplayRun),
	}
}

// MaxFingerprint bounds a fingerprint in bytes: an error that carries a
// whole response body would otherwise make every group key as long as it.
const MaxFingerprint = 240

// Masks put in place of the parts of an error that vary between messages.
const (
	MaskTime   = "<time>"
	MaskUUID   = "<uuid>"
	MaskHex    = "<hex>"
	MaskID     = "<id>"
	MaskNumber = "<n>"
)

var (
	// An RFC 3339 or SQL-style timestamp, with optional fraction and zone.
	timeRE = regexp.MustCompile(`\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?`)
	uuidRE = regexp.MustCompile(`(?i)[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	spaces = regexp.MustCompile(`\s+`)
)

// Fingerprint normalises an error text so that the same failure of
// different messages reads the same: timestamps, uuids, hex values (0x…
// or eight hex digits and more), ids (words mixing letters and digits)
// and numbers are masked, runs of white space become one space, and the
// result is cut to MaxFingerprint bytes.
func Fingerprint(s string) string {
	if s == "" {
		return ""
	}
	if strings.ContainsAny(s, "-") {
		s = timeRE.ReplaceAllLiteralString(s, MaskTime)
		s = uuidRE.ReplaceAllLiteralString(s, MaskUUID)
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		if !isWord(s[i]) {
			b.WriteByte(s[i])
			i++
			continue
		}
		j := i
		for j < len(s) && isWord(s[j]) {
			j++
		}
		b.WriteString(maskWord(s[i:j]))
		i = j
	}
	out := strings.TrimSpace(spaces.ReplaceAllLiteralString(b.String(), " "))
	if len(out) > MaxFingerprint {
		cut := MaxFingerprint
		for cut > 0 && !utf8.RuneStart(out[cut]) {
			cut--
		}
		out = out[:cut] + "…"
	}
	return out
}

// isWord reports the bytes of an identifier-like word: letters, digits
// and underscore. Bytes of multi-byte runes are not, so a word never
// splits a rune.
func isWord(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
}

// maskWord masks one word; a mask already written (from the timestamp or
// uuid pass) is surrounded by < > and is never a word itself.
func maskWord(w string) string {
	var digits, letters, hexLetters int
	for i := 0; i < len(w); i++ {
		switch c := w[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F':
			hexLetters++
			letters++
		case c != '_':
			letters++
		}
	}
	switch {
	case digits == 0:
		return w
	case len(w) > 2 && (w[:2] == "0x" || w[:2] == "0X") && isHex(w[2:]):
		return MaskHex
	case letters == 0 && !strings.Contains(w, "_"):
		return MaskNumber
	case len(w) >= 8 && letters == hexLetters && isHex(w):
		return MaskHex
	}
	// A number with its unit (1200ms, 5s, 3rd) keeps the unit.
	if n := strings.IndexFunc(w, func(r rune) bool { return r < '0' || r > '9' }); n > 0 && strings.IndexFunc(w[n:], func(r rune) bool { return r >= '0' && r <= '9' || r == '_' }) < 0 {
		return MaskNumber + w[n:]
	}
	// Letters and digits mixed (ord_12ab, user42, AB12CD): an id.
	return MaskID
}

func isHex(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}
