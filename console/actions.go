package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
)

// startScan starts a scan of q: one pass over every message present
// (dlq.Browse, so a quorum DLQ is rotated, a classic one handed back in
// place), building a new index. The previous index stays until the scan
// completes. rotate allows the scan of a quorum DLQ (see open). The DLQ is
// opened before startScan returns, so that whoever asked hears of a scan
// refused; the reading goes on in the background unless wait.
func (s *Server) startScan(q *queueState, who string, rotate, wait bool) (*Job, error) {
	job := s.newJob("scan", q.Name, "", who, 0)
	release, err := s.claim(q, job)
	if err != nil {
		job.finish(s.o.Now(), "", err, false)
		return nil, err
	}
	q.mu.Lock()
	q.scan = job
	q.mu.Unlock()
	ctx, cancel := context.WithCancel(s.background())
	job.setCancel(cancel)
	p, err := s.open(ctx, q, rotate)
	if err != nil {
		release()
		job.finish(s.o.Now(), "", err, ctx.Err() != nil)
		cancel()
		return nil, err
	}
	s.o.Log.Info("console: scan", "dlq", q.Name, "who", who, "rotates", p.Rotate != nil)
	run := func() {
		defer cancel()
		s.scan(ctx, q, job, p, release)
	}
	if wait {
		run()
		return job, nil
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		run()
	}()
	return job, nil
}

// scan reads the pass p of q to its end; it releases the DLQ (after
// handing every message back) before it records the end, so that whoever
// sees the scan done may start the next run at once.
func (s *Server) scan(ctx context.Context, q *queueState, job *Job, p dlq.Pass, release func()) {
	job.total.Store(int64(p.Present))
	ix := NewIndex()
	res, err := dlq.Browse(ctx, p.Source, dlq.BrowseOptions{Limit: p.Present, Bound: p.Present, Rotate: p.Rotate}, func(m *msg.Message) error {
		ix.Add(m)
		job.taken.Add(1)
		job.done.Add(1)
		return nil
	})
	p.Close()
	job.taken.Store(int64(res.Taken))
	if err != nil {
		release()
		job.finish(s.o.Now(), fmt.Sprintf("%d of %d read; the previous scan is kept", res.Taken, p.Present), err, ctx.Err() != nil)
		s.o.Log.Warn("console: scan ended early", "dlq", q.Name, "taken", res.Taken, "error", err.Error())
		return
	}
	q.mu.Lock()
	q.index, q.indexAt = ix, s.o.Now()
	q.mu.Unlock()
	release()
	summary := fmt.Sprintf("%d messages in %d groups", ix.Scanned, len(ix.groups))
	if res.Bad > 0 {
		summary += fmt.Sprintf("; %d could not be read (left in the DLQ)", res.Bad)
	}
	job.finish(s.o.Now(), summary, nil, false)
	s.o.Log.Info("console: scan done", "dlq", q.Name, "messages", ix.Scanned, "groups", len(ix.groups), "bad", res.Bad)
}

func (s *Server) postScan(w http.ResponseWriter, r *http.Request) {
	q, ok := s.queue(w, r)
	if !ok {
		return
	}
	rotate, who := s.reader(r)
	job, err := s.startScan(q, "scan "+who, rotate, false)
	switch {
	case errors.Is(err, dlq.ErrRotates):
		httpError(w, s.rotationStatus(), err)
		return
	case errors.Is(err, errBusy), errors.Is(err, errStopping):
		httpError(w, http.StatusConflict, err)
		return
	case err != nil:
		httpError(w, http.StatusBadGateway, err)
		return
	}
	writeJSON(w, http.StatusAccepted, job.View(s.o.Now()))
}

// actionRequest is the body of replay, export and purge: a group of the
// last scan, or one message.
type actionRequest struct {
	Group   string `json:"group"`
	Message string `json:"message"`
	// Rate is the replay rate in messages per second (replay only); nil:
	// the console's default.
	Rate *float64 `json:"rate"`
	// Confirm must be the group's size (purge only).
	Confirm string `json:"confirm"`
	// Batch, when positive, replays that many messages at a time, then
	// waits for Pause (a duration such as "30s"), or for Next when Pause
	// is empty (replay only).
	Batch int    `json:"batch"`
	Pause string `json:"pause"`
	Redirect
}

// between is what a batched replay does between batches: wait pause, or
// the operator's Next when pause is 0; the job shows it waits.
func (s *Server) between(job *Job, pause time.Duration) func(ctx context.Context, recovered int) error {
	return func(ctx context.Context, recovered int) error {
		// A Next sent before this wait is not for it.
		select {
		case <-job.next:
		default:
		}
		job.waiting.Store(true)
		defer job.waiting.Store(false)
		s.o.Log.Info("console: replay between batches", "dlq", job.DLQ, "target", job.Target, "replayed", recovered, "pause", pause.String())
		var timer <-chan time.Time
		if pause > 0 {
			t := time.NewTimer(pause)
			defer t.Stop()
			timer = t.C
		}
		select {
		case <-timer:
		case <-job.next:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}
}

// Redirect sends a replay somewhere else than each message's original
// queue: a queue, or an exchange with a routing key (empty: each
// message's original one). The target is checked to exist before
// anything moves.
type Redirect struct {
	To         string `json:"to"`
	ToExchange string `json:"toExchange"`
	RoutingKey string `json:"routingKey"`
}

// apply sets the replay's destination.
func (d Redirect) apply(o *dlq.ReplayOptions) {
	o.To, o.ToExchange, o.RoutingKey = strings.TrimSpace(d.To), strings.TrimSpace(d.ToExchange), d.RoutingKey
}

// checkTarget answers 400 when the replay o is redirected to a queue or
// exchange that does not exist, before anything is read or moved; ok is
// false then.
func (s *Server) checkTarget(w http.ResponseWriter, r *http.Request, o dlq.ReplayOptions) bool {
	if o.To == "" && o.ToExchange == "" {
		return true
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	if err := s.o.Broker.CheckTarget(ctx, o.ToExchange, o.To); err != nil {
		httpError(w, http.StatusBadRequest, fmt.Errorf("nothing moved: %w", err))
		return false
	}
	return true
}

// targetName names where a replay goes, for the activity list.
func targetName(o dlq.ReplayOptions) string {
	switch {
	case o.ToExchange != "" && o.RoutingKey != "":
		return " to exchange " + o.ToExchange + " with key " + o.RoutingKey
	case o.ToExchange != "":
		return " to exchange " + o.ToExchange
	case o.To != "":
		return " to " + o.To
	}
	return ""
}

// selected is what an action applies to: the filter the dlq run applies,
// its name in the activity list, and the number of messages the last scan
// saw in it.
type selected struct {
	filter dlq.Filter
	name   string
	count  int
}

// selection turns a request into what it selects.
func (s *Server) selection(q *queueState, req actionRequest) (selected, error) {
	switch {
	case req.Group != "" && req.Message != "":
		return selected{}, errors.New("give a group or a message, not both")
	case req.Message != "":
		return selected{dlq.Filter{MessageIDs: []string{req.Message}}, "message " + req.Message, 1}, nil
	case req.Group != "":
		q.mu.Lock()
		ix := q.index
		q.mu.Unlock()
		if ix == nil {
			return selected{}, errors.New("the DLQ has not been scanned yet")
		}
		g, ok := ix.Group(req.Group)
		if !ok {
			return selected{}, fmt.Errorf("no group %q in the last scan (rescanned since?)", req.Group)
		}
		return selected{dlq.Filter{Groups: []dlq.GroupKey{g.Key}}, "group " + g.ID, g.Count}, nil
	}
	return selected{}, errors.New("give a group or a message")
}

// target reads an action's DLQ, request and selection; when one is wrong
// it has answered the request and ok is false.
func (s *Server) target(w http.ResponseWriter, r *http.Request) (q *queueState, req actionRequest, sel selected, ok bool) {
	if q, ok = s.queue(w, r); !ok {
		return nil, req, sel, false
	}
	req, err := readRequest(r)
	if err == nil {
		sel, err = s.selection(q, req)
	}
	if err != nil {
		httpError(w, http.StatusBadRequest, err)
		return nil, req, sel, false
	}
	return q, req, sel, true
}

// begin records an action in the activity list and claims its DLQ; when
// another run holds the DLQ it has answered 409 and ok is false.
func (s *Server) begin(w http.ResponseWriter, q *queueState, kind, target, who string) (job *Job, release func(), ok bool) {
	job = s.newJob(kind, q.Name, target, who, 0)
	release, err := s.claim(q, job)
	if err != nil {
		job.finish(s.o.Now(), "", err, false)
		httpError(w, http.StatusConflict, err)
		return nil, nil, false
	}
	return job, release, true
}

func readRequest(r *http.Request) (actionRequest, error) {
	var req actionRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf("request body: want a JSON object with group or message: %w", err)
	}
	return req, nil
}

func (s *Server) postReplay(w http.ResponseWriter, r *http.Request, who string) {
	q, req, sel, ok := s.target(w, r)
	if !ok {
		return
	}
	filter, target := sel.filter, sel.name
	rate := s.o.Rate
	if req.Rate != nil {
		rate = *req.Rate
	}
	o := dlq.ReplayOptions{
		DLQ: q.Name, Through: q.Through, Filter: filter, Rate: rate, MaxReplays: s.o.MaxReplays,
		Parallel: 64, IdleTimeout: 5 * time.Second, StallTimeout: time.Minute,
	}
	req.Redirect.apply(&o)
	var pause time.Duration
	if req.Batch > 0 && req.Pause != "" {
		d, err := time.ParseDuration(req.Pause)
		if err != nil || d <= 0 {
			httpError(w, http.StatusBadRequest, fmt.Errorf("pause %q: want a positive duration such as 30s, or none to wait for Next", req.Pause))
			return
		}
		pause = d
	}
	o.Batch = req.Batch
	if o.Batch > 0 {
		// Set once the job exists; Validate only needs to see one.
		o.Between = func(context.Context, int) error { return nil }
	}
	if err := o.Validate(); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	if !s.checkTarget(w, r, o) {
		s.o.Log.Info("console: replay refused", "dlq", q.Name, "target", target+targetName(o), "who", who, "why", "destination missing")
		return
	}
	target += targetName(o)
	if o.Batch > 0 {
		wait := "Next"
		if pause > 0 {
			wait = pause.String()
		}
		target += fmt.Sprintf(" in batches of %d (%s between)", o.Batch, wait)
	}
	job, release, ok := s.begin(w, q, "replay", target, who)
	if !ok {
		return
	}
	if o.Batch > 0 {
		job.Batch = o.Batch
		o.Between = s.between(job, pause)
	}
	s.o.Log.Info("console: replay", "dlq", q.Name, "target", target, "rate", rate, "who", who)
	s.start(func() { s.replay(q, job, replayRun{o: o}, release) })
	writeJSON(w, http.StatusAccepted, job.View(s.o.Now()))
}

// start runs fn in the background; Run waits for it when the console
// stops.
func (s *Server) start(fn func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn()
	}()
}

// replayRun is one replay the console makes.
type replayRun struct {
	o dlq.ReplayOptions
	// prepare, when set, runs before the DLQ is opened; an error ends the
	// run before anything is read.
	prepare func(ctx context.Context) error
	// account, when set, turns the run's account into the activity list's
	// summary and error (default: replayAccount).
	account func(res dlq.ReplayResult) (string, error)
}

// replayAccount is a replay's line in the activity list.
func replayAccount(dlqName string) func(dlq.ReplayResult) (string, error) {
	return func(res dlq.ReplayResult) (string, error) {
		summary := fmt.Sprintf("%d replayed, %d failed, %d kept, %d left in place (%s)", res.Recovered, res.Failed, res.Kept, res.Skipped, res.End)
		if res.Failed+res.Bad > 0 {
			return summary, fmt.Errorf("%d message(s) could not be replayed; they are still in %s", res.Failed+res.Bad, dlqName)
		}
		return summary, nil
	}
}

// replay runs dlq.Replay over the DLQ owned exclusively, as hopper dlq
// replay does: each copy published, confirmed, then the original acked;
// the messages outside the selection handed back.
func (s *Server) replay(q *queueState, job *Job, run replayRun, release func()) {
	ctx, cancel := context.WithCancel(s.background())
	defer cancel()
	job.setCancel(cancel)
	o := run.o
	o.RunID = job.RunID
	if run.account == nil {
		run.account = replayAccount(q.Name)
	}
	if run.prepare != nil {
		if err := run.prepare(ctx); err != nil {
			release()
			job.finish(s.o.Now(), "nothing moved", err, ctx.Err() != nil)
			s.o.Log.Warn("console: "+job.Kind+" refused", "dlq", q.Name, "target", job.Target, "who", job.Who, "error", err.Error())
			return
		}
	}
	p, err := s.o.Broker.Own(ctx, q.Name, 2*o.Parallel, o.Parallel)
	if err != nil {
		release()
		job.finish(s.o.Now(), "", err, ctx.Err() != nil)
		s.o.Log.Warn("console: replay refused", "dlq", q.Name, "error", err.Error())
		return
	}
	o.Bound, o.Rotate = p.Present, p.Rotate
	job.total.Store(int64(p.Present))
	o.ProgressEvery = 200 * time.Millisecond
	o.Progress = func(r dlq.ReplayResult) {
		job.taken.Store(int64(r.Taken))
		job.done.Store(int64(r.Recovered))
	}
	res, err := dlq.Replay(ctx, p.Source, p.Pub, o)
	p.Close()
	release()
	q.sampler.Removed(res.Recovered)
	summary, aerr := run.account(res)
	if err == nil {
		err = aerr
	}
	job.finish(s.o.Now(), summary, err, ctx.Err() != nil)
	s.o.Log.Info("console: "+job.Kind+" done", "dlq", q.Name, "target", job.Target, "who", job.Who, "replayed", res.Recovered, "changed", res.Changed, "failed", res.Failed, "kept", res.Kept, "end", res.End)
	s.rescan(q, job.Who)
}

// rescan refreshes the index after an action changed the DLQ.
func (s *Server) rescan(q *queueState, who string) {
	if s.background().Err() != nil {
		return
	}
	if _, err := s.startScan(q, who+" (after an action)", true, true); err != nil {
		s.o.Log.Warn("console: rescan", "dlq", q.Name, "error", err.Error())
	}
}

func (s *Server) postPurge(w http.ResponseWriter, r *http.Request, who string) {
	q, req, sel, ok := s.target(w, r)
	if !ok {
		return
	}
	if req.Group == "" {
		httpError(w, http.StatusBadRequest, errors.New("purge takes a group"))
		return
	}
	filter, target, count := sel.filter, sel.name, sel.count
	if strings.TrimSpace(req.Confirm) != fmt.Sprint(count) {
		s.o.Log.Info("console: purge not confirmed", "dlq", q.Name, "target", target, "typed", req.Confirm, "size", count, "who", who)
		httpError(w, http.StatusBadRequest, fmt.Errorf("confirmation %q is not the group's size %d: nothing purged", req.Confirm, count))
		return
	}
	job, release, ok := s.begin(w, q, "purge", target, who)
	if !ok {
		return
	}
	s.o.Log.Info("console: purge", "dlq", q.Name, "target", target, "confirmed", count, "who", who)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.purge(q, job, filter, count, release)
	}()
	writeJSON(w, http.StatusAccepted, job.View(s.o.Now()))
}

// purge removes at most count messages of the selection: an export with
// removal (dlq.Export) that writes its lines nowhere, over the DLQ owned
// exclusively, so that the messages outside the group are handed back
// exactly as export --remove hands them back.
func (s *Server) purge(q *queueState, job *Job, filter dlq.Filter, count int, release func()) {
	ctx, cancel := context.WithCancel(s.background())
	defer cancel()
	job.setCancel(cancel)
	p, err := s.o.Broker.Own(ctx, q.Name, 200, 0)
	if err != nil {
		release()
		job.finish(s.o.Now(), "", err, ctx.Err() != nil)
		return
	}
	job.total.Store(int64(p.Present))
	res, err := dlq.Export(ctx, p.Source, nowhere{}, dlq.ExportOptions{
		DLQ: q.Name, Bound: p.Present, Filter: filter, Limit: count, Remove: true, Rotate: p.Rotate,
		Progress: func(taken int) { job.taken.Store(int64(taken)) },
	})
	job.done.Store(int64(res.Removed))
	p.Close()
	release()
	q.sampler.Removed(res.Removed)
	job.finish(s.o.Now(), fmt.Sprintf("%d purged, %d left in place", res.Removed, res.Skipped), err, ctx.Err() != nil)
	s.o.Log.Info("console: purge done", "dlq", q.Name, "target", job.Target, "who", job.Who, "purged", res.Removed, "kept", res.Skipped)
	s.rescan(q, job.Who)
}

// nowhere is where a purge's lines go.
type nowhere struct{}

func (nowhere) Write(p []byte) (int, error) { return len(p), nil }
func (nowhere) Sync() error                 { return nil }

// httpSync is an export streamed to the client: Sync flushes what was
// written. Nothing is removed by an export from the console, so nothing
// waits on its durability.
type httpSync struct{ w http.ResponseWriter }

func (h httpSync) Write(p []byte) (int, error) { return h.w.Write(p) }

func (h httpSync) Sync() error {
	if f, ok := h.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

func (s *Server) postExport(w http.ResponseWriter, r *http.Request, who string) {
	q, _, sel, ok := s.target(w, r)
	if !ok {
		return
	}
	filter, target := sel.filter, sel.name
	job, release, ok := s.begin(w, q, "export", target, who)
	if !ok {
		return
	}
	defer release()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	job.setCancel(cancel)
	s.o.Log.Info("console: export", "dlq", q.Name, "target", target, "who", who)
	p, err := s.o.Broker.Browse(ctx, q.Name)
	if err != nil {
		job.finish(s.o.Now(), "", err, false)
		httpError(w, http.StatusBadGateway, err)
		return
	}
	defer p.Close()
	job.total.Store(int64(p.Present))
	name := strings.NewReplacer("/", "_", `"`, "_", "\\", "_").Replace(q.Name + "-" + strings.ReplaceAll(target, " ", "-") + ".jsonl")
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Content-Disposition", `attachment; filename="`+name+`"`)
	res, err := dlq.Export(ctx, p.Source, httpSync{w}, dlq.ExportOptions{
		DLQ: q.Name, Bound: p.Present, Filter: filter, Rotate: p.Rotate,
		Progress: func(taken int) { job.taken.Store(int64(taken)) },
	})
	job.done.Store(int64(res.Exported))
	if err != nil && res.Bytes == 0 {
		// Nothing was sent yet: the answer can still say what failed.
		w.Header().Del("Content-Disposition")
		httpError(w, http.StatusBadGateway, err)
	}
	job.finish(s.o.Now(), fmt.Sprintf("%d exported (%d bytes)", res.Exported, res.Bytes), err, ctx.Err() != nil)
	s.o.Log.Info("console: export done", "dlq", q.Name, "target", target, "who", who, "exported", res.Exported, "bytes", res.Bytes)
}

// ignoreRequest is the body of marking a group ignored or not.
type ignoreRequest struct {
	Ignored bool `json:"ignored"`
}

// postIgnore marks a group ignored (it stays in the DLQ, out of the
// overview's attention figure) or not. The mark is stored on the broker,
// beside the DLQ, before it is shown (see Broker.ChangeMarks), by group
// id, so it holds across rescans, restarts of the console and every
// console of the DLQ. A mark that could not be stored is an error: the
// operator would otherwise see a mark that the next console forgets.
func (s *Server) postIgnore(w http.ResponseWriter, r *http.Request, who string) {
	q, ok := s.queue(w, r)
	if !ok {
		return
	}
	var req ignoreRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 4<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		httpError(w, http.StatusBadRequest, fmt.Errorf("request body: want {\"ignored\": true or false}: %w", err))
		return
	}
	id := r.PathValue("group")
	q.mu.Lock()
	ix := q.index
	q.mu.Unlock()
	g, found := Group{}, false
	if ix != nil {
		g, found = ix.Group(id)
	}
	if !found {
		httpError(w, http.StatusNotFound, fmt.Errorf("no group %q in the last scan (rescanned since?)", id))
		return
	}
	kind := "ignore"
	if !req.Ignored {
		kind = "unignore"
	}
	job := s.newJob(kind, q.Name, "group "+id, who, g.Count)
	now := s.o.Now()
	ctx, cancel := context.WithTimeout(r.Context(), marksTimeout)
	defer cancel()
	marks, err := s.o.Broker.ChangeMarks(ctx, q.Name, who, func(m *dlq.Marks) {
		if req.Ignored {
			m.Ignored[id] = dlq.Mark{By: who, At: now.UTC(), Messages: g.Count}
		} else {
			delete(m.Ignored, id)
		}
	})
	if err != nil {
		err = fmt.Errorf("the mark was not stored, nothing changed: %w", err)
		job.finish(s.o.Now(), "", err, false)
		s.o.Log.Warn("console: "+kind+" failed", "dlq", q.Name, "group", id, "messages", g.Count, "who", who, "error", err.Error())
		httpError(w, http.StatusBadGateway, err)
		return
	}
	q.mu.Lock()
	q.setMarks(marks)
	q.mu.Unlock()
	job.done.Store(int64(g.Count))
	job.finish(s.o.Now(), fmt.Sprintf("%d message(s) %s", g.Count, map[bool]string{true: "ignored: they stay in the DLQ, out of the attention figure", false: "counted again"}[req.Ignored]), nil, false)
	s.o.Log.Info("console: "+kind, "dlq", q.Name, "group", id, "messages", g.Count, "who", who, "marks", dlq.MarksQueue(q.Name))
	writeJSON(w, http.StatusOK, s.view(job, s.o.Now()))
}
