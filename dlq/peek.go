package dlq

import (
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hopper-sidecar/hopper/msg"
)

// Preview renders at most max bytes of a body for a terminal: as text when
// it is valid UTF-8 made of printable characters (and newlines, tabs), else
// as a hex dump. truncated reports that the body was longer.
func Preview(body []byte, max int) (text string, isText, truncated bool) {
	if max <= 0 || max > len(body) {
		max = len(body)
	}
	cut := body[:max]
	truncated = max < len(body)
	if truncated {
		// Do not judge a text body by a rune the cut split.
		for i := 0; i < utf8.UTFMax-1 && len(cut) > 0 && !utf8.Valid(cut); i++ {
			cut = cut[:len(cut)-1]
		}
	}
	if utf8.Valid(cut) && printable(string(cut)) {
		return string(cut), true, truncated
	}
	return strings.TrimRight(hex.Dump(body[:max]), "\n"), false, truncated
}

func printable(s string) bool {
	for _, r := range s {
		if r == '\n' || r == '\t' || r == '\r' {
			continue
		}
		if !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// WritePeek writes message number n (1-based) for people: properties,
// headers sorted by name, and a body preview of at most maxBody bytes.
func WritePeek(w io.Writer, n int, m *msg.Message, maxBody int, now time.Time) error {
	var b strings.Builder
	fmt.Fprintf(&b, "--- message %d ---\n", n)
	prop := func(name, v string) {
		if v != "" {
			fmt.Fprintf(&b, "%-17s %s\n", name+":", quoteIfNeeded(v))
		}
	}
	for _, p := range msg.Properties(m) {
		prop(p.Name, p.Value)
	}
	if t, ok := msg.DeadLetterTime(m); ok {
		prop("in DLQ for", formatAge(now.Sub(t)))
	}
	prop("routing-key", m.RoutingKey)
	if m.Redelivered {
		prop("redelivered", "true")
	}
	if len(m.Headers) > 0 {
		b.WriteString("headers:\n")
		for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
			fmt.Fprintf(&b, "  %s: %s\n", quoteIfNeeded(k), formatValue(m.Headers[k]))
		}
	}
	text, isText, truncated := Preview(m.Body, maxBody)
	more := ""
	if truncated {
		more = fmt.Sprintf(", first %d shown", min(maxBody, len(m.Body)))
	}
	if isText {
		fmt.Fprintf(&b, "body (%d bytes, text%s):\n%s\n", len(m.Body), more, text)
	} else {
		fmt.Fprintf(&b, "body (%d bytes, binary%s):\n%s\n", len(m.Body), more, text)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write message %d: %w", n, err)
	}
	return nil
}

// formatValue renders a header value with its AMQP type where the type is
// not obvious.
func formatValue(v any) string {
	switch x := v.(type) {
	case nil:
		return "(void)"
	case string:
		return quoteIfNeeded(x)
	case []byte:
		if utf8.Valid(x) && printable(string(x)) {
			return fmt.Sprintf("bytes %q", x)
		}
		return "bytes 0x" + hex.EncodeToString(x)
	case time.Time:
		return x.UTC().Format(time.RFC3339) + " (timestamp)"
	case map[string]any:
		parts := make([]string, 0, len(x))
		for _, k := range slices.Sorted(maps.Keys(x)) {
			parts = append(parts, quoteIfNeeded(k)+": "+formatValue(x[k]))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = formatValue(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	if s, ok := headerString(v); ok {
		return fmt.Sprintf("%s (%T)", s, v)
	}
	return fmt.Sprintf("%v (%T)", v, v)
}

// quoteIfNeeded quotes strings that would not read back unambiguously on a
// terminal (control characters, surrounding spaces, invalid UTF-8).
func quoteIfNeeded(s string) string {
	if s == "" || strings.TrimSpace(s) != s || !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool {
		return !unicode.IsPrint(r)
	}) {
		return fmt.Sprintf("%q", s)
	}
	return s
}

// FormatValue renders a header value for people, with its AMQP type where
// the type is not obvious (as peek shows it).
func FormatValue(v any) string { return formatValue(v) }
