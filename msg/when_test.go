package msg

import (
	"testing"
	"time"
)

func TestWhen(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	abs := now.Add(90 * time.Second)
	cases := []struct {
		name   string
		h      map[string]any
		due    time.Time
		pinned bool
		parked bool
	}{
		{"nothing", nil, time.Time{}, false, false},
		{"x-delay int32", map[string]any{HeaderDelay: int32(5000)}, now.Add(5 * time.Second), false, false},
		{"x-delay as a string", map[string]any{HeaderDelay: "1500"}, now.Add(1500 * time.Millisecond), false, false},
		{"x-delay zero: at once", map[string]any{HeaderDelay: int64(0)}, time.Time{}, false, false},
		{"x-delay negative: at once", map[string]any{HeaderDelay: int64(-5)}, time.Time{}, false, false},
		{"x-delay garbage: at once", map[string]any{HeaderDelay: "soon"}, time.Time{}, false, false},
		{"x-delay of ages saturates", map[string]any{HeaderDelay: int64(1 << 62)}, now.Add(time.Duration(maxDelayMillis) * time.Millisecond), false, false},
		{"absolute RFC 3339", map[string]any{HeaderNotBefore: abs.Format(time.RFC3339Nano)}, abs, false, false},
		{"absolute epoch ms", map[string]any{HeaderNotBefore: abs.UnixMilli()}, abs, false, false},
		{"absolute wins over x-delay", map[string]any{HeaderNotBefore: abs.UnixMilli(), HeaderDelay: int32(1)}, abs, false, false},
		{"unreadable absolute falls back to x-delay", map[string]any{HeaderNotBefore: "tomorrow", HeaderDelay: int32(1000)}, now.Add(time.Second), false, false},
		{"pinned wins", map[string]any{HeaderDue: abs.UnixMilli(), HeaderNotBefore: now.UnixMilli(), HeaderDelay: int32(1), HeaderParked: true}, abs, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			due, pinned, parked := When(&Message{Headers: c.h}, now)
			if !due.Equal(c.due) || pinned != c.pinned || parked != c.parked {
				t.Fatalf("When = %s %t %t, want %s %t %t", due, pinned, parked, c.due, c.pinned, c.parked)
			}
		})
	}
}

// TestParkCopyServesTheSchedule: a parked copy carries its due time and
// the parked mark; any copy made after the message was due (a retry here)
// keeps the due time, drops x-delay and the mark, so the retry's delay
// and the schedule never add up.
func TestParkCopyServesTheSchedule(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	m := &Message{MessageID: "m", Headers: map[string]any{HeaderDelay: int32(60000)}}
	due, _, _ := When(m, now)
	in := Read(m, "q", "", now)
	p := ParkCopy(m, in, due)
	if got, _ := p.Int(HeaderDue); got != due.UnixMilli() || p.Headers[HeaderParked] != true {
		t.Fatalf("park copy headers %v", p.Headers)
	}
	if got, _ := p.Int(HeaderRetryCount); got != 0 {
		t.Fatalf("parking counted an attempt: %v", p.Headers)
	}
	back, pinned, parked := When(p, now.Add(time.Hour))
	if !back.Equal(due) || !pinned || !parked {
		t.Fatalf("back from parking: %s %t %t", back, pinned, parked)
	}
	in = Read(p, "q", "", now.Add(time.Minute))
	in.Due = back
	r := RetryCopy(p, in, 1, 503, now.Add(time.Minute))
	if _, ok := r.Headers[HeaderDelay]; ok {
		t.Fatalf("retry copy still has x-delay: %v", r.Headers)
	}
	if _, ok := r.Headers[HeaderParked]; ok {
		t.Fatalf("retry copy still marked parked: %v", r.Headers)
	}
	if got, _ := r.Int(HeaderDue); got != due.UnixMilli() {
		t.Fatalf("retry copy due %d, want %d", got, due.UnixMilli())
	}
}
