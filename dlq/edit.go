package dlq

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"mime"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hopper-sidecar/hopper/msg"
)

// An edit is an operator's fix of one dead letter before it goes back: a
// new body, and the application headers as they should be. What Hopper
// and the broker recorded about the message (IsHistory headers) cannot be
// edited; the copy says it was edited, by whom and when, and keeps the
// digest of the body as first published (msg.EditedCopy).
//
// The edit is applied to the message as the replay takes it from the DLQ,
// not to what the operator saw: a message whose content type is no longer
// the one the edit was made for is left alone, and a body that is not what
// its content type says is refused there as well as here.

// MaxEditBody bounds an edited body, in bytes.
const MaxEditBody = 1 << 20

// Edit is one message's change as an operator typed it.
type Edit struct {
	// Body is the new body as text; nil keeps the body.
	Body *string `json:"body,omitempty"`
	// Headers are every application header the copy carries, as JSON
	// values; nil keeps them. A header whose value is what JSONValue shows for
	// the original keeps its AMQP type; one left out is removed.
	Headers map[string]json.RawMessage `json:"headers,omitempty"`
	// ContentType is the content type of the message the edit was made
	// for: a JSON one makes the body checked as JSON.
	ContentType string `json:"contentType"`
	// By names who edits (the console's token label).
	By string `json:"-"`
	// what, when set, names the kind of change in the copy's record
	// ("transformation"); an operator's edit leaves it empty.
	what string
}

// Validate reports every problem that can be seen without the message.
func (e *Edit) Validate() error {
	var errs []error
	if e.Body == nil && e.Headers == nil {
		errs = append(errs, errors.New("the edit changes nothing: give a body, headers or both"))
	}
	if e.Body != nil {
		if len(*e.Body) > MaxEditBody {
			errs = append(errs, fmt.Errorf("body of %d bytes: at most %d", len(*e.Body), MaxEditBody))
		} else if IsJSONType(e.ContentType) {
			if err := CheckJSON([]byte(*e.Body)); err != nil {
				errs = append(errs, fmt.Errorf("body (content type %s): %w", e.ContentType, err))
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(e.Headers)) {
		if msg.IsHistory(k) {
			errs = append(errs, fmt.Errorf("header %q is part of the message's history, kept by Hopper or the broker, and cannot be edited", k))
			continue
		}
		if k == "" {
			errs = append(errs, errors.New("a header has an empty name"))
			continue
		}
		if _, err := fromJSON(e.Headers[k]); err != nil {
			errs = append(errs, fmt.Errorf("header %q: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// ErrStale refuses an edit made for another version of the message.
var ErrStale = errors.New("the message changed since it was opened")

// Apply returns the edited copy of m, or why the edit cannot be made on
// it; m is not changed.
func (e *Edit) Apply(m *msg.Message, now time.Time) (*msg.Message, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	if m.ContentType != e.ContentType {
		return nil, fmt.Errorf("%w: its content type is %q, the edit was made for %q", ErrStale, m.ContentType, e.ContentType)
	}
	c := msg.Change{By: e.By, Now: now}
	var what []string
	if e.Body != nil {
		body := []byte(*e.Body)
		if IsJSONType(m.ContentType) {
			// Indentation is the editor's; the copy carries the document.
			var out bytes.Buffer
			if err := json.Compact(&out, body); err != nil {
				return nil, fmt.Errorf("body: %w", err)
			}
			body = out.Bytes()
		}
		c.Body = body
		what = append(what, fmt.Sprintf("body (%d bytes, was %d)", len(body), len(m.Body)))
	}
	if e.Headers != nil {
		c.Headers = map[string]any{}
		var set, removed []string
		for k, raw := range e.Headers {
			old, had := m.Headers[k]
			if had && sameJSON(old, raw) {
				c.Headers[k] = old
				continue
			}
			v, err := fromJSON(raw)
			if err != nil {
				return nil, fmt.Errorf("header %q: %w", k, err)
			}
			c.Headers[k] = v
			set = append(set, k)
		}
		for k := range m.Headers {
			if _, kept := e.Headers[k]; !kept && !msg.IsHistory(k) {
				removed = append(removed, k)
			}
		}
		slices.Sort(set)
		slices.Sort(removed)
		if len(set) > 0 {
			what = append(what, "headers set: "+strings.Join(set, ", "))
		}
		if len(removed) > 0 {
			what = append(what, "headers removed: "+strings.Join(removed, ", "))
		}
	}
	if len(what) == 0 {
		what = append(what, "nothing changed")
	}
	c.What = strings.Join(what, "; ")
	if e.what != "" {
		c.What = e.what + ": " + c.What
	}
	return msg.EditedCopy(m, c), nil
}

// AppHeaders are m's application headers (not IsHistory) as JSON values,
// the form an edit gives them back in.
func AppHeaders(m *msg.Message) map[string]any {
	out := map[string]any{}
	for k, v := range m.Headers {
		if !msg.IsHistory(k) {
			out[k] = JSONValue(v)
		}
	}
	return out
}

// JSONValue is an AMQP header value as a JSON value: strings, numbers, bools
// and null as they are; bytes as text (or base64 when not UTF-8, which
// encoding/json does for []byte); times in RFC 3339; decimals as their
// decimal text; tables and arrays element by element.
func JSONValue(v any) any {
	switch x := v.(type) {
	case []byte:
		if utf8.Valid(x) {
			return string(x)
		}
		return x
	case time.Time:
		return x.UTC().Format(time.RFC3339)
	case msg.Decimal:
		return x.String()
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = JSONValue(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = JSONValue(e)
		}
		return out
	}
	return v
}

// sameJSON reports whether raw is the JSON the editor was given for old.
func sameJSON(old any, raw json.RawMessage) bool {
	a, err := json.Marshal(JSONValue(old))
	if err != nil {
		return false
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return false
	}
	return bytes.Equal(a, b.Bytes())
}

// fromJSON turns a JSON value into an AMQP header value: integers as
// int64, other numbers as float64, objects as tables, arrays as arrays.
func fromJSON(raw json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not a JSON value: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not a JSON value: more than one value")
	}
	return amqpValue(v)
}

func amqpValue(v any) (any, error) {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i, nil
		}
		f, err := x.Float64()
		if err != nil || math.IsInf(f, 0) {
			return nil, fmt.Errorf("number %s does not fit a header", x)
		}
		return f, nil
	case map[string]any:
		for k, e := range x {
			c, err := amqpValue(e)
			if err != nil {
				return nil, err
			}
			x[k] = c
		}
		return x, nil
	case []any:
		for i, e := range x {
			c, err := amqpValue(e)
			if err != nil {
				return nil, err
			}
			x[i] = c
		}
		return x, nil
	}
	return v, nil
}

// IsJSONType reports whether a content type says the body is JSON:
// application/json, text/json, or a +json type.
func IsJSONType(contentType string) bool {
	t, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return t == "application/json" || t == "text/json" || strings.HasSuffix(t, "+json")
}

// CheckJSON reports whether body is one JSON document, and where it is
// not (line and column, counted from 1).
func CheckJSON(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	var v json.RawMessage
	err := dec.Decode(&v)
	if err == nil {
		if _, more := dec.Token(); more == nil {
			return fmt.Errorf("not valid JSON: more than one document (at %s)", position(body, dec.InputOffset()))
		}
		return nil
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		// Offset counts the bytes read, the offending one included.
		return fmt.Errorf("not valid JSON: %s at %s", se.Error(), position(body, se.Offset-1))
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return fmt.Errorf("not valid JSON: the document ends early (at %s)", position(body, int64(len(body))))
	}
	return fmt.Errorf("not valid JSON: %w", err)
}

// position is line and column of a byte offset.
func position(body []byte, off int64) string {
	off = min(max(off, 0), int64(len(body)))
	before := body[:off]
	line := bytes.Count(before, []byte("\n")) + 1
	col := utf8.RuneCount(before[bytes.LastIndexByte(before, '\n')+1:]) + 1
	return fmt.Sprintf("line %d, column %d", line, col)
}

// OriginalsQueue is the queue that keeps the originals of the messages of
// dlq changed before a replay: each exactly as it was in the DLQ, to be
// got back with export and import.
func OriginalsQueue(dlq string) string { return dlq + ".originals" }
