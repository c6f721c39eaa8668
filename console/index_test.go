package console

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
)

var t0 = time.Date(2026, 11, 25, 3, 0, 0, 0, time.UTC)

// dead is a message as Hopper dead-letters it.
func dead(id, queue, rk, reason string, status int, errText string, at time.Time) *msg.Message {
	m := &msg.Message{MessageID: id, Headers: map[string]any{}, Body: []byte(`{"id":"` + id + `"}`)}
	*m = *msg.DLQCopy(m, msg.Info{Queue: queue, RoutingKey: rk}, msg.DeadLetter{Status: status, Reason: reason, Retries: 3, Error: errText, Now: at})
	return m
}

func TestIndexGroups(t *testing.T) {
	ix := NewIndex()
	for i := range 5 {
		ix.Add(dead("a"+string(rune('0'+i)), "orders", "order.created", "max-attempts", 503, "upstream 10.0.0."+string(rune('1'+i))+" answered 503", t0.Add(time.Duration(i)*time.Minute)))
	}
	for i := range 3 {
		ix.Add(dead("b"+string(rune('0'+i)), "orders", "order.paid", "non-retriable", 422, "field amount: must be positive", t0.Add(time.Hour+time.Duration(i)*time.Second)))
	}
	ix.Add(dead("c0", "billing", "order.created", "max-attempts", 503, "upstream 10.0.0.9 answered 503", t0.Add(-time.Hour)))
	ix.Add(&msg.Message{MessageID: "d0", Headers: map[string]any{}})

	gs := ix.Groups()
	if len(gs) != 3 {
		t.Fatalf("%d groups, want 3: %+v", len(gs), gs)
	}
	big := gs[0]
	if big.Count != 6 || big.Key.Status != "503" || big.Key.RoutingKey != "order.created" || big.Key.Fingerprint != "upstream <n>.<n>.<n>.<n> answered <n>" {
		t.Fatalf("largest group = %+v", big)
	}
	if got := strings.Join(big.Queues, ","); got != "orders,billing" {
		t.Errorf("queues = %s, want orders,billing", got)
	}
	if !big.First.Equal(t0.Add(-time.Hour)) || !big.Last.Equal(t0.Add(4*time.Minute)) {
		t.Errorf("first/last = %s / %s", big.First, big.Last)
	}
	if big.Sample != "a0" || big.SampleError != "upstream 10.0.0.1 answered 503" {
		t.Errorf("sample = %s %q", big.Sample, big.SampleError)
	}
	if big.Share != 0.6 {
		t.Errorf("share = %v, want 0.6", big.Share)
	}
	if gs[1].Count != 3 || gs[1].Key.Reason != "non-retriable" || gs[2].Count != 1 || gs[2].Key.Status != dlq.Unknown {
		t.Errorf("other groups = %+v / %+v", gs[1], gs[2])
	}
	if !ix.Oldest.Equal(t0.Add(-time.Hour)) || !ix.Newest.Equal(t0.Add(time.Hour+2*time.Second)) || ix.Scanned != 10 {
		t.Errorf("oldest %s newest %s scanned %d", ix.Oldest, ix.Newest, ix.Scanned)
	}

	// The id is the same for the same key in another index: a rescan
	// keeps the URLs.
	again := NewIndex()
	again.Add(dead("z", "orders", "order.paid", "non-retriable", 422, "field amount: must be positive", t0))
	if again.Groups()[0].ID != gs[1].ID {
		t.Error("group id differs between indexes for one key")
	}

	msgs, n := ix.Messages(gs[1].ID, 2)
	if n != 3 || len(msgs) != 2 || msgs[0].ID != "b0" || msgs[1].ID != "b1" || !msgs[0].DeadLettered.Equal(t0.Add(time.Hour)) {
		t.Errorf("messages = %+v (of %d)", msgs, n)
	}
	if g, ok := ix.GroupOfMessage("c0"); !ok || g.ID != big.ID {
		t.Errorf("group of c0 = %+v %v", g, ok)
	}
	if _, ok := ix.Group("nope"); ok {
		t.Error("unknown group found")
	}
}

// clock is a settable clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestSamplerArrivals(t *testing.T) {
	c := &clock{t: t0}
	s := &Sampler{Now: c.now}
	if _, ok := s.PerMinute(); ok {
		t.Fatal("rate without samples")
	}
	for _, d := range []int{100, 130, 130, 160} { // +60 in 30s
		s.Add(d)
		c.t = c.t.Add(10 * time.Second)
	}
	r, ok := s.PerMinute()
	if !ok || r != 120 {
		t.Fatalf("rate = %v %v, want 120/min", r, ok)
	}
	// The console replays 100: the depth falls, arrivals go on.
	s.Removed(100)
	s.Add(90) // 160 - 100 + 30 arrived
	c.t = c.t.Add(10 * time.Second)
	s.Add(120)
	c.t = c.t.Add(10 * time.Second)
	s.Add(150)
	// The last minute, back to the first sample: 30+0+30+30+30+30.
	if r, _ := s.PerMinute(); r != 150 {
		t.Fatalf("rate after a replay = %v, want 150/min", r)
	}
}

func TestSamplerBounded(t *testing.T) {
	c := &clock{t: t0}
	s := &Sampler{Now: c.now, Max: 10}
	for i := range 100 {
		s.Add(i)
		c.t = c.t.Add(time.Second)
	}
	got := s.Samples()
	if len(got) > 10 || len(got) < 5 {
		t.Fatalf("%d samples kept, want 5 to 10", len(got))
	}
	if got[0].Depth != 0 || got[len(got)-1].Depth != 99 {
		t.Fatalf("first/last = %d/%d, want the lifetime 0..99", got[0].Depth, got[len(got)-1].Depth)
	}
}

func TestDepthChart(t *testing.T) {
	c := DepthChart([]Sample{{At: t0, Depth: 0}, {At: t0.Add(time.Minute), Depth: 50}, {At: t0.Add(2 * time.Minute), Depth: 100}}, 204, 54)
	// 2px padding: x from 2 to 202, y from 52 (zero) to 2 (the maximum).
	if c.Points != "2.0,52.0 102.0,27.0 202.0,2.0" || c.Max != 100 {
		t.Fatalf("chart = %+v", c)
	}
	svg := c.SVG()
	if !strings.HasPrefix(svg, "<svg") || !strings.HasSuffix(svg, "</svg>") || !strings.Contains(svg, `points="`+c.Points+`"`) {
		t.Fatalf("svg: %s", svg)
	}
	if empty := DepthChart(nil, 100, 20); empty.Points != "" || strings.Contains(empty.SVG(), "polyline") {
		t.Fatalf("empty chart draws a line: %+v", empty)
	}
	// Samples at one instant are spread evenly.
	if same := DepthChart([]Sample{{At: t0, Depth: 1}, {At: t0, Depth: 1}}, 104, 54); same.Points != "2.0,2.0 102.0,2.0" {
		t.Fatalf("samples at one instant: %s", same.Points)
	}
}

// TestIndexCompact: the index of a DLQ the size the console is built for
// keeps no bodies and no headers per message: 119,762 messages with 1 KiB
// bodies and errors each of their own cost a few megabytes once read.
func TestIndexCompact(t *testing.T) {
	const n = 119_762
	body := make([]byte, 1024)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	ix := NewIndex()
	for i := range n {
		m := dead("m-"+strconv.Itoa(i), "orders", "order.created", "max-attempts", 500+i%4, "upstream 10.0.0."+strconv.Itoa(i%250)+" answered after "+strconv.Itoa(i)+"ms", t0.Add(time.Duration(i)*time.Second))
		m.Body = body
		ix.Add(m)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if gs := ix.Groups(); len(gs) != 4 || gs[0].Count+gs[1].Count+gs[2].Count+gs[3].Count != n {
		t.Fatalf("groups = %d", len(gs))
	}
	t.Logf("index of %d messages: %.1f MB", n, float64(grew)/(1<<20))
	if grew > 16<<20 {
		t.Fatalf("index of %d messages holds %.1f MB, want at most 16 MB", n, float64(grew)/(1<<20))
	}
	runtime.KeepAlive(ix)
}

func TestIndexFailedAgainPerRun(t *testing.T) {
	ix := NewIndex()
	plain := dead("p", "orders", "order.paid", "non-retriable", 422, "invalid", t0)
	ix.Add(plain)
	for i, run := range []string{"run A", "run A", "run B"} {
		m := dead("r"+strconv.Itoa(i), "orders", "order.paid", "non-retriable", 422, "invalid", t0)
		m.Headers[msg.HeaderReplayRun] = run
		ix.Add(m)
	}
	if len(ix.Groups()) != 3 {
		t.Fatalf("groups %+v: one per run, apart from the never replayed", ix.Groups())
	}
	if ix.Runs["run A"] != 2 || ix.Runs["run B"] != 1 || len(ix.Runs) != 2 {
		t.Errorf("runs %v", ix.Runs)
	}
	// A group never replayed keeps the id it had before runs were named.
	key := dlq.GroupOf(plain)
	if key.ReplayRun != "" || GroupID(key) != GroupID(dlq.GroupKey{Reason: key.Reason, Status: key.Status, Fingerprint: key.Fingerprint, RoutingKey: key.RoutingKey}) {
		t.Errorf("key %+v", key)
	}
	withRun := key
	withRun.ReplayRun = "run A"
	if GroupID(withRun) == GroupID(key) {
		t.Error("a run's group has the same id as the group never replayed")
	}
}
