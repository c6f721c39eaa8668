package dlq

import (
	"context"
	"slices"
	"testing"

	"github.com/hopper-sidecar/hopper/msg"
)

func TestParseDeliveryLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want DeliveryLimit
		ok   bool
	}{
		{"", UnknownDeliveryLimit, true},
		{"none", NoDeliveryLimit, true},
		{" None ", NoDeliveryLimit, true},
		{"1", 1, true},
		{"20", 20, true},
		{"0", 0, false},
		{"-1", 0, false}, // the broker's "none", which 3.x reads as "drop at once"
		{"2x", 0, false},
	} {
		got, err := ParseDeliveryLimit(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("ParseDeliveryLimit(%q) = %v, %v; want %v (ok %t)", tc.in, got, err, tc.want, tc.ok)
		}
		if tc.ok {
			if back, err := ParseDeliveryLimit(got.String()); err != nil || back != got {
				t.Errorf("%q: String %q reads back as %v, %v", tc.in, got.String(), back, err)
			}
		}
	}
}

// The rotate-or-return rule: a message is returned only while one more
// counted return leaves it below the limit; an unknown limit rotates
// everything, none rotates nothing.
func TestMustRotate(t *testing.T) {
	for _, tc := range []struct {
		limit DeliveryLimit
		count int64
		want  bool
	}{
		{UnknownDeliveryLimit, 0, true},
		{UnknownDeliveryLimit, 5, true},
		{NoDeliveryLimit, 0, false},
		{NoDeliveryLimit, 1000, false},
		{1, 0, true}, // a return would bring it to 1, the limit
		{2, 0, false},
		{2, 1, true},
		{3, 1, false},
		{3, 2, true},
		{3, 3, true}, // at the limit already: one more return drops it
		{3, 9, true},
		{20, 18, false},
		{20, 19, true},
	} {
		if got := tc.limit.MustRotate(tc.count); got != tc.want {
			t.Errorf("limit %v, x-delivery-count %d: MustRotate %t, want %t", tc.limit, tc.count, got, tc.want)
		}
	}
}

func TestDeliveryLimitNeed(t *testing.T) {
	if UnknownDeliveryLimit.Need() != nil {
		t.Error("an unknown limit must rotate every message (Need nil)")
	}
	with := func(v any) *msg.Message {
		m := &msg.Message{MessageID: "m", Headers: map[string]any{}}
		if v != nil {
			m.Headers[msg.HeaderDeliveryCount] = v
		}
		return m
	}
	need := DeliveryLimit(3).Need()
	for _, tc := range []struct {
		header any
		want   bool
	}{
		{nil, false},
		{int64(1), false},
		{int32(2), true},
		{int64(7), true},
		{"x", true}, // not a count the broker wrote: rotated, which drops it
	} {
		if got := need(with(tc.header)); got != tc.want {
			t.Errorf("limit 3, x-delivery-count %#v: rotate %t, want %t", tc.header, got, tc.want)
		}
	}
	none := NoDeliveryLimit.Need()
	for _, h := range []any{nil, int64(100), "x"} {
		if none(with(h)) {
			t.Errorf("no limit, x-delivery-count %#v: rotated", h)
		}
	}
}

// counted are messages whose x-delivery-count is the number after each id.
func counted(ids []string, counts []int64) []*msg.Message {
	out := plain(ids...)
	for i, m := range out {
		if counts[i] > 0 {
			m.Headers[msg.HeaderDeliveryCount] = counts[i]
		}
	}
	return out
}

// Under a known limit a pass rotates only the messages at the threshold:
// their copies (without the count) go to the tail and the originals are
// acked; the rest are held, left for the source's closing to return. It
// still takes every message present, those past its limit unshown.
func TestBrowseRotatesOnlyNearTheLimit(t *testing.T) {
	q := newFakeQueue(t, counted([]string{"a", "b", "c", "d", "e"}, []int64{0, 2, 1, 5, 0})...)
	pub := newFakePub()
	rot := &Rotation{Queue: "dlq", Pub: pub, Need: DeliveryLimit(3).Need()}
	var shown []string
	res, err := Browse(context.Background(), q, BrowseOptions{Limit: 4, Bound: 5, Rotate: rot},
		func(m *msg.Message) error { shown = append(shown, m.MessageID); return nil })
	if err != nil || res.Taken != 5 || !slices.Equal(shown, []string{"a", "b", "c", "d"}) {
		t.Fatalf("%+v %v shown %v", res, err, shown)
	}
	if got := pub.idsIn("dlq"); !slices.Equal(got, []string{"b", "d"}) {
		t.Errorf("rotated %v, want the two at the threshold", got)
	}
	for _, m := range pub.confirmed["dlq"] {
		if _, ok := m.Headers[msg.HeaderDeliveryCount]; ok {
			t.Errorf("copy of %s keeps x-delivery-count", m.MessageID)
		}
	}
	q.mu.Lock()
	held := len(q.taken)
	q.mu.Unlock()
	if held != 3 {
		t.Errorf("%d messages held, want a, c and e", held)
	}
	q.Close()
	if got := q.ids(); !slices.Equal(got, []string{"a", "c", "e"}) {
		t.Errorf("DLQ after close %v (the rotated ones' copies went to the publisher)", got)
	}
}

// A held message after the rotation failed stops the run as a rotated one
// would: the first failure is the run's.
func TestRotationHeldAfterFailureStops(t *testing.T) {
	q := newFakeQueue(t, counted([]string{"a", "b"}, []int64{2, 0})...)
	pub := newFakePub()
	pub.fail = func(string, *msg.Message) error { return errRefused }
	rot := &Rotation{Queue: "dlq", Pub: pub, Need: DeliveryLimit(3).Need(), Window: 1}
	res, err := Browse(context.Background(), q, BrowseOptions{Limit: 2, Bound: 2, Rotate: rot}, func(*msg.Message) error { return nil })
	if err == nil || res.Taken != 1 {
		t.Fatalf("%+v %v: want the run stopped at the failed copy", res, err)
	}
	q.Close()
	if got := q.ids(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("DLQ after %v", got)
	}
}

// Export under a known limit takes every message present past its
// --limit, rotating only what must be among what it keeps.
func TestExportUnderKnownLimitRotatesOnlyNearIt(t *testing.T) {
	q := newFakeQueue(t, counted([]string{"a", "b", "c", "d"}, []int64{0, 2, 0, 0})...)
	pub := newFakePub()
	rot := &Rotation{Queue: "dlq", Pub: pub, Need: DeliveryLimit(3).Need()}
	res, err := Export(context.Background(), q, nil, ExportOptions{DLQ: "dlq", Bound: 4, Limit: 2, DryRun: true, Rotate: rot})
	if err != nil || res.Taken != 4 || res.WouldExport != 2 {
		t.Fatalf("export: %+v %v", res, err)
	}
	if got := pub.idsIn("dlq"); !slices.Equal(got, []string{"b"}) {
		t.Errorf("export rotated %v, want b", got)
	}
	q.Close()
	if got := q.ids(); !slices.Equal(got, []string{"a", "c", "d"}) {
		t.Errorf("DLQ after export %v", got)
	}
}
