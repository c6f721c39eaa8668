package msg_test

import (
	"math"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// A counter header is written by whoever published the message, so it can
// hold anything: every value must read as a count in [0, MaxCount], and the
// attempt built on it must stay positive.
func TestReadHostileCounters(t *testing.T) {
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	cases := []struct {
		name string
		v    any
		want int
	}{
		{"int64 max", int64(math.MaxInt64), msg.MaxCount},
		{"int64 max as a string", "9223372036854775807", msg.MaxCount},
		{"past int64 as a string", "99999999999999999999", msg.MaxCount},
		{"past int64 as bytes", []byte("99999999999999999999"), msg.MaxCount},
		{"uint64 max", uint64(math.MaxUint64), msg.MaxCount},
		{"int32 max", int32(math.MaxInt32), msg.MaxCount},
		{"just under the cap", int64(msg.MaxCount - 1), msg.MaxCount - 1},
		{"huge float", 1e300, msg.MaxCount},
		{"infinity", math.Inf(1), msg.MaxCount},
		{"negative infinity", math.Inf(-1), 0},
		{"NaN", math.NaN(), 0},
		{"int64 min", int64(math.MinInt64), 0},
		{"very negative string", "-99999999999999999999", 0},
		{"fractional float", 2.5, 2},
		{"garbage string", "ten", 0},
		{"a table", map[string]any{"a": 1}, 0},
		{"a bool", true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, h := range []string{msg.HeaderRetryCount, msg.HeaderRequeueCount, msg.HeaderCrashCount} {
				in := msg.Read(&msg.Message{Headers: map[string]any{h: tc.v}}, "q", "", now)
				got := map[string]int{msg.HeaderRetryCount: in.Retries, msg.HeaderRequeueCount: in.Requeues,
					msg.HeaderCrashCount: in.Crashes}[h]
				if got != tc.want {
					t.Errorf("%s = %v read as %d, want %d", h, tc.v, got, tc.want)
				}
				if in.Attempt < 1 || in.Attempt != in.Retries+1 {
					t.Errorf("%s = %v: attempt %d (retries %d)", h, tc.v, in.Attempt, in.Retries)
				}
			}
		})
	}
}

// Counters are written as int64 so that no value Hopper reads back wraps
// around when it is written on the next copy.
func TestCopiesWriteCountersAsInt64(t *testing.T) {
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	m := &msg.Message{Headers: map[string]any{
		msg.HeaderRetryCount: "9223372036854775807", msg.HeaderRequeueCount: uint64(math.MaxUint64),
		msg.HeaderCrashCount: int64(math.MaxInt64), msg.HeaderReplayCount: int64(math.MaxInt64)}}
	in := msg.Read(m, "q", "", now)
	copies := map[string]*msg.Message{
		"retry":   msg.RetryCopy(m, in, in.Attempt, 500, now),
		"requeue": msg.RequeueCopy(m, in, in.Requeues+1),
		"return":  msg.ReturnCopy(m, in),
		"dlq":     msg.DLQCopy(m, in, msg.DeadLetter{Reason: "max-attempts", Status: 500, Retries: in.Attempt, Now: now}),
	}
	for kind, cp := range copies {
		for _, h := range []string{msg.HeaderRetryCount, msg.HeaderRequeueCount, msg.HeaderCrashCount, msg.HeaderFinalRetryCount} {
			v, ok := cp.Headers[h]
			if !ok {
				continue
			}
			if n, isInt64 := v.(int64); !isInt64 || n < 0 || n > msg.MaxCount+1 {
				t.Errorf("%s copy: %s = %#v, want an int64 in [0, %d]", kind, h, v, msg.MaxCount+1)
			}
		}
		back := msg.Read(cp, "q", "", now)
		if back.Retries < 0 || back.Retries > msg.MaxCount || back.Attempt < 1 {
			t.Errorf("%s copy reads back as retries %d attempt %d", kind, back.Retries, back.Attempt)
		}
	}
	copies["replay"] = msg.ReplayCopy(m, "q.dlq", now, false, false)
	if v, ok := copies["replay"].Headers[msg.HeaderReplayCount].(int64); !ok || v != msg.MaxCount {
		t.Errorf("replay copy: %s = %#v, want int64 %d", msg.HeaderReplayCount, copies["replay"].Headers[msg.HeaderReplayCount], msg.MaxCount)
	}
	if n := msg.ReplayCount(copies["replay"]); n != msg.MaxCount {
		t.Errorf("replay count after a replay of a saturated count = %d, want %d", n, msg.MaxCount)
	}
}

// The broker extends x-death when a delay tier's TTL dead-letters a copy;
// an x-death it cannot read (a list of strings a publisher wrote) stops
// that, and the message never leaves the tier. Every copy moves such a
// value aside and keeps a readable one as it is.
func TestCopiesKeepDeathReadable(t *testing.T) {
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	bad := []any{"not a table", int32(7)}
	good := []any{map[string]any{"queue": "q", "reason": "expired", "count": int64(1)}}
	for _, tc := range []struct {
		v        any
		readable bool
	}{{bad, false}, {"junk", false}, {good, true}, {[]any{}, true}} {
		m := &msg.Message{Headers: map[string]any{msg.HeaderDeath: tc.v}}
		in := msg.Read(m, "q", "", now)
		for kind, cp := range map[string]*msg.Message{
			"retry": msg.RetryCopy(m, in, 1, 500, now), "return": msg.ReturnCopy(m, in),
			"dlq":    msg.DLQCopy(m, in, msg.DeadLetter{Reason: "max-attempts", Now: now}),
			"replay": msg.ReplayCopy(m, "q.dlq", now, false, false),
		} {
			_, has := cp.Headers[msg.HeaderDeath]
			_, aside := cp.Headers[msg.HeaderInvalidDeath]
			if has != tc.readable || aside == tc.readable {
				t.Errorf("%s copy of x-death %#v: kept %v, set aside %v", kind, tc.v, has, aside)
			}
		}
		if _, still := m.Headers[msg.HeaderDeath]; !still {
			t.Errorf("the delivered message's own headers were changed")
		}
	}
}
