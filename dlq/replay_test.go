package dlq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

func opts(bound int) ReplayOptions {
	return ReplayOptions{DLQ: "orders.dlq", Bound: bound, IdleTimeout: 50 * time.Millisecond, StallTimeout: 5 * time.Second, Now: func() time.Time { return t0 }}
}

func replay(t *testing.T, q *fakeQueue, p *fakePub, o ReplayOptions) (ReplayResult, error) {
	t.Helper()
	res, err := Replay(context.Background(), q, p, o)
	q.Close()
	return res, err
}

// accounted checks that every message taken is counted exactly once.
func accounted(t *testing.T, r ReplayResult) {
	t.Helper()
	if sum := r.Recovered + r.WouldRecover + r.Failed + r.Kept + r.Skipped; sum != r.Taken {
		t.Errorf("taken %d but recovered+would+failed+kept+skipped = %d: %+v", r.Taken, sum, r)
	}
}

func TestReplayMovesKeepsAndCounts(t *testing.T) {
	a := dead("a", "orders", "order.created", "max-attempts", 503, time.Hour)
	a.Headers[msg.HeaderRetryCount] = int32(10)
	b := dead("b", "billing", "bill", "non-retriable", 404, time.Hour)
	c := &msg.Message{MessageID: "c", Headers: map[string]any{}} // dead-lettered by the broker, not Hopper
	d := dead("d", "orders", "order.created", "max-attempts", 503, time.Hour)
	d.Headers[msg.HeaderReplayCount] = int32(5)
	q := newFakeQueue(t, a, b, c, d)
	p := newFakePub()
	o := opts(4)
	o.MaxReplays = 5
	res, err := replay(t, q, p, o)
	if err != nil {
		t.Fatal(err)
	}
	accounted(t, res)
	if res.Recovered != 2 || res.Kept != 2 || res.Failed != 0 || res.End != EndDone {
		t.Fatalf("result %+v", res)
	}
	if res.KeptWhy[KeptNoDestination] != 1 || res.KeptWhy[KeptMaxReplays] != 1 {
		t.Errorf("kept why %v", res.KeptWhy)
	}
	if got := res.ByQueue["orders"]; got.Recovered != 1 || got.Kept != 1 {
		t.Errorf("orders %+v", got)
	}
	if got := res.ByQueue[Unknown]; got == nil || got.Kept != 1 {
		t.Errorf("unknown %+v", got)
	}
	if ids := q.ids(); !slices.Equal(ids, []string{"c", "d"}) {
		t.Errorf("DLQ after = %v, want [c d] in place", ids)
	}
	if ids := p.idsIn("orders"); !slices.Equal(ids, []string{"a"}) {
		t.Errorf("orders got %v", ids)
	}
	cp := p.confirmed["orders"][0]
	for _, h := range []string{msg.HeaderDeadLetterReason, msg.HeaderDeadLetterTime, msg.HeaderFinalStatusCode, msg.HeaderFinalError, msg.HeaderFinalRetryCount} {
		if _, ok := cp.Headers[h]; ok {
			t.Errorf("copy still has %s", h)
		}
	}
	if cp.Headers[msg.HeaderReplayCount] != int64(1) || cp.Headers[msg.HeaderReplayedFrom] != "orders.dlq" || cp.Headers[msg.HeaderRetryCount] != int32(10) {
		t.Errorf("copy headers %v", cp.Headers)
	}
	if cp.Headers[msg.HeaderOriginalQueue] != "orders" || cp.Headers[msg.HeaderOriginalRoutingKey] != "order.created" {
		t.Errorf("the original queue and routing key must stay pinned: %v", cp.Headers)
	}
	if a.Headers[msg.HeaderReplayCount] != nil || a.Headers[msg.HeaderDeadLetterReason] == nil {
		t.Error("the original message was modified")
	}
}

func TestReplayAcksOnlyAfterConfirm(t *testing.T) {
	var ms []*msg.Message
	for i := range 50 {
		ms = append(ms, dead(fmt.Sprint(i), "orders", "k", "max-attempts", 500, time.Minute))
	}
	q := newFakeQueue(t, ms...)
	p := newFakePub()
	p.delay = time.Millisecond
	var acks atomic.Int64
	q.onAck = func(m *msg.Message) {
		acks.Add(1)
		if !p.confirmedID(m.MessageID) {
			t.Errorf("message %s acked before its copy was confirmed", m.MessageID)
		}
	}
	o := opts(50)
	o.Parallel = 8
	res, err := replay(t, q, p, o)
	if err != nil || res.Recovered != 50 || acks.Load() != 50 {
		t.Fatalf("err=%v res=%+v acks=%d", err, res, acks.Load())
	}
	if len(q.ids()) != 0 {
		t.Errorf("DLQ not empty: %v", q.ids())
	}
}

func TestReplayFailedPublishStaysInPlace(t *testing.T) {
	q := newFakeQueue(t,
		dead("1", "orders", "k", "max-attempts", 500, time.Minute),
		dead("2", "gone", "k", "max-attempts", 500, time.Minute),
		dead("3", "orders", "k", "max-attempts", 500, time.Minute),
		dead("4", "gone", "k", "max-attempts", 500, time.Minute),
	)
	p := newFakePub()
	p.fail = func(queue string, _ *msg.Message) error {
		if queue == "gone" {
			return fmt.Errorf("publish to %q: %w", queue, errRefused)
		}
		return nil
	}
	res, err := replay(t, q, p, opts(4))
	if err != nil {
		t.Fatal(err)
	}
	accounted(t, res)
	if res.Recovered != 2 || res.Failed != 2 || res.ByQueue["gone"].Failed != 2 {
		t.Fatalf("%+v", res)
	}
	if res.Errors[`publish to "gone": refused`] != 2 {
		t.Errorf("errors %v", res.Errors)
	}
	if ids := q.ids(); !slices.Equal(ids, []string{"2", "4"}) {
		t.Errorf("DLQ after = %v", ids)
	}
	var sum strings.Builder
	if err := res.WriteSummary(&sum); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"recovered", "failed", "gone", "refused"} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, sum.String())
		}
	}
}

// A replayed message that fails again at once comes back to the DLQ behind
// the others. The run must not take it again: it handles only the
// messages present at start.
func TestReplayBoundedWhenCopiesComeBack(t *testing.T) {
	const n = 20
	var ms []*msg.Message
	for i := range n {
		ms = append(ms, dead(fmt.Sprint(i), "orders", "k", "max-attempts", 500, time.Minute))
	}
	q := newFakeQueue(t, ms...)
	p := newFakePub()
	p.after = func(queue string, m *msg.Message) {
		back := m.Clone()
		*back = *msg.DLQCopy(back, msg.Info{Queue: queue}, msg.DeadLetter{Reason: "max-attempts", Status: 500, Now: t0})
		q.push(back)
	}
	o := opts(n)
	o.Parallel = 4
	res, err := replay(t, q, p, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Recovered != n || res.Taken != n {
		t.Fatalf("%+v", res)
	}
	seen := map[string]int{}
	for _, id := range p.idsIn("orders") {
		seen[id]++
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("message %s replayed %d times in one run", id, c)
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.ready) != n {
		t.Fatalf("DLQ holds %d, want the %d that came back", len(q.ready), n)
	}
	for _, e := range q.ready {
		if msg.ReplayCount(e.m) != 1 {
			t.Errorf("message %s has x-replay-count %d", e.m.MessageID, msg.ReplayCount(e.m))
		}
	}
}

// A message that always fails is not replayed for ever (the replay cap).
func TestReplayCapStopsTheLoop(t *testing.T) {
	q := newFakeQueue(t, dead("loop", "orders", "k", "max-attempts", 500, time.Minute))
	p := newFakePub()
	p.after = func(queue string, m *msg.Message) {
		back := m.Clone()
		*back = *msg.DLQCopy(back, msg.Info{Queue: queue}, msg.DeadLetter{Reason: "max-attempts", Now: t0})
		q.push(back)
	}
	o := opts(1)
	o.MaxReplays = 3
	for run := 1; run <= 5; run++ {
		res, err := Replay(context.Background(), q, p, o)
		q.Close()
		if err != nil {
			t.Fatal(err)
		}
		wantRecovered := 0
		if run <= 3 {
			wantRecovered = 1
		}
		if res.Recovered != wantRecovered || res.Kept != 1-wantRecovered {
			t.Fatalf("run %d: %+v", run, res)
		}
	}
	if n := len(p.idsIn("orders")); n != 3 {
		t.Fatalf("replayed %d times, want 3", n)
	}
}

func TestReplayLimitIsACap(t *testing.T) {
	var ms []*msg.Message
	for i := range 10 {
		ms = append(ms, dead(fmt.Sprint(i), "orders", "k", "max-attempts", 500, time.Minute))
	}
	q := newFakeQueue(t, ms...)
	p := newFakePub()
	p.delay = 5 * time.Millisecond
	o := opts(10)
	o.Limit = 3
	o.Parallel = 8
	res, err := replay(t, q, p, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Recovered != 3 || res.End != EndLimit {
		t.Fatalf("%+v", res)
	}
	if ids := q.ids(); !slices.Equal(ids, []string{"3", "4", "5", "6", "7", "8", "9"}) {
		t.Errorf("DLQ after = %v", ids)
	}
}

func TestReplayDryRunChangesNothing(t *testing.T) {
	q := newFakeQueue(t,
		dead("1", "orders", "k", "max-attempts", 500, time.Minute),
		&msg.Message{MessageID: "2", Headers: map[string]any{}},
		dead("3", "billing", "k", "expired", 0, time.Minute),
	)
	p := newFakePub()
	o := opts(3)
	o.DryRun = true
	o.Filter = Filter{Reasons: []string{"max-attempts"}}
	res, err := replay(t, q, p, o)
	if err != nil {
		t.Fatal(err)
	}
	accounted(t, res)
	if res.WouldRecover != 1 || res.Skipped != 2 || res.Recovered != 0 {
		t.Fatalf("%+v", res)
	}
	if len(p.confirmed) != 0 {
		t.Errorf("dry run published %v", p.confirmed)
	}
	if ids := q.ids(); !slices.Equal(ids, []string{"1", "2", "3"}) {
		t.Errorf("DLQ after = %v", ids)
	}
}

func TestReplayFiltersSkipInPlace(t *testing.T) {
	q := newFakeQueue(t,
		dead("1", "orders", "order.eu", "max-attempts", 503, time.Minute),
		dead("2", "orders", "order.us", "non-retriable", 404, time.Minute),
		dead("3", "billing", "bill.eu", "max-attempts", 500, 3*time.Hour),
		dead("4", "orders", "order.eu", "max-attempts", 429, 2*time.Hour),
	)
	p := newFakePub()
	o := opts(4)
	o.Filter = Filter{Statuses: []string{"5xx"}, RoutingKeys: []string{"*.eu"}}
	res, err := replay(t, q, p, o)
	if err != nil {
		t.Fatal(err)
	}
	accounted(t, res)
	if res.Recovered != 2 || res.Skipped != 2 {
		t.Fatalf("%+v", res)
	}
	if got := append(p.idsIn("orders"), p.idsIn("billing")...); !slices.Equal(got, []string{"1", "3"}) {
		t.Errorf("replayed %v", got)
	}
	if ids := q.ids(); !slices.Equal(ids, []string{"2", "4"}) {
		t.Errorf("DLQ after = %v", ids)
	}
}

func TestReplayToOverridesDestination(t *testing.T) {
	q := newFakeQueue(t, dead("1", "orders", "k", "max-attempts", 500, time.Minute), &msg.Message{MessageID: "2", Headers: map[string]any{}})
	p := newFakePub()
	o := opts(2)
	o.To = "orders.fixed"
	res, err := replay(t, q, p, o)
	if err != nil || res.Recovered != 2 {
		t.Fatalf("err=%v %+v", err, res)
	}
	if ids := p.idsIn("orders.fixed"); !slices.Equal(ids, []string{"1", "2"}) {
		t.Errorf("got %v", ids)
	}
}

func TestReplayCopyHeaders(t *testing.T) {
	m := dead("1", "orders", "k", "max-attempts", 500, time.Minute)
	h := m.Headers
	h[msg.HeaderRetryCount] = int32(9)
	h[msg.HeaderRequeueCount] = int32(2)
	h[msg.HeaderLastStatusCode] = int32(500)
	h[msg.HeaderDeadline] = int64(123)
	h[msg.HeaderReplayCount] = int64(2)
	h["app"] = "kept"
	for _, tc := range []struct {
		name          string
		reset, clear  bool
		gone, present []string
	}{
		{"default", false, false,
			[]string{msg.HeaderDeadLetterReason, msg.HeaderDeadLetterTime, msg.HeaderFinalStatusCode, msg.HeaderFinalError, msg.HeaderFinalRetryCount},
			[]string{msg.HeaderRetryCount, msg.HeaderRequeueCount, msg.HeaderFirstFailureTime, msg.HeaderLastFailureTime, msg.HeaderDeadline, msg.HeaderOriginalQueue, "app"}},
		{"reset attempts", true, false,
			[]string{msg.HeaderRetryCount, msg.HeaderRequeueCount, msg.HeaderFirstFailureTime, msg.HeaderLastFailureTime, msg.HeaderLastStatusCode, msg.HeaderDeadLetterReason},
			[]string{msg.HeaderDeadline, msg.HeaderOriginalQueue, msg.HeaderOriginalRoutingKey, "app"}},
		{"clear deadline", false, true, []string{msg.HeaderDeadline}, []string{msg.HeaderRetryCount}},
	} {
		cp := msg.ReplayCopy(m, "orders.dlq", t0, tc.reset, tc.clear)
		for _, k := range tc.gone {
			if _, ok := cp.Headers[k]; ok {
				t.Errorf("%s: %s kept", tc.name, k)
			}
		}
		for _, k := range tc.present {
			if _, ok := cp.Headers[k]; !ok {
				t.Errorf("%s: %s removed", tc.name, k)
			}
		}
		if cp.Headers[msg.HeaderReplayCount] != int64(3) || cp.Headers[msg.HeaderReplayTime] != t0.Format(time.RFC3339Nano) {
			t.Errorf("%s: replay headers %v %v", tc.name, cp.Headers[msg.HeaderReplayCount], cp.Headers[msg.HeaderReplayTime])
		}
		if cp.MessageID != m.MessageID || string(cp.Body) != string(m.Body) {
			t.Errorf("%s: identity changed", tc.name)
		}
	}
	if _, ok := m.Headers[msg.HeaderDeadLetterReason]; !ok {
		t.Error("ReplayCopy modified the original")
	}
}

func TestReplayRate(t *testing.T) {
	var ms []*msg.Message
	for i := range 6 {
		ms = append(ms, dead(fmt.Sprint(i), "orders", "k", "max-attempts", 500, time.Minute))
	}
	q := newFakeQueue(t, ms...)
	o := opts(6)
	o.Rate = 20 // one every 50 ms
	o.Parallel = 6
	start := time.Now()
	res, err := replay(t, q, newFakePub(), o)
	if err != nil || res.Recovered != 6 {
		t.Fatalf("err=%v %+v", err, res)
	}
	if el := time.Since(start); el < 240*time.Millisecond {
		t.Errorf("6 messages at 20/s took %s, want at least 250ms", el)
	}
}

func TestReplayEndsWhenDLQIsEmpty(t *testing.T) {
	q := newFakeQueue(t, dead("1", "orders", "k", "max-attempts", 500, time.Minute))
	res, err := replay(t, q, newFakePub(), opts(10)) // someone else took 9
	if err != nil || res.End != EndEmpty || res.Recovered != 1 {
		t.Fatalf("err=%v %+v", err, res)
	}
}

func TestReplaySourceLost(t *testing.T) {
	var ms []*msg.Message
	for i := range 5 {
		ms = append(ms, dead(fmt.Sprint(i), "orders", "k", "max-attempts", 500, time.Minute))
	}
	q := newFakeQueue(t, ms...)
	q.failAfter, q.nextErr = 2, errors.New("connection closed")
	res, err := replay(t, q, newFakePub(), opts(5))
	if err == nil || res.End != EndLost || res.Recovered != 2 {
		t.Fatalf("err=%v %+v", err, res)
	}
}

func TestReplayInterruptFinishesInFlight(t *testing.T) {
	var ms []*msg.Message
	for i := range 20 {
		ms = append(ms, dead(fmt.Sprint(i), "orders", "k", "max-attempts", 500, time.Minute))
	}
	q := newFakeQueue(t, ms...)
	p := newFakePub()
	p.delay = time.Millisecond
	// Interrupt once three copies are confirmed: mid-run on any machine.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var confirmed atomic.Int64
	p.after = func(string, *msg.Message) {
		if confirmed.Add(1) == 3 {
			cancel()
		}
	}
	o := opts(20)
	o.Parallel = 2
	res, err := Replay(ctx, q, p, o)
	q.Close()
	if err == nil || res.End != EndInterrupted {
		t.Fatalf("err=%v %+v", err, res)
	}
	accounted(t, res)
	if res.Recovered == 0 || res.Recovered == 20 {
		t.Fatalf("recovered %d", res.Recovered)
	}
	// Every publish that started was seen through and acked: nothing is in
	// both places.
	if got := len(q.ids()) + len(p.idsIn("orders")); got != 20 {
		t.Errorf("DLQ %d + replayed %d != 20", len(q.ids()), len(p.idsIn("orders")))
	}
}

func TestReplayStall(t *testing.T) {
	q := newFakeQueue(t, dead("1", "orders", "k", "max-attempts", 500, time.Minute), dead("2", "orders", "k", "max-attempts", 500, time.Minute))
	p := newFakePub()
	p.delay = 400 * time.Millisecond
	o := opts(2)
	o.StallTimeout = 100 * time.Millisecond
	res, err := replay(t, q, p, o)
	if !errors.Is(err, ErrStalled) || res.End != EndStalled {
		t.Fatalf("err=%v %+v", err, res)
	}
	if res.Recovered != 1 || res.Taken != 1 {
		t.Errorf("the publish in flight must finish and nothing more be taken: %+v", res)
	}
}

func TestReplayProgress(t *testing.T) {
	q := newFakeQueue(t, dead("1", "orders", "k", "max-attempts", 500, time.Minute))
	var calls []ReplayResult
	o := opts(1)
	o.Progress = func(r ReplayResult) { calls = append(calls, r) }
	if _, err := replay(t, q, newFakePub(), o); err != nil {
		t.Fatal(err)
	}
	if len(calls) == 0 || calls[len(calls)-1].Recovered != 1 || calls[len(calls)-1].End != EndDone {
		t.Fatalf("progress %+v", calls)
	}
	var line strings.Builder
	WriteProgress(&line, calls[len(calls)-1])
	if !strings.Contains(line.String(), "1/1 taken, 1 recovered") {
		t.Errorf("progress line %q", line.String())
	}
}

// A failed publish frees its share of the limit: the run goes on until
// the limit is recovered.
func TestReplayLimitCountsRecoveredOnly(t *testing.T) {
	var ms []*msg.Message
	for i := range 6 {
		ms = append(ms, dead(fmt.Sprint(i), "orders", "k", "max-attempts", 500, time.Minute))
	}
	q := newFakeQueue(t, ms...)
	p := newFakePub()
	p.delay = 5 * time.Millisecond
	p.fail = func(_ string, m *msg.Message) error {
		if m.MessageID == "1" {
			return errRefused
		}
		return nil
	}
	o := opts(6)
	o.Limit = 3
	o.Parallel = 4
	res, err := replay(t, q, p, o)
	if err != nil {
		t.Fatal(err)
	}
	accounted(t, res)
	if res.Recovered != 3 || res.Failed != 1 || res.End != EndLimit {
		t.Fatalf("%+v", res)
	}
	if ids := q.ids(); !slices.Equal(ids, []string{"1", "4", "5"}) {
		t.Errorf("DLQ after = %v", ids)
	}
}

func TestReplayChangeKeepsTheOriginalFirst(t *testing.T) {
	a := dead("a", "orders", "k", "non-retriable", 422, time.Minute)
	a.Body = []byte("old")
	b := dead("b", "orders", "k", "non-retriable", 422, time.Minute)
	q := newFakeQueue(t, a, b)
	p := newFakePub()
	var order []string
	p.after = func(queue string, m *msg.Message) { order = append(order, queue+":"+m.MessageID+":"+string(m.Body)) }
	o := opts(2)
	o.Filter = Filter{MessageIDs: []string{"a"}}
	o.Originals = "orders.dlq.originals"
	o.Change = func(m *msg.Message) (*msg.Message, error) {
		cp := m.Clone()
		cp.Body = []byte("new")
		return cp, nil
	}
	res, err := replay(t, q, p, o)
	if err != nil {
		t.Fatal(err)
	}
	accounted(t, res)
	if res.Recovered != 1 || res.Changed != 1 || res.Skipped != 1 {
		t.Fatalf("%+v", res)
	}
	if !slices.Equal(order, []string{"orders.dlq.originals:a:old", "orders:a:new"}) {
		t.Errorf("publishes %v: the original is kept before the changed copy goes", order)
	}
	if string(a.Body) != "old" {
		t.Error("the message taken was changed")
	}
	if ids := q.ids(); !slices.Equal(ids, []string{"b"}) {
		t.Errorf("DLQ after = %v", ids)
	}
}

func TestReplayChangeFailuresLeaveTheMessage(t *testing.T) {
	for _, c := range []struct {
		name      string
		change    func(*msg.Message) (*msg.Message, error)
		originals error
		kept      int
		failed    int
	}{
		{"change refused", func(*msg.Message) (*msg.Message, error) { return nil, errors.New("amount: not a number") }, nil, 1, 0},
		{"change panics", func(*msg.Message) (*msg.Message, error) { panic("boom") }, nil, 1, 0},
		{"originals queue refuses", func(m *msg.Message) (*msg.Message, error) { return m.Clone(), nil }, errRefused, 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := dead("a", "orders", "k", "non-retriable", 422, time.Minute)
			q := newFakeQueue(t, a)
			p := newFakePub()
			p.fail = func(queue string, _ *msg.Message) error {
				if queue == "keep" {
					return c.originals
				}
				return nil
			}
			o := opts(1)
			o.Change, o.Originals = c.change, "keep"
			res, err := replay(t, q, p, o)
			if err != nil {
				t.Fatal(err)
			}
			accounted(t, res)
			if res.Recovered != 0 || res.Kept != c.kept || res.Failed != c.failed || len(res.Errors) != 1 {
				t.Fatalf("%+v", res)
			}
			if ids := p.idsIn("orders"); len(ids) != 0 {
				t.Errorf("published %v", ids)
			}
			if ids := q.ids(); !slices.Equal(ids, []string{"a"}) || q.ready[0].m != a {
				t.Errorf("DLQ after = %v: the message stays as it was", ids)
			}
		})
	}
}

func TestReplayToExchange(t *testing.T) {
	for _, c := range []struct {
		key  string
		want string
	}{
		{"", "orders.v2/order.created"}, // the original routing key
		{"order.fixed", "orders.v2/order.fixed"},
	} {
		q := newFakeQueue(t, dead("1", "orders", "order.created", "max-attempts", 500, time.Minute))
		p := newFakePub()
		o := opts(1)
		o.ToExchange, o.RoutingKey = "orders.v2", c.key
		res, err := replay(t, q, p, o)
		if err != nil || res.Recovered != 1 {
			t.Fatalf("err=%v %+v", err, res)
		}
		if ids := p.idsIn(c.want); !slices.Equal(ids, []string{"1"}) {
			t.Errorf("routing key %q: nothing published to %s (%v)", c.key, c.want, p.confirmed)
		}
	}
}

func TestReplayOptionsRedirectValidate(t *testing.T) {
	for _, c := range []struct {
		o    ReplayOptions
		want string
	}{
		{ReplayOptions{To: "a", ToExchange: "x"}, "not both"},
		{ReplayOptions{RoutingKey: "k"}, "only with --to-exchange"},
		{ReplayOptions{To: "orders.dlq"}, "the DLQ itself"},
	} {
		o := c.o
		o.DLQ, o.Parallel, o.IdleTimeout, o.StallTimeout = "orders.dlq", 1, time.Second, time.Second
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.o, err, c.want)
		}
	}
}

func TestReplayInBatches(t *testing.T) {
	five := func() *fakeQueue {
		var ms []*msg.Message
		for i := range 5 {
			ms = append(ms, dead(fmt.Sprint(i), "orders", "k", "max-attempts", 500, time.Minute))
		}
		return newFakeQueue(t, ms...)
	}
	q, p := five(), newFakePub()
	o := opts(5)
	o.Parallel, o.Batch = 4, 2
	var calls []string
	o.Between = func(_ context.Context, recovered int) error {
		// Every move of the batch has settled before the wait.
		calls = append(calls, fmt.Sprintf("%d/%d", recovered, len(p.idsIn("orders"))))
		return nil
	}
	res, err := replay(t, q, p, o)
	if err != nil || res.Recovered != 5 {
		t.Fatalf("err=%v %+v", err, res)
	}
	if !slices.Equal(calls, []string{"2/2", "4/4"}) {
		t.Errorf("waits at %v, want after 2 and 4 moved", calls)
	}

	// Stopped at the first wait: the first batch moved, the rest stays.
	q, p = five(), newFakePub()
	ctx, cancel := context.WithCancel(context.Background())
	o.Between = func(context.Context, int) error { cancel(); return context.Canceled }
	res, err = Replay(ctx, q, p, o)
	q.Close()
	if res.Recovered != 2 || err == nil || res.End != EndInterrupted {
		t.Fatalf("err=%v %+v", err, res)
	}
	accounted(t, res)
	if ids := q.ids(); !slices.Equal(ids, []string{"2", "3", "4"}) {
		t.Errorf("DLQ after = %v", ids)
	}
	o.Between = nil
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--batch") {
		t.Errorf("batch without a wait: %v", err)
	}
}

func TestReplayNamesTheRun(t *testing.T) {
	a := dead("a", "orders", "k", "max-attempts", 500, time.Minute)
	a.Headers[msg.HeaderReplayRun] = "an earlier run"
	b := dead("b", "orders", "k", "max-attempts", 500, time.Minute)
	for _, c := range []struct{ run, want string }{{"cli 1", "cli 1"}, {"", ""}} {
		q, p := newFakeQueue(t, a, b), newFakePub()
		o := opts(2)
		o.RunID = c.run
		if res, err := replay(t, q, p, o); err != nil || res.Recovered != 2 {
			t.Fatalf("err=%v %+v", err, res)
		}
		for _, m := range p.confirmed["orders"] {
			if got := m.String(msg.HeaderReplayRun); got != c.want {
				t.Errorf("run %q: copy %s names run %q, want %q", c.run, m.MessageID, got, c.want)
			}
		}
	}
}
