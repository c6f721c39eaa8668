package msg_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// TestCopies: one table over every kind of copy Hopper publishes. Each row
// gives the headers the copy must have (nil: must be absent); every other
// header must be the original's, and the original must not change.
func TestCopies(t *testing.T) {
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	stamp := now.Format(time.RFC3339Nano)
	deadline := now.Add(time.Hour)
	// A message on its third attempt, delivered again from a tier through
	// the default exchange, with a history and an application header.
	orig := func() *msg.Message {
		return &msg.Message{
			Exchange: "", RoutingKey: "orders", MessageID: "m1", Body: []byte("b"), Expiration: "60000",
			Headers: map[string]any{
				msg.HeaderRetryCount:         int32(2),
				msg.HeaderRequeueCount:       int32(1),
				msg.HeaderOriginalExchange:   "shop",
				msg.HeaderOriginalRoutingKey: "order.created",
				msg.HeaderFirstFailureTime:   "2026-05-06T06:00:00Z",
				msg.HeaderDeath:              []any{map[string]any{"queue": "orders.retry.5s", "reason": "expired"}},
				msg.HeaderDeliveryCount:      int64(4),
				msg.HeaderAcquiredCount:      int64(6),
				"tenant":                     "acme",
			},
		}
	}
	in := msg.Read(orig(), "orders", "", now)
	in.Deadline = deadline
	pinned := map[string]any{
		msg.HeaderOriginalExchange: "shop", msg.HeaderOriginalRoutingKey: "order.created",
		msg.HeaderDeadline: deadline.UnixMilli(),
	}
	with := func(extra map[string]any) map[string]any {
		out := map[string]any{}
		for k, v := range pinned {
			out[k] = v
		}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}
	cases := []struct {
		name string
		copy func(*msg.Message) *msg.Message
		want map[string]any
	}{
		{"retry", func(m *msg.Message) *msg.Message { return msg.RetryCopy(m, in, 3, 503, now) }, with(map[string]any{
			msg.HeaderRetryCount: int64(3), msg.HeaderRequeueCount: int64(1),
			msg.HeaderLastFailureTime: stamp, msg.HeaderLastStatusCode: int64(503),
			msg.HeaderFirstFailureTime: "2026-05-06T06:00:00Z", // kept, never reset
		})},
		{"requeue", func(m *msg.Message) *msg.Message { return msg.RequeueCopy(m, in, 2) }, with(map[string]any{
			msg.HeaderRetryCount: int64(2), msg.HeaderRequeueCount: int64(2),
		})},
		{"give-back", func(m *msg.Message) *msg.Message { return msg.ReturnCopy(m, in) }, with(map[string]any{
			msg.HeaderRetryCount: int64(2), msg.HeaderRequeueCount: int64(1),
		})},
		{"dlq", func(m *msg.Message) *msg.Message {
			return msg.DLQCopy(m, in, msg.DeadLetter{Reason: "max-attempts", Status: 503, Error: "HTTP 503: " + strings.Repeat("x", 1000),
				Retries: 3, TraceID: "abc", Now: now})
		}, with(map[string]any{
			msg.HeaderRetryCount: int64(3), msg.HeaderRequeueCount: int64(1),
			msg.HeaderOriginalQueue: "orders", msg.HeaderDeadLetterReason: "max-attempts",
			msg.HeaderFinalStatusCode: int64(503), msg.HeaderFinalRetryCount: int64(3),
			msg.HeaderFinalError:      msg.Truncate("HTTP 503: "+strings.Repeat("x", 1000), msg.MaxErrorLen),
			msg.HeaderLastFailureTime: stamp, msg.HeaderDeadLetterTime: stamp, msg.HeaderTraceID: "abc",
			msg.HeaderFirstFailureTime: "2026-05-06T06:00:00Z",
		})},
	}
	// A replay takes a DLQ copy out again: the DLQ stamp goes, the history
	// stays, the replay is counted.
	dlqCopy := msg.DLQCopy(orig(), in, msg.DeadLetter{Reason: "max-attempts", Status: 503, Retries: 3, Now: now})
	replayWant := with(map[string]any{
		msg.HeaderRetryCount: int64(3), msg.HeaderRequeueCount: int64(1),
		msg.HeaderOriginalQueue: "orders", msg.HeaderLastFailureTime: stamp,
		msg.HeaderFirstFailureTime: "2026-05-06T06:00:00Z",
		msg.HeaderReplayCount:      int64(1), msg.HeaderReplayTime: stamp, msg.HeaderReplayedFrom: "orders.dlq",
	})
	cases = append(cases, struct {
		name string
		copy func(*msg.Message) *msg.Message
		want map[string]any
	}{"replay", func(*msg.Message) *msg.Message { return msg.ReplayCopy(dlqCopy, "orders.dlq", now, false, false) }, replayWant})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := orig()
			before := orig()
			cp := tc.copy(m)
			if !reflect.DeepEqual(m.Headers, before.Headers) {
				t.Fatalf("the original's headers changed: %v", m.Headers)
			}
			for k, v := range tc.want {
				if !reflect.DeepEqual(cp.Headers[k], v) {
					t.Errorf("%s = %#v, want %#v", k, cp.Headers[k], v)
				}
			}
			// The quorum queue's counts of the original's returns are
			// not the copy's: it was never returned.
			for _, k := range []string{msg.HeaderDeliveryCount, msg.HeaderAcquiredCount} {
				if v, ok := cp.Headers[k]; ok {
					t.Errorf("%s = %#v carried on the copy", k, v)
				}
			}
			for k, v := range before.Headers {
				if k == msg.HeaderDeliveryCount || k == msg.HeaderAcquiredCount {
					continue
				}
				if _, set := tc.want[k]; !set && !reflect.DeepEqual(cp.Headers[k], v) {
					t.Errorf("%s changed to %#v, want the original %#v", k, cp.Headers[k], v)
				}
			}
			for k := range cp.Headers {
				if _, set := tc.want[k]; !set {
					if _, was := before.Headers[k]; !was {
						t.Errorf("unexpected header %s = %#v", k, cp.Headers[k])
					}
				}
			}
			if cp.MessageID != m.MessageID || string(cp.Body) != string(m.Body) {
				t.Error("identity or body not kept")
			}
			// Read back as the next delivery would see it.
			again := msg.Read(&msg.Message{Exchange: "", RoutingKey: "orders", Headers: cp.Headers}, "orders", "", now.Add(time.Hour))
			if again.Exchange != "shop" || again.RoutingKey != "order.created" || !again.Deadline.Equal(deadline) {
				t.Errorf("read back as %+v", again)
			}
		})
	}
}

// A first failure stamps the first-failure time; a later one keeps it.
func TestRetryCopyFirstFailure(t *testing.T) {
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	m := &msg.Message{RoutingKey: "orders", Headers: map[string]any{}}
	cp := msg.RetryCopy(m, msg.Read(m, "orders", "", now), 1, 500, now)
	if cp.String(msg.HeaderFirstFailureTime) != now.Format(time.RFC3339Nano) {
		t.Fatalf("first failure %q", cp.String(msg.HeaderFirstFailureTime))
	}
	if cp.String(msg.HeaderOriginalRoutingKey) != "orders" {
		t.Fatal("the first move must pin the routing key it was delivered with")
	}
}

func TestRead(t *testing.T) {
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	cases := []struct {
		name string
		m    *msg.Message
		hdr  string
		want msg.Info
	}{
		{"first delivery", &msg.Message{Exchange: "shop", RoutingKey: "k", Headers: map[string]any{}},
			"", msg.Info{Queue: "q", Exchange: "shop", RoutingKey: "k", Attempt: 1}},
		{"counters of any integer type or a string", &msg.Message{Headers: map[string]any{
			msg.HeaderRetryCount: int64(4), msg.HeaderRequeueCount: "2", msg.HeaderCrashCount: uint8(1)}},
			"", msg.Info{Queue: "q", Retries: 4, Attempt: 5, Requeues: 2, Crashes: 1}},
		{"negative counters read as zero", &msg.Message{Headers: map[string]any{msg.HeaderRetryCount: int32(-3)}},
			"", msg.Info{Queue: "q", Attempt: 1}},
		{"expiration counts from receipt", &msg.Message{Expiration: "1500", Headers: map[string]any{}},
			"", msg.Info{Queue: "q", Attempt: 1, Deadline: now.Add(1500 * time.Millisecond)}},
		{"expiration 0 is now", &msg.Message{Expiration: "0", Headers: map[string]any{}},
			"", msg.Info{Queue: "q", Attempt: 1, Deadline: now}},
		{"pinned deadline wins", &msg.Message{Expiration: "1500", Headers: map[string]any{msg.HeaderDeadline: now.Add(-time.Minute).UnixMilli()}},
			"", msg.Info{Queue: "q", Attempt: 1, Deadline: time.UnixMilli(now.Add(-time.Minute).UnixMilli())}},
		{"deadline header as RFC 3339", &msg.Message{Headers: map[string]any{"valid-until": "2026-05-06T08:00:00Z"}},
			"valid-until", msg.Info{Queue: "q", Attempt: 1, Deadline: time.Date(2026, 5, 6, 8, 0, 0, 0, time.UTC)}},
		{"deadline header as a timestamp", &msg.Message{Headers: map[string]any{"valid-until": now.Add(time.Hour)}},
			"valid-until", msg.Info{Queue: "q", Attempt: 1, Deadline: now.Add(time.Hour)}},
		{"garbage expiration is ignored", &msg.Message{Expiration: "soon", Headers: map[string]any{}},
			"", msg.Info{Queue: "q", Attempt: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := msg.Read(tc.m, "q", tc.hdr, now)
			if !got.Deadline.Equal(tc.want.Deadline) {
				t.Errorf("deadline %v, want %v", got.Deadline, tc.want.Deadline)
			}
			got.Deadline, tc.want.Deadline = time.Time{}, time.Time{}
			if got != tc.want {
				t.Errorf("Read = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestTruncateKeepsUTF8(t *testing.T) {
	s := strings.Repeat("é", 400) // 2 bytes each
	got := msg.Truncate(s, msg.MaxErrorLen)
	if len(got) > msg.MaxErrorLen+len("…") || !strings.HasSuffix(got, "…") {
		t.Fatalf("%d bytes", len(got))
	}
	for _, r := range got {
		if r == '\uFFFD' {
			t.Fatal("a UTF-8 sequence was split")
		}
	}
	if msg.Truncate("short", 10) != "short" {
		t.Fatal("a short string changed")
	}
}

// A kept copy is the message as it was, less the broker's count of its
// returns.
func TestKeepCopy(t *testing.T) {
	m := &msg.Message{MessageID: "m", CorrelationID: "c", ContentType: "text/plain", Priority: 2, Body: []byte("b"),
		Headers: map[string]any{msg.HeaderDeliveryCount: int64(3), msg.HeaderAcquiredCount: int64(5), "tenant": "acme", msg.HeaderRetryCount: int32(2)}}
	cp := msg.KeepCopy(m)
	for _, h := range []string{msg.HeaderDeliveryCount, msg.HeaderAcquiredCount} {
		if _, ok := cp.Headers[h]; ok {
			t.Errorf("%s carried on the copy", h)
		}
	}
	if _, ok := m.Headers[msg.HeaderDeliveryCount]; !ok {
		t.Error("the original lost its header")
	}
	want := map[string]any{"tenant": "acme", msg.HeaderRetryCount: int32(2)}
	if !reflect.DeepEqual(cp.Headers, want) {
		t.Errorf("headers %v, want %v", cp.Headers, want)
	}
	cp.Headers = nil
	m.Headers = nil
	if !reflect.DeepEqual(cp, m) {
		t.Errorf("properties changed: %+v", cp)
	}
}

// The properties a person is shown of a message: the set ones, in one
// order, whatever tool shows them.
func TestProperties(t *testing.T) {
	m := &msg.Message{MessageID: "m1", Type: "order", ContentType: "application/json", UserID: "svc",
		Expiration: "60000", Priority: 3, Timestamp: time.Date(2026, 11, 25, 1, 2, 3, 0, time.UTC), Exchange: "shop", RoutingKey: "k"}
	var got []string
	for _, p := range msg.Properties(m) {
		got = append(got, p.Name+"="+p.Value)
	}
	want := []string{"message-id=m1", "type=order", "content-type=application/json", "user-id=svc", "expiration=60000",
		"timestamp=2026-11-25T01:02:03Z", "priority=3"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Properties = %v, want %v", got, want)
	}
}
