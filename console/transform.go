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

// Fix a whole group: a transformation (dlq.Transform) applied to every
// message of a group before it is replayed, by the same run as a replay. A
// preview shows the first messages before and after; a dry run counts what
// it would change and where it fails, and moves nothing. A message the
// transformation fails on stays in the DLQ as it was.

// previewSize is how many messages a preview shows.
const previewSize = 5

// transformRequest is the body of a transformation, its preview and its
// dry run.
type transformRequest struct {
	Group   string          `json:"group"`
	Message string          `json:"message"`
	Patch   json.RawMessage `json:"patch"`
	DryRun  bool            `json:"dryRun"`
	// KeepOriginals publishes each message as it was to the originals
	// queue before its changed copy.
	KeepOriginals bool     `json:"keepOriginals"`
	Rate          *float64 `json:"rate"`
	Redirect
}

// readTransform reads a transformation request and what it selects; when
// one is wrong it has answered 400 and ok is false.
func (s *Server) readTransform(w http.ResponseWriter, r *http.Request, q *queueState) (req transformRequest, tr *dlq.Transform, sel selected, ok bool) {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	if err != nil {
		err = fmt.Errorf("request body: want a JSON object with group or message and patch: %w", err)
	}
	if err == nil {
		if len(req.Patch) == 0 {
			err = errors.New("give the transformation (patch: a JSON Patch)")
		} else {
			tr, err = dlq.ParseTransform(req.Patch)
		}
	}
	if err == nil {
		sel, err = s.selection(q, actionRequest{Group: req.Group, Message: req.Message})
	}
	if err != nil {
		httpError(w, http.StatusBadRequest, err)
		return req, nil, sel, false
	}
	label, _ := s.token(r.Header.Get(TokenHeader))
	tr.By = label
	return req, tr, sel, true
}

func (s *Server) postTransformPreview(w http.ResponseWriter, r *http.Request, who string) {
	q, ok := s.queue(w, r)
	if !ok {
		return
	}
	_, tr, sel, ok := s.readTransform(w, r, q)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Minute)
	defer cancel()
	first, err := s.firstOf(ctx, q, sel.filter, previewSize, true)
	switch {
	case errors.Is(err, errBusy):
		httpError(w, http.StatusConflict, err)
		return
	case err != nil:
		httpError(w, http.StatusBadGateway, err)
		return
	}
	out := make([]dlq.Change, 0, len(first))
	for _, m := range first {
		out = append(out, tr.Preview(m, s.o.Now()))
	}
	s.o.Log.Info("console: transformation preview", "dlq", q.Name, "target", sel.name, "who", who, "patch", tr.Text)
	writeJSON(w, http.StatusOK, map[string]any{"target": sel.name, "count": sel.count, "previews": out})
}

// firstOf reads the first n messages of q the filter selects, removing
// nothing: a pass over the DLQ (as peek makes) that stops once it has them
// on a classic DLQ, and goes round the whole of a quorum one, which must
// keep its order. rotate allows reading a quorum DLQ (see open).
func (s *Server) firstOf(ctx context.Context, q *queueState, f dlq.Filter, n int, rotate bool) ([]*msg.Message, error) {
	release, err := s.claim(q, nil)
	if err != nil {
		return nil, err
	}
	defer release()
	p, err := s.open(ctx, q, rotate)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	var out []*msg.Message
	now := s.o.Now()
	_, err = dlq.Browse(ctx, p.Source, dlq.BrowseOptions{Limit: p.Present, Bound: p.Present, Rotate: p.Rotate}, func(m *msg.Message) error {
		if len(out) < n {
			if ok, _ := f.Match(m, now); ok {
				out = append(out, m.Clone())
			}
		}
		if len(out) == n && p.Rotate == nil {
			return errFound
		}
		return nil
	})
	if err != nil && !errors.Is(err, errFound) {
		return nil, err
	}
	return out, nil
}

func (s *Server) postTransform(w http.ResponseWriter, r *http.Request, who string) {
	q, ok := s.queue(w, r)
	if !ok {
		return
	}
	req, tr, sel, ok := s.readTransform(w, r, q)
	if !ok {
		return
	}
	rate := s.o.Rate
	if req.Rate != nil {
		rate = *req.Rate
	}
	o := dlq.ReplayOptions{
		DLQ: q.Name, Through: q.Through, Filter: sel.filter, Rate: rate, MaxReplays: s.o.MaxReplays, DryRun: req.DryRun,
		Parallel: 64, IdleTimeout: 5 * time.Second, StallTimeout: time.Minute,
		Change: func(m *msg.Message) (*msg.Message, error) { return tr.Apply(m, s.o.Now()) },
	}
	if req.KeepOriginals {
		o.Originals = dlq.OriginalsQueue(q.Name)
	}
	req.Redirect.apply(&o)
	if err := o.Validate(); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	if !s.checkTarget(w, r, o) {
		return
	}
	kind := "transform"
	if req.DryRun {
		kind = "transform (dry run)"
	}
	job, release, ok := s.begin(w, q, kind, sel.name+targetName(o), who)
	if !ok {
		return
	}
	s.o.Log.Info("console: "+kind, "dlq", q.Name, "target", job.Target, "who", who, "patch", tr.Text, "keepOriginals", req.KeepOriginals, "rate", rate)
	run := replayRun{o: o, account: transformAccount(q.Name, req.DryRun)}
	if o.Originals != "" && !o.DryRun {
		run.prepare = func(ctx context.Context) error {
			_, err := s.o.Broker.Originals(ctx, q.Name)
			return err
		}
	}
	s.start(func() { s.replay(q, job, run, release) })
	writeJSON(w, http.StatusAccepted, job.View(s.o.Now()))
}

// transformAccount is a transformation's line in the activity list.
func transformAccount(dlqName string, dryRun bool) func(dlq.ReplayResult) (string, error) {
	return func(res dlq.ReplayResult) (string, error) {
		refused := res.KeptWhy[dlq.KeptChange]
		why := ""
		if refused > 0 {
			why = fmt.Sprintf("; the transformation fails on %d, left in %s as they were (%s)", refused, dlqName, strings.Join(slices.Sorted(maps.Keys(res.Errors)), "; "))
		}
		if dryRun {
			return fmt.Sprintf("would replay %d, would change %d%s; %d kept, %d left in place; nothing moved (dry run)",
				res.WouldRecover, res.Changed, why, res.Kept-refused, res.Skipped), nil
		}
		summary := fmt.Sprintf("%d replayed, %d changed%s; %d failed, %d kept, %d left in place (%s)",
			res.Recovered, res.Changed, why, res.Failed, res.Kept-refused, res.Skipped, res.End)
		if res.Failed+res.Bad > 0 {
			return summary, fmt.Errorf("%d message(s) could not be replayed; they are still in %s", res.Failed+res.Bad, dlqName)
		}
		return summary, nil
	}
}
