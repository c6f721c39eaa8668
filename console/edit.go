package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
)

// Edit and retry: one message's body and application headers changed,
// then the edited copy replayed by the same run as a replay (exclusive
// owner, publish → confirm → ack, the replay cap). The message as it was
// is published to the originals queue first (dlq.OriginalsQueue), and the
// edited copy only once that copy is confirmed; export and import bring it
// back.

// editRequest is the body of an edit.
type editRequest struct {
	Message string `json:"message"`
	dlq.Edit
	// ResetAttempts gives the edited copy its full retry budget again.
	ResetAttempts bool `json:"resetAttempts"`
	Redirect
}

func (s *Server) postEdit(w http.ResponseWriter, r *http.Request, who string) {
	q, ok := s.queue(w, r)
	if !ok {
		return
	}
	var req editRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 2*dlq.MaxEditBody+64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		httpError(w, http.StatusBadRequest, fmt.Errorf("request body: want a JSON object with message, contentType, and body or headers: %w", err))
		return
	}
	if req.Message == "" {
		httpError(w, http.StatusBadRequest, errors.New("give the message to edit (message: its id)"))
		return
	}
	if err := req.Validate(); err != nil {
		s.o.Log.Info("console: edit refused", "dlq", q.Name, "message", req.Message, "who", who, "error", err.Error())
		httpError(w, http.StatusBadRequest, fmt.Errorf("nothing changed, the message is still in %s as it was: %w", q.Name, err))
		return
	}
	label, _ := s.token(r.Header.Get(TokenHeader))
	edit := req.Edit
	edit.By = label
	originals := dlq.OriginalsQueue(q.Name)
	o := dlq.ReplayOptions{
		DLQ: q.Name, Through: q.Through, Filter: dlq.Filter{MessageIDs: []string{req.Message}}, Limit: 1,
		MaxReplays: s.o.MaxReplays, ResetAttempts: req.ResetAttempts, Parallel: 1,
		IdleTimeout: 5 * time.Second, StallTimeout: time.Minute,
		Change:    func(m *msg.Message) (*msg.Message, error) { return edit.Apply(m, s.o.Now()) },
		Originals: originals,
	}
	req.Redirect.apply(&o)
	if err := o.Validate(); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	if !s.checkTarget(w, r, o) {
		return
	}
	job, release, ok := s.begin(w, q, "edit", "message "+req.Message+targetName(o), who)
	if !ok {
		return
	}
	s.o.Log.Info("console: edit", "dlq", q.Name, "message", req.Message, "who", who, "body", req.Body != nil, "headers", slices.Sorted(maps.Keys(req.Headers)))
	s.start(func() {
		s.replay(q, job, replayRun{
			o: o,
			prepare: func(ctx context.Context) error {
				_, err := s.o.Broker.Originals(ctx, q.Name)
				return err
			},
			account: editAccount(q.Name, originals, targetName(o)),
		}, release)
	})
	writeJSON(w, http.StatusAccepted, job.View(s.o.Now()))
}

// editAccount is an edit's line in the activity list: where the edited
// copy went and where the original is kept, or why nothing moved.
func editAccount(dlqName, originals, redirect string) func(dlq.ReplayResult) (string, error) {
	return func(res dlq.ReplayResult) (string, error) {
		switch {
		case res.Recovered == 1:
			if redirect == "" {
				redirect = " to " + strings.Join(slices.Sorted(maps.Keys(res.ByQueue)), ", ")
			}
			return fmt.Sprintf("edited copy replayed%s; the original is kept in %s", redirect, originals), nil
		case res.KeptWhy[dlq.KeptChange] > 0:
			return "nothing moved", fmt.Errorf("edit refused, the message is still in %s as it was: %s", dlqName, strings.Join(slices.Sorted(maps.Keys(res.Errors)), "; "))
		case res.Kept > 0:
			return "nothing moved", fmt.Errorf("the message stays in %s: %s", dlqName, strings.Join(slices.Sorted(maps.Keys(res.KeptWhy)), "; "))
		case res.Failed+res.Bad > 0:
			return "nothing moved", fmt.Errorf("the edited copy could not be published; the message is still in %s as it was: %s", dlqName, strings.Join(slices.Sorted(maps.Keys(res.Errors)), "; "))
		}
		return "nothing moved", fmt.Errorf("the message is not in %s (replayed or purged since it was opened?)", dlqName)
	}
}

// EditView is what the message view's editor starts from.
type EditView struct {
	ContentType string `json:"contentType"`
	// JSON says the body is checked as JSON (the content type says so).
	JSON bool `json:"json"`
	// Body is the whole body as text (pretty when JSON); BodyEditable is
	// false when the body is not text or is too big to edit, and Why says
	// which.
	Body         string         `json:"body"`
	BodyEditable bool           `json:"bodyEditable"`
	Why          string         `json:"why,omitempty"`
	Headers      map[string]any `json:"headers"`
	// Originals is where the message as it was is kept.
	Originals string `json:"originals"`
}

// editView is the editor's start for m, in the DLQ dlqName.
func editView(dlqName string, m *msg.Message) *EditView {
	v := &EditView{ContentType: m.ContentType, JSON: dlq.IsJSONType(m.ContentType), Headers: dlq.AppHeaders(m), Originals: dlq.OriginalsQueue(dlqName)}
	switch b := renderBody(m.Body, dlq.MaxEditBody); {
	case len(m.Body) > dlq.MaxEditBody:
		v.Why = fmt.Sprintf("the body (%d bytes) is larger than an edit may be (%d bytes); only the headers can be edited", len(m.Body), dlq.MaxEditBody)
	case b.Kind == "binary":
		v.Why = "the body is not text; only the headers can be edited"
	default:
		v.Body, v.BodyEditable = b.Text, true
	}
	return v
}
