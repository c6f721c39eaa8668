package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
)

// headerMeaning says in words what each of Hopper's headers, and the
// broker's, tells about a dead-lettered message.
var headerMeaning = map[string]string{
	msg.HeaderRetryCount:         "failed attempts Hopper counted before this one",
	msg.HeaderRequeueCount:       "times the app answered 425 Too Early and the message was put back (not attempts)",
	msg.HeaderOriginalExchange:   "exchange the message was first published to",
	msg.HeaderOriginalRoutingKey: "routing key the message was first published with",
	msg.HeaderOriginalQueue:      "work queue the message was consumed from before it was dead-lettered",
	msg.HeaderFirstFailureTime:   "when the first attempt failed",
	msg.HeaderLastFailureTime:    "when the last attempt failed",
	msg.HeaderLastStatusCode:     "HTTP status of the last failed attempt",
	msg.HeaderDeadline:           "absolute deadline (Unix milliseconds) past which Hopper does not deliver the message",
	msg.HeaderCrashCount:         "requests with this message during which the app died",
	msg.HeaderCrashSuspect:       "the message was in flight when the app died beside others, and is delivered alone next",
	msg.HeaderFinalStatusCode:    "HTTP status of the attempt that sent the message to the DLQ (0: no response)",
	msg.HeaderFinalError:         "error or response summary of that attempt",
	msg.HeaderFinalRetryCount:    "failed attempts in total when the message was dead-lettered",
	msg.HeaderDeadLetterReason:   "why the message is in the DLQ",
	msg.HeaderDeadLetterTime:     "when the message was dead-lettered",
	msg.HeaderTraceID:            "trace of the message's attempts",
	msg.HeaderReplayCount:        "times the message was replayed from a DLQ; a replay keeps it in the DLQ past the replay cap",
	msg.HeaderReplayTime:         "when the message was last replayed",
	msg.HeaderReplayedFrom:       "DLQ the message was last replayed from",
	msg.HeaderReplayRun:          "replay run that last replayed the message; back in the DLQ, it failed again after that run",
	msg.HeaderDeath:              "the broker's record of each time it dead-lettered the message (history only)",
	msg.HeaderFirstDeathQueue:    "queue the broker first dead-lettered the message from",
	msg.HeaderFirstDeathReason:   "why the broker first dead-lettered the message",
	msg.HeaderFirstDeathExchange: "exchange the message was in when the broker first dead-lettered it",
	msg.HeaderDeliveryCount:      "times a quorum queue delivered the message and had it returned; past its delivery limit the broker drops it",
	msg.HeaderEditedBy:           "who last edited the message before a replay (the console's token label)",
	msg.HeaderEditedTime:         "when the message was last edited",
	msg.HeaderEdited:             "what the last edit changed",
	msg.HeaderEditCount:          "times the message was edited",
	msg.HeaderOriginalBodyDigest: "SHA-256 of the body as first published, before any edit",
}

// Field is one name and value in the message view.
type Field struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	// About explains one of Hopper's or the broker's headers.
	About string `json:"about,omitempty"`
}

// Body is a message body as the view shows it.
type Body struct {
	// Kind is json (pretty-printed), text or binary (a hex dump).
	Kind      string `json:"kind"`
	Text      string `json:"text"`
	Size      int    `json:"size"`
	Truncated bool   `json:"truncated"`
}

// MessageView is everything the message view shows.
type MessageView struct {
	DLQ        string  `json:"dlq"`
	ID         string  `json:"id"`
	Group      *Group  `json:"group,omitempty"`
	Properties []Field `json:"properties"`
	Headers    []Field `json:"headers"`
	History    []Field `json:"history"`
	Body       Body    `json:"body"`
	TraceID    string  `json:"traceId,omitempty"`
	TraceURL   string  `json:"traceUrl,omitempty"`
	// Edit is where the editor starts, with actions allowed.
	Edit *EditView `json:"edit,omitempty"`
}

func (s *Server) describe(dlqName string, m *msg.Message) MessageView {
	v := MessageView{DLQ: dlqName, ID: m.MessageID, Properties: properties(m), Headers: []Field{}, History: history(m, s.o.Now())}
	if q := s.queues[dlqName]; q != nil {
		q.mu.Lock()
		ix := q.index
		q.mu.Unlock()
		if ix != nil {
			if g, ok := ix.GroupOfMessage(m.MessageID); ok {
				v.Group = &g
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		v.Headers = append(v.Headers, Field{Name: k, Value: dlq.FormatValue(m.Headers[k]), About: headerMeaning[k]})
	}
	v.Body = renderBody(m.Body, s.o.MaxBody)
	if s.o.AllowActions {
		v.Edit = editView(dlqName, m)
	}
	if id := m.String(msg.HeaderTraceID); id != "" {
		v.TraceID = id
		if s.o.TraceURL != "" {
			v.TraceURL = TraceLink(s.o.TraceURL, id)
		}
	}
	return v
}

// TraceLink fills a trace URL template with a trace id, escaped as one
// path segment so that it cannot change the link's host or scheme.
func TraceLink(tmpl, traceID string) string {
	return strings.ReplaceAll(tmpl, "{traceId}", url.PathEscape(traceID))
}

func properties(m *msg.Message) []Field {
	var out []Field
	for _, p := range msg.Properties(m) {
		out = append(out, Field{Name: p.Name, Value: p.Value})
	}
	for _, f := range []Field{{Name: "exchange", Value: m.Exchange}, {Name: "routing-key", Value: m.RoutingKey}} {
		if f.Value != "" {
			out = append(out, f)
		}
	}
	return out
}

// history is the attempt history Hopper recorded on the message, in
// words.
func history(m *msg.Message, now time.Time) []Field {
	in := msg.Read(m, msg.OriginalQueue(m), "", now)
	out := []Field{
		{Name: "original queue", Value: orDash(msg.OriginalQueue(m))},
		{Name: "first published to", Value: exchangeName(in.Exchange) + " with routing key " + orDash(in.RoutingKey)},
		{Name: "failed attempts", Value: fmt.Sprint(in.Retries)},
		{Name: "requeues (425)", Value: fmt.Sprint(in.Requeues)},
	}
	if in.Crashes > 0 {
		out = append(out, Field{Name: "app crashes under it", Value: fmt.Sprint(in.Crashes)})
	}
	for _, h := range []struct{ name, header string }{
		{"first failure", msg.HeaderFirstFailureTime},
		{"last failure", msg.HeaderLastFailureTime},
		{"last status", msg.HeaderLastStatusCode},
		{"final status", msg.HeaderFinalStatusCode},
		{"final error", msg.HeaderFinalError},
		{"dead-letter reason", msg.HeaderDeadLetterReason},
	} {
		if v, ok := m.Headers[h.header]; ok {
			out = append(out, Field{Name: h.name, Value: plain(v)})
		}
	}
	if t, ok := msg.DeadLetterTime(m); ok {
		out = append(out, Field{Name: "dead-lettered", Value: t.UTC().Format(time.RFC3339) + " (" + now.Sub(t).Round(time.Second).String() + " ago)"})
	}
	if !in.Deadline.IsZero() {
		out = append(out, Field{Name: "deadline", Value: in.Deadline.UTC().Format(time.RFC3339)})
	}
	if n := msg.ReplayCount(m); n > 0 {
		out = append(out, Field{Name: "replayed before", Value: fmt.Sprintf("%d time(s), last from %s at %s", n, orDash(m.String(msg.HeaderReplayedFrom)), orDash(m.String(msg.HeaderReplayTime)))})
	}
	return out
}

// exchangeName names the default exchange, whose name is empty.
func exchangeName(ex string) string {
	if ex == "" {
		return "the default exchange"
	}
	return "exchange " + ex
}

func plain(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	}
	return dlq.FormatValue(v)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// renderBody shows at most limit bytes: pretty JSON when the body is a
// JSON document that fits, else text when it is printable UTF-8, else a
// hex dump.
func renderBody(body []byte, limit int) Body {
	b := Body{Size: len(body)}
	if len(body) <= limit && json.Valid(body) {
		var out bytes.Buffer
		if err := json.Indent(&out, body, "", "  "); err == nil {
			b.Kind, b.Text = "json", out.String()
			return b
		}
	}
	text, isText, truncated := dlq.Preview(body, limit)
	b.Text, b.Truncated = text, truncated
	b.Kind = "binary"
	if isText {
		b.Kind = "text"
	}
	return b
}
