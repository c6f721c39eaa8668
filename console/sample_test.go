package console

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/dlq"
)

// depths is a Broker whose DLQ depth the test sets; it opens nothing.
type depths struct{ n map[string]int }

func (d *depths) Depth(_ context.Context, q string) (int, error) { return d.n[q], nil }
func (d *depths) Browse(context.Context, string) (dlq.Pass, error) {
	return dlq.Pass{}, errors.New("no broker")
}
func (d *depths) BrowseInPlace(context.Context, string) (dlq.Pass, error) {
	return dlq.Pass{}, errors.New("no broker")
}
func (d *depths) Own(context.Context, string, int, int) (dlq.Pass, error) {
	return dlq.Pass{}, errors.New("no broker")
}
func (d *depths) Originals(context.Context, string) (string, error) {
	return "", errors.New("no broker")
}
func (d *depths) CheckTarget(context.Context, string, string) error {
	return errors.New("no broker")
}
func (d *depths) Marks(_ context.Context, q string) (dlq.Marks, error) {
	m, _ := dlq.LatestMarks(q, nil)
	return m, nil
}
func (d *depths) ChangeMarks(context.Context, string, string, func(*dlq.Marks)) (dlq.Marks, error) {
	return dlq.Marks{}, errors.New("no broker")
}

// TestSampleSkipsABusyDLQ: while a scan holds a classic DLQ's messages the
// broker reports them as gone; the sample is skipped, so the held
// messages count neither as departures nor, handed back, as arrivals.
func TestSampleSkipsABusyDLQ(t *testing.T) {
	c := &clock{t: t0}
	b := &depths{n: map[string]int{"a.dlq": 1000}}
	s, err := New(Options{DLQs: []DLQ{{Name: "a.dlq"}}, Broker: b, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	q := s.queues["a.dlq"]
	s.sample(context.Background())
	release, err := s.claim(q, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.claim(q, nil); !errors.Is(err, errBusy) {
		t.Fatalf("second claim: %v, want errBusy", err)
	}
	c.t = c.t.Add(10 * time.Second)
	b.n["a.dlq"] = 0 // held by the scan
	s.sample(context.Background())
	release()
	c.t = c.t.Add(10 * time.Second)
	b.n["a.dlq"] = 1002 // handed back, and two arrived
	s.sample(context.Background())
	got := q.sampler.Samples()
	if len(got) != 2 || got[1].Depth != 1002 {
		t.Fatalf("samples = %+v, want the two outside the scan", got)
	}
	if r, ok := q.sampler.PerMinute(); !ok || r != 6 {
		t.Fatalf("arrivals = %v/min, want 6 (2 in 20s)", r)
	}
}
