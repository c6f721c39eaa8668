package dlq

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// badQueue hands out a delivery whose message cannot be read for the ids
// in bad: reading it panics, as a decoder meeting a header table nothing
// anticipated might.
type badQueue struct {
	*fakeQueue
	bad map[string]bool
}

type badDelivery struct{ *fakeDelivery }

func (d badDelivery) Message() *msg.Message { panic("header table: unexpected field type") }

func (q badQueue) Next(ctx context.Context) (Delivery, bool, error) {
	d, ok, err := q.fakeQueue.Next(ctx)
	if ok && q.bad[d.(*fakeDelivery).e.m.MessageID] {
		return badDelivery{d.(*fakeDelivery)}, true, nil
	}
	return d, ok, err
}

func plain(ids ...string) []*msg.Message {
	var out []*msg.Message
	for _, id := range ids {
		out = append(out, &msg.Message{MessageID: id, Headers: map[string]any{msg.HeaderOriginalQueue: "work"}, Body: []byte(id)})
	}
	return out
}

// A message whose processing panics is reported, counted and handed back;
// the pass goes on and every message stays.
func TestBrowseSurvivesBadMessages(t *testing.T) {
	for _, rotate := range []bool{false, true} {
		q := newFakeQueue(t, plain("a", "b", "c", "d")...)
		pub := newFakePub()
		var rot *Rotation
		if rotate {
			rot = &Rotation{Queue: "dlq", Pub: pub}
		}
		var reported []int
		var shown []string
		res, err := Browse(context.Background(), q, BrowseOptions{Limit: 4, Bound: 4, Rotate: rot, OnBad: func(n int, err error) {
			if !errors.Is(err, ErrBadMessage) || !strings.Contains(err.Error(), "boom") {
				t.Errorf("bad message %d reported as %v", n, err)
			}
			reported = append(reported, n)
		}}, func(m *msg.Message) error {
			if m.MessageID == "b" {
				panic("boom")
			}
			shown = append(shown, m.MessageID)
			return nil
		})
		if err != nil || res.Bad != 1 || res.Taken != 4 || !slices.Equal(reported, []int{2}) || !slices.Equal(shown, []string{"a", "c", "d"}) {
			t.Fatalf("rotate %t: %+v %v reported %v shown %v", rotate, res, err, reported, shown)
		}
		q.Close()
		if rotate {
			// Every message rotated, the bad one included, in order.
			if got := pub.idsIn("dlq"); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
				t.Errorf("rotated %v", got)
			}
			if got := q.ids(); len(got) != 0 {
				t.Errorf("originals not acked: %v", got)
			}
		} else if got := q.ids(); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
			t.Errorf("DLQ after %v", got)
		}
	}
}

// A delivery whose message cannot even be read is counted as bad by replay
// and export, never acked, and the run goes on.
func TestReplayAndExportSurviveUnreadableMessages(t *testing.T) {
	q := badQueue{newFakeQueue(t, plain("a", "b", "c")...), map[string]bool{"b": true}}
	pub := newFakePub()
	var bad []int
	res, err := Replay(context.Background(), q, pub, ReplayOptions{DLQ: "dlq", Bound: 3, Parallel: 1, IdleTimeout: time.Second,
		OnBad: func(n int, _ error) { bad = append(bad, n) }})
	if err != nil || res.Recovered != 2 || res.Bad != 1 || !slices.Equal(bad, []int{2}) {
		t.Fatalf("replay: %+v %v bad %v", res, err, bad)
	}
	q.Close()
	if got := q.ids(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("DLQ after replay %v", got)
	}
	var sum strings.Builder
	if err := res.WriteSummary(&sum); err != nil || !strings.Contains(sum.String(), "bad") {
		t.Errorf("summary %v:\n%s", err, sum.String())
	}

	q = badQueue{newFakeQueue(t, plain("a", "b", "c")...), map[string]bool{"a": true}}
	w := &syncFile{}
	eres, err := Export(context.Background(), q, w, ExportOptions{DLQ: "dlq", Bound: 3, Remove: true, SyncEvery: 1, IdleTimeout: time.Second})
	if err != nil || eres.Exported != 2 || eres.Removed != 2 || eres.Bad != 1 {
		t.Fatalf("export: %+v %v", eres, err)
	}
	q.Close()
	if got := q.ids(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("DLQ after export %v", got)
	}
}

// A rotating pass takes exactly the messages present at start, however
// many are asked for: past them come its own copies.
func TestBrowseRotationStopsAtTheBound(t *testing.T) {
	q := newFakeQueue(t, plain("a", "b")...)
	pub := newFakePub()
	// The copies go back into the queue, as the DLQ's tail.
	pub.after = func(_ string, m *msg.Message) { q.push(m) }
	var shown []string
	res, err := Browse(context.Background(), q, BrowseOptions{Limit: 10, Bound: 2, Rotate: &Rotation{Queue: "dlq", Pub: pub}},
		func(m *msg.Message) error { shown = append(shown, m.MessageID); return nil })
	if err != nil || res.Taken != 2 || !slices.Equal(shown, []string{"a", "b"}) {
		t.Fatalf("%+v %v shown %v", res, err, shown)
	}
	q.Close()
	if got := q.ids(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("queue after %v", got)
	}
}

// A pass whose context ends while the source waits for the next message
// says it was stopped: a source answers "nothing ready" then, and the
// caller (a console scan) must not take the part it read for the whole.
func TestBrowseCancelledWhileWaitingIsAnError(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	waiting := SourceFunc(func(ctx context.Context) (Delivery, bool, error) {
		cancel()
		<-ctx.Done()
		return nil, false, nil
	})
	res, err := Browse(ctx, waiting, BrowseOptions{Limit: 5, Bound: 5}, func(*msg.Message) error { return nil })
	if !errors.Is(err, context.Canceled) || res.Taken != 0 {
		t.Fatalf("Browse cancelled while the source waited: %+v, %v; want context.Canceled", res, err)
	}
}
