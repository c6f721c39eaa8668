package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/dlq"
)

// markStore is a Broker that keeps marks the way the broker does for
// every console given it: one set per DLQ, changed only as a whole. fail
// makes reads or changes fail.
type markStore struct {
	depths
	mu                    sync.Mutex
	sets                  map[string]dlq.Marks
	failRead, failChange  error
	reads, changes, calls int
}

func newMarkStore() *markStore {
	return &markStore{depths: depths{n: map[string]int{}}, sets: map[string]dlq.Marks{}}
}

func (b *markStore) Marks(_ context.Context, q string) (dlq.Marks, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reads++
	if b.failRead != nil {
		return dlq.Marks{}, b.failRead
	}
	m, ok := b.sets[q]
	if !ok {
		m, _ = dlq.LatestMarks(q, nil)
	}
	return m.Clone(), nil
}

func (b *markStore) ChangeMarks(ctx context.Context, q, who string, change func(*dlq.Marks)) (dlq.Marks, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.changes++
	if b.failChange != nil {
		return dlq.Marks{}, b.failChange
	}
	old, ok := b.sets[q]
	if !ok {
		old, _ = dlq.LatestMarks(q, nil)
	}
	n := old.Next(t0, who, change)
	b.sets[q] = n
	return n.Clone(), nil
}

// markConsole is a console over a.dlq whose last scan found groups of 4
// and 2 messages; it returns the server and the two group ids, largest
// first.
func markConsole(t *testing.T, b Broker, log *bytes.Buffer) (*Server, string, string) {
	t.Helper()
	lg := slog.New(slog.DiscardHandler)
	if log != nil {
		lg = slog.New(slog.NewTextHandler(log, nil))
	}
	s, err := New(Options{DLQs: []DLQ{{Name: "a.dlq"}}, Broker: b, AllowActions: true, Tokens: []Token{{Label: "oncall", Secret: "marks-token-0123456789"}}, Log: lg, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	ix := NewIndex()
	for i := range 4 {
		ix.Add(dead("s"+string(rune('0'+i)), "orders", "order.created", "max-attempts", 503, "upstream answered 503", t0))
	}
	for i := range 2 {
		ix.Add(dead("v"+string(rune('0'+i)), "orders", "order.paid", "non-retriable", 422, "amount must be positive", t0))
	}
	q := s.queues["a.dlq"]
	q.index, q.indexAt = ix, t0
	gs := ix.Groups()
	return s, gs[0].ID, gs[1].ID
}

func postMark(t *testing.T, s *Server, group string, ignored bool, token string) (int, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]bool{"ignored": ignored})
	req := httptest.NewRequest("POST", "/api/dlqs/a.dlq/groups/"+group+"/ignore", bytes.NewReader(body))
	req.Host = "localhost:8089"
	req.Header.Set(APIHeader, "1")
	if token != "" {
		req.Header.Set(TokenHeader, token)
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

func overviewOf(t *testing.T, s *Server) Overview {
	t.Helper()
	req := httptest.NewRequest("GET", "/api/overview", nil)
	req.Host = "localhost:8089"
	req.Header.Set(APIHeader, "1")
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	var page overviewPage
	if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil || len(page.DLQs) != 1 {
		t.Fatalf("overview: %v %s", err, rec.Body)
	}
	return page.DLQs[0]
}

// TestIgnoreIsStoredOnTheBroker: a mark goes to the broker's store with
// who made it, and a second console over the same store (a restart, or
// another console of the DLQ) reads it and leaves the group out of the
// attention figure; unmarking removes it from the store.
func TestIgnoreIsStoredOnTheBroker(t *testing.T) {
	b := newMarkStore()
	var log bytes.Buffer
	s, big, _ := markConsole(t, b, &log)
	if code, body := postMark(t, s, big, true, "marks-token-0123456789"); code != http.StatusOK {
		t.Fatalf("ignore: %d %s", code, body)
	}
	stored := b.sets["a.dlq"]
	if m, ok := stored.Ignored[big]; !ok || !strings.HasPrefix(m.By, "oncall from ") || m.Messages != 4 || stored.Seq != 1 {
		t.Fatalf("stored marks %+v", stored)
	}
	if ov := overviewOf(t, s); ov.Attention != 2 || ov.Ignored != 4 {
		t.Errorf("this console: attention %d ignored %d, want 2 and 4", ov.Attention, ov.Ignored)
	}
	if !strings.Contains(log.String(), "console: ignore") || !strings.Contains(log.String(), "a.dlq.console-marks") {
		t.Errorf("not logged:\n%s", log.String())
	}

	other, _, _ := markConsole(t, b, nil)
	if ov := overviewOf(t, other); ov.Ignored != 0 {
		t.Fatalf("a console that has not read the marks counts %d ignored", ov.Ignored)
	}
	other.readMarks(context.Background())
	if ov := overviewOf(t, other); ov.Attention != 2 || ov.Ignored != 4 || ov.MarksError != "" {
		t.Errorf("other console: %+v, want attention 2, ignored 4", ov)
	}

	if code, body := postMark(t, other, big, false, "marks-token-0123456789"); code != http.StatusOK {
		t.Fatalf("unignore: %d %s", code, body)
	}
	if n := len(b.sets["a.dlq"].Ignored); n != 0 || b.sets["a.dlq"].Seq != 2 {
		t.Errorf("after unignore the store holds %+v", b.sets["a.dlq"])
	}
	s.readMarks(context.Background())
	if ov := overviewOf(t, s); ov.Attention != 6 || ov.Ignored != 0 {
		t.Errorf("first console after the other unignored: %+v", ov)
	}
}

// TestIgnoreNotStoredIsAnError: a mark the broker did not store is
// refused (502) with the reason, recorded as a failed action, logged, and
// not shown: the group is still counted.
func TestIgnoreNotStoredIsAnError(t *testing.T) {
	b := newMarkStore()
	b.failChange = errors.New("connect to broker: connection refused")
	var log bytes.Buffer
	s, big, _ := markConsole(t, b, &log)
	code, body := postMark(t, s, big, true, "marks-token-0123456789")
	if code != http.StatusBadGateway || !strings.Contains(body, "not stored") || !strings.Contains(body, "connection refused") {
		t.Fatalf("ignore with the broker down: %d %s", code, body)
	}
	if ov := overviewOf(t, s); ov.Ignored != 0 || ov.Attention != 6 {
		t.Errorf("a mark that was not stored shows: %+v", ov)
	}
	s.mu.Lock()
	jobs := s.jobs
	s.mu.Unlock()
	if len(jobs) != 1 || jobs[0].View(t0).State != StateFailed || jobs[0].Kind != "ignore" {
		t.Errorf("activity: %+v", jobs)
	}
	if !strings.Contains(log.String(), "console: ignore failed") {
		t.Errorf("failure not logged:\n%s", log.String())
	}
}

// TestIgnoreNeedsTheToken: marking keeps the actions' rules: no token, no
// change reaches the store; a read-only console refuses it.
func TestIgnoreNeedsTheToken(t *testing.T) {
	b := newMarkStore()
	s, big, _ := markConsole(t, b, nil)
	if code, _ := postMark(t, s, big, true, ""); code != http.StatusUnauthorized {
		t.Errorf("without the token: %d, want 401", code)
	}
	if code, _ := postMark(t, s, big, true, "wrong-token-0123456789"); code != http.StatusUnauthorized {
		t.Errorf("with a wrong token: %d, want 401", code)
	}
	s.o.AllowActions = false
	if code, _ := postMark(t, s, big, true, "marks-token-0123456789"); code != http.StatusForbidden {
		t.Errorf("read-only console: %d, want 403", code)
	}
	if b.changes != 0 {
		t.Errorf("%d change(s) reached the store", b.changes)
	}
}

// TestMarksReadFailureKeepsWhatWasRead: a read that fails keeps the marks
// read before and says why on the overview; the next good read clears it.
func TestMarksReadFailureKeepsWhatWasRead(t *testing.T) {
	b := newMarkStore()
	s, big, _ := markConsole(t, b, nil)
	if code, body := postMark(t, s, big, true, "marks-token-0123456789"); code != http.StatusOK {
		t.Fatalf("ignore: %d %s", code, body)
	}
	b.failRead = errors.New("queue a.dlq.console-marks is in exclusive use")
	s.readMarks(context.Background())
	ov := overviewOf(t, s)
	if ov.Ignored != 4 || !strings.Contains(ov.MarksError, "exclusive use") {
		t.Errorf("after a failed read: %+v", ov)
	}
	b.failRead = nil
	s.readMarks(context.Background())
	if ov := overviewOf(t, s); ov.Ignored != 4 || ov.MarksError != "" {
		t.Errorf("after a good read: %+v", ov)
	}
}

// TestMarksReadDoesNotUndoAChange: a read that began before this
// console's own change ended is not applied over it.
func TestMarksReadDoesNotUndoAChange(t *testing.T) {
	b := &slowRead{markStore: newMarkStore(), started: make(chan struct{}), release: make(chan struct{})}
	s, big, _ := markConsole(t, b, nil)
	done := make(chan struct{})
	go func() { defer close(done); s.readMarks(context.Background()) }()
	<-b.started
	if code, body := postMark(t, s, big, true, "marks-token-0123456789"); code != http.StatusOK {
		t.Fatalf("ignore: %d %s", code, body)
	}
	close(b.release)
	<-done
	if ov := overviewOf(t, s); ov.Ignored != 4 {
		t.Errorf("a read older than the change undid it: %+v", ov)
	}
}

// slowRead returns the marks as they were when the read began, once
// released.
type slowRead struct {
	*markStore
	started, release chan struct{}
}

func (b *slowRead) Marks(ctx context.Context, q string) (dlq.Marks, error) {
	m, err := b.markStore.Marks(ctx, q)
	close(b.started)
	<-b.release
	return m, err
}
