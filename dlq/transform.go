package dlq

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"

	"github.com/hopper-sidecar/hopper/msg"
)

// A transformation fixes every message of a selection the same way before
// it is replayed. It is a JSON Patch (RFC 6902) applied to a document made
// of the message's JSON body and its application headers:
//
//	{"body": <the body>, "headers": {"tenant": "acme", ...}}
//
// so "/body/amount" is a field of the body and "/headers/tenant" a header.
// A "test" operation that fails, a path that is not there, or a body that
// is not JSON is a failure of the transformation for that message: it is
// left in the DLQ as it was. The copy is an edited one (see Edit): Hopper's
// history headers cannot be reached, and the copy records that it was
// changed, by whom and when.

// Transform is a parsed transformation.
type Transform struct {
	patch jsonpatch.Patch
	// Text is the patch as given, compacted.
	Text string
	// By names who applies it.
	By string
}

// ParseTransform reads a JSON Patch and checks every operation: the
// library checks its kind and fields, this that each path is in the body
// or names an application header.
func ParseTransform(text []byte) (*Transform, error) {
	var compact bytes.Buffer
	if err := json.Compact(&compact, text); err != nil {
		return nil, fmt.Errorf("transformation: not a JSON Patch (a JSON array of operations): %w", err)
	}
	p, err := jsonpatch.DecodePatch(compact.Bytes())
	if err != nil {
		return nil, fmt.Errorf("transformation: not a JSON Patch (a JSON array of operations): %w", err)
	}
	if len(p) == 0 {
		return nil, errors.New("transformation: the patch has no operation")
	}
	var errs []error
	for i, op := range p {
		kind := op.Kind()
		path, err := op.Path()
		if err != nil {
			errs = append(errs, fmt.Errorf("operation %d (%s): %w", i+1, kind, err))
		} else if err := patchPath(path); err != nil {
			errs = append(errs, fmt.Errorf("operation %d (%s) path %q: %w", i+1, kind, path, err))
		}
		if kind == "move" || kind == "copy" {
			from, err := op.From()
			if err != nil {
				errs = append(errs, fmt.Errorf("operation %d (%s): %w", i+1, kind, err))
			} else if err := patchPath(from); err != nil {
				errs = append(errs, fmt.Errorf("operation %d (%s) from %q: %w", i+1, kind, from, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("transformation: %w", err)
	}
	return &Transform{patch: p, Text: compact.String()}, nil
}

// patchPath checks that a path is in the body or names an application
// header.
func patchPath(path string) error {
	switch {
	case path == "/body" || strings.HasPrefix(path, "/body/"):
		return nil
	case strings.HasPrefix(path, "/headers/"):
		name, _, _ := strings.Cut(strings.TrimPrefix(path, "/headers/"), "/")
		name = strings.NewReplacer("~1", "/", "~0", "~").Replace(name)
		if msg.IsHistory(name) {
			return fmt.Errorf("header %q is part of the message's history, kept by Hopper or the broker, and cannot be changed", name)
		}
		if name == "" {
			return errors.New("names no header")
		}
		return nil
	}
	return errors.New(`want a path under /body or /headers/NAME`)
}

// patchDoc is the document a transformation is applied to.
type patchDoc struct {
	Body    json.RawMessage            `json:"body"`
	Headers map[string]json.RawMessage `json:"headers"`
}

// Apply returns the changed copy of m, or nil when the transformation
// changes nothing on it (the message is then replayed as it is), or why
// it cannot be applied; m is not changed.
func (t *Transform) Apply(m *msg.Message, now time.Time) (*msg.Message, error) {
	before, after, err := t.patched(m)
	if err != nil {
		return nil, err
	}
	e := Edit{ContentType: m.ContentType, By: t.By, what: "transformation"}
	if !bytes.Equal(before.Body, after.Body) {
		body := string(after.Body)
		e.Body = &body
	}
	if !sameHeaders(before.Headers, after.Headers) {
		e.Headers = after.Headers
		if e.Headers == nil {
			e.Headers = map[string]json.RawMessage{}
		}
	}
	if e.Body == nil && e.Headers == nil {
		return nil, nil
	}
	return e.Apply(m, now)
}

// patched is m's document before and after the patch.
func (t *Transform) patched(m *msg.Message) (before, after patchDoc, err error) {
	var body bytes.Buffer
	if err := json.Compact(&body, m.Body); err != nil {
		return before, after, fmt.Errorf("the body is not JSON, which the transformation needs: %w", err)
	}
	headers, err := json.Marshal(AppHeaders(m))
	if err != nil {
		return before, after, fmt.Errorf("headers: %w", err)
	}
	doc, err := json.Marshal(struct {
		Body    json.RawMessage `json:"body"`
		Headers json.RawMessage `json:"headers"`
	}{body.Bytes(), headers})
	if err != nil {
		return before, after, err
	}
	if err := json.Unmarshal(doc, &before); err != nil {
		return before, after, err
	}
	out, err := t.patch.Apply(doc)
	if err != nil {
		return before, after, fmt.Errorf("transformation: %w", err)
	}
	if err := json.Unmarshal(out, &after); err != nil {
		return before, after, fmt.Errorf("transformation: %w", err)
	}
	if len(after.Body) == 0 {
		return before, after, errors.New("transformation: it removes the body; replace it instead")
	}
	var c bytes.Buffer
	if err := json.Compact(&c, after.Body); err != nil {
		return before, after, fmt.Errorf("transformation: %w", err)
	}
	after.Body = c.Bytes()
	return before, after, nil
}

func sameHeaders(a, b map[string]json.RawMessage) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !jsonpatch.Equal(v, w) {
			return false
		}
	}
	return true
}

// Change is one message before and after a transformation.
type Change struct {
	ID string `json:"id"`
	// Before and After are the body (pretty JSON) and application
	// headers; After is empty when Error says why the transformation
	// fails on the message, or when Unchanged.
	Before    PreviewDoc  `json:"before"`
	After     *PreviewDoc `json:"after,omitempty"`
	Unchanged bool        `json:"unchanged,omitempty"`
	Error     string      `json:"error,omitempty"`
}

// PreviewDoc is a body and headers as a preview shows them.
type PreviewDoc struct {
	Body    string         `json:"body"`
	Headers map[string]any `json:"headers"`
}

// Preview shows what the transformation does to m.
func (t *Transform) Preview(m *msg.Message, now time.Time) Change {
	p := Change{ID: m.MessageID, Before: previewDoc(m)}
	cp, err := t.Apply(m, now)
	switch {
	case err != nil:
		p.Error = err.Error()
	case cp == nil:
		p.Unchanged = true
	default:
		after := previewDoc(cp)
		p.After = &after
	}
	return p
}

func previewDoc(m *msg.Message) PreviewDoc {
	d := PreviewDoc{Body: string(m.Body), Headers: AppHeaders(m)}
	var out bytes.Buffer
	if json.Indent(&out, m.Body, "", "  ") == nil {
		d.Body = out.String()
	}
	return d
}
