package dlq

import (
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/schedule"
)

// TestReparkerTargets: a message read from a parking queue goes back to
// the step its time left allows, the work queue once due (less than half
// a step left), or, saying no due time, where it was; its own copies and
// a message met again are not listed twice.
func TestReparkerTargets(t *testing.T) {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	steps := map[time.Duration]string{}
	pol := schedule.Policy{Step: time.Second, Max: time.Hour}
	for _, s := range pol.Steps() {
		steps[s] = "q.park." + s.String()
	}
	r := &Reparker{Policy: pol, Work: "q", Now: func() time.Time { return now },
		Park: func(s time.Duration) (string, bool) { n, ok := steps[s]; return n, ok }}
	parked := func(id string, left time.Duration) *msg.Message {
		h := map[string]any{msg.HeaderParked: true}
		if left != 0 {
			h[msg.HeaderDue] = now.Add(left).UnixMilli()
		}
		return &msg.Message{MessageID: id, Headers: h, Body: []byte(id)}
	}
	for _, tc := range []struct {
		from string
		m    *msg.Message
		to   string
	}{
		{"q.park.8m32s", parked("mid", 10*time.Minute), "q.park.8m32s"},
		{"q.park.8m32s", parked("shrunk", 100*time.Second), "q.park.1m4s"},
		{"q.park.1s", parked("half", 600*time.Millisecond), "q.park.1s"},
		{"q.park.1s", parked("nearly", 400*time.Millisecond), "q"},
		{"q.park.1m4s", parked("late", -2*time.Second), "q"},
		{"q.park.4s", parked("nodue", 0), "q.park.4s"},
	} {
		p, ok := r.Read(tc.from, tc.m)
		if !ok || p.ID != tc.m.MessageID || p.Queue != tc.from {
			t.Fatalf("%s: listed %+v %t", tc.m.MessageID, p, ok)
		}
		if got := r.To(tc.from, tc.m); got != tc.to {
			t.Errorf("%s: back to %s, want %s", tc.m.MessageID, got, tc.to)
		}
	}
	// The copy of "shrunk" read from the 1m4s step: not listed again.
	if _, ok := r.Read("q.park.1m4s", parked("shrunk", 100*time.Second)); ok {
		t.Error("the listing's own copy was listed")
	}
	// "mid" moved by Hopper to a shorter step meanwhile: listed once.
	if _, ok := r.Read("q.park.4m16s", parked("mid", 10*time.Minute)); ok || r.Again != 1 {
		t.Errorf("a message met again was listed (again %d)", r.Again)
	}
	if p, _ := r.Read("q.park.2s", parked("other", 3*time.Second)); p.LeftMs != 3000 || !p.Due.Equal(now.Add(3*time.Second)) {
		t.Errorf("listed %+v, want due in 3s", p)
	}
}
