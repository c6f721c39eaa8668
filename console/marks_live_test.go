package console_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/console"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// overviewNow is the env's console's overview of its DLQ.
func (e *env) overviewNow() console.Overview {
	e.t.Helper()
	var ov struct {
		DLQs []console.Overview `json:"dlqs"`
	}
	if code := e.call("GET", "/api/overview", nil, nil, &ov); code != http.StatusOK || len(ov.DLQs) != 1 {
		e.t.Fatalf("overview: %d %+v", code, ov)
	}
	return ov.DLQs[0]
}

// settled waits until the env's console has scanned the DLQ, is idle, and
// shows ignored messages as want.
func (e *env) settled(scanned, ignored int) console.Overview {
	e.t.Helper()
	var ov console.Overview
	waitfor.Until(e.t, time.Minute, "the console to show its scan and marks", func() bool {
		ov = e.overviewNow()
		return ov.Busy == nil && ov.Scanned == scanned && ov.Ignored == ignored
	})
	return ov
}

// mark marks a group ignored or not, and returns the status.
func (e *env) mark(group string, ignored bool) int {
	e.t.Helper()
	var job console.JobView
	return e.call("POST", e.path("/groups/"+group+"/ignore"), map[string]bool{"ignored": ignored}, withToken, &job)
}

// TestLiveIgnoredMarksOutliveTheConsole: on a real broker, a group marked
// ignored stays ignored, and out of the attention figure, for a console
// started after the one that marked it was stopped, and for a console
// running beside it; unmarked, it is gone for the next console too. The
// marks are one message in <dlq>.console-marks; the DLQ keeps every
// message throughout.
func TestLiveIgnoredMarksOutliveTheConsole(t *testing.T) {
	e := newEnv(t, false)
	ids := e.fill(threeKinds)
	all := sorted(ids["svc"], ids["val"], ids["exp"])
	scanAtStart := func(o *console.Options) { o.ScanOnStart = true }
	marksQueue := dlq.MarksQueue(e.DLQ)

	first := e.launch(true, scanAtStart)
	e.use(first)
	e.settled(9, 0)
	if _, err := e.rb.QueueDepth(marksQueue); err == nil {
		t.Fatalf("%s exists before anything was marked", marksQueue)
	}
	var page groupsPage
	e.call("GET", e.path("/groups"), nil, nil, &page)
	big := page.Groups[0]
	if big.Count != 4 {
		t.Fatalf("largest group %+v", big)
	}
	if code := e.mark(big.ID, true); code != http.StatusOK {
		t.Fatalf("ignore: %d", code)
	}
	if ov := e.settled(9, 4); ov.Attention != 5 {
		t.Fatalf("attention %d after ignoring 4 of 9", ov.Attention)
	}
	if n, err := e.rb.QueueDepth(marksQueue); err != nil || n != 1 {
		t.Fatalf("%s holds %d (%v), want the one set of marks", marksQueue, n, err)
	}

	// A second console beside the first sees the mark.
	beside := e.launch(true, scanAtStart)
	e.use(beside)
	if ov := e.settled(9, 4); ov.Attention != 5 || ov.MarksError != "" {
		t.Fatalf("console beside: %+v", ov)
	}
	page = groupsPage{}
	e.call("GET", e.path("/groups"), nil, nil, &page)
	if g := page.Groups[0]; g.ID != big.ID || !g.Ignored || !strings.HasPrefix(g.IgnoredBy, "tester from ") || g.IgnoredAt.IsZero() {
		t.Errorf("group as the console beside shows it: %+v", g)
	}

	// Both stopped; a new console reads the mark from the broker.
	first.stop()
	beside.stop()
	again := e.launch(true, scanAtStart)
	e.use(again)
	if ov := e.settled(9, 4); ov.Attention != 5 {
		t.Fatalf("after a restart: %+v", ov)
	}
	if got := e.contents(e.DLQ); !slices.Equal(got, all) {
		t.Fatalf("DLQ = %v, want every message", got)
	}

	// Unmarked by one console, gone for one running beside it at its next
	// sample, and for the next console.
	watcher := e.launch(false, scanAtStart)
	e.use(watcher)
	e.settled(9, 4)
	e.use(again)
	if code := e.mark(big.ID, false); code != http.StatusOK {
		t.Fatalf("unignore: %d", code)
	}
	e.use(watcher)
	if ov := e.settled(9, 0); ov.Attention != 9 {
		t.Fatalf("console beside after unignore: %+v", ov)
	}
	again.stop()
	watcher.stop()
	e.use(e.launch(true, scanAtStart))
	if ov := e.settled(9, 0); ov.Attention != 9 {
		t.Fatalf("after unignore and a restart: %+v", ov)
	}
	if n, err := e.rb.QueueDepth(marksQueue); err != nil || n != 1 {
		t.Errorf("%s holds %d (%v), want the one (empty) set", marksQueue, n, err)
	}
	if got := e.contents(e.DLQ); !slices.Equal(got, all) {
		t.Fatalf("DLQ = %v, want every message", got)
	}
}

// TestLiveIgnoreNotStored: a mark the broker cannot store (its marks
// queue holds something that is not a set of marks, which the console
// will not write over) is refused with the reason and not shown; the
// overview says why the marks cannot be read.
func TestLiveIgnoreNotStored(t *testing.T) {
	e := newEnv(t, false)
	e.fill(threeKinds)
	e.start(true, func(o *console.Options) { o.ScanOnStart = true })
	e.settled(9, 0)
	var page groupsPage
	e.call("GET", e.path("/groups"), nil, nil, &page)
	// Declared by a first mark, then given a stranger's message.
	if code := e.mark(page.Groups[1].ID, true); code != http.StatusOK {
		t.Fatalf("ignore: %d", code)
	}
	e.settled(9, 3)
	if err := e.pub.Publish(context.Background(), dlq.MarksQueue(e.DLQ), &msg.Message{MessageID: "stranger", Headers: map[string]any{}, Body: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	var res struct {
		Error string `json:"error"`
	}
	code := e.call("POST", e.path("/groups/"+page.Groups[0].ID+"/ignore"), map[string]bool{"ignored": true}, withToken, &res)
	if code != http.StatusBadGateway {
		t.Fatalf("ignore over a stranger's message: %d, want 502", code)
	}
	var ov console.Overview
	waitfor.Until(t, 30*time.Second, "the overview to say why the marks cannot be read", func() bool {
		ov = e.overviewNow()
		return strings.Contains(ov.MarksError, "not a set of console marks")
	})
	if ov.Ignored != 3 {
		t.Errorf("ignored %d: want the 3 of the mark stored before, and not the refused one", ov.Ignored)
	}
	var jobs struct {
		Jobs []console.JobView `json:"jobs"`
	}
	e.call("GET", "/api/jobs", nil, nil, &jobs)
	if !slices.ContainsFunc(jobs.Jobs, func(j console.JobView) bool {
		return j.Kind == "ignore" && j.State == console.StateFailed && strings.Contains(j.Error, "not stored")
	}) {
		t.Errorf("activity has no failed ignore: %+v", jobs.Jobs)
	}
}
