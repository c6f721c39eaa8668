package msg

import "time"

// How a message in a DLQ is read: what Hopper stamped on it, or, for a
// message the broker dead-lettered itself, what the broker recorded in
// x-death.

// BrokerReasons are the reasons the broker writes when it dead-letters a
// message itself.
var BrokerReasons = []string{"delivery_limit", "expired", "maxlen", "rejected"}

// OriginalQueue is where a dead-lettered message came from, or "": the
// queue Hopper stamped, else the queue the broker dead-lettered it from.
func OriginalQueue(m *Message) string {
	if q := m.String(HeaderOriginalQueue); q != "" {
		return q
	}
	if d := lastDeath(m); d.queue != "" {
		return d.queue
	}
	return m.String(HeaderFirstDeathQueue)
}

// DeadLetterReason is why the message is in the DLQ, or "": Hopper's
// x-dead-letter-reason, else the reason of the broker's own dead-lettering
// (one of BrokerReasons).
func DeadLetterReason(m *Message) string {
	if r := m.String(HeaderDeadLetterReason); r != "" {
		return r
	}
	if d := lastDeath(m); d.reason != "" {
		return d.reason
	}
	return m.String(HeaderFirstDeathReason)
}

// Origin is the exchange and routing key the message was first published
// with: the ones Hopper pinned, else those recorded by the broker's
// dead-lettering, else the ones it was delivered with; ok is false in the
// last case. A message the broker dead-lettered is delivered from the DLQ
// with the DLQ's routing key, so x-death is the only record of where it was
// going.
func Origin(m *Message) (exchange, routingKey string, ok bool) {
	if _, ok := m.Headers[HeaderOriginalRoutingKey]; ok {
		return m.String(HeaderOriginalExchange), m.String(HeaderOriginalRoutingKey), true
	}
	if d := lastDeath(m); d.ok {
		return d.exchange, d.routingKey, true
	}
	return m.Exchange, m.RoutingKey, false
}

// OriginalRoutingKey is the routing key of Origin.
func OriginalRoutingKey(m *Message) string {
	_, rk, _ := Origin(m)
	return rk
}

// FinalStatus is the message's x-final-status-code; ok is false without one.
func FinalStatus(m *Message) (int, bool) {
	n, ok := m.Int(HeaderFinalStatusCode)
	if !ok || n < 0 || n > 999 {
		// Not a status a server could have sent: shown as unknown.
		return 0, false
	}
	return int(n), true
}

// DeadLetterTime is when the message entered the DLQ: x-dead-letter-time
// when Hopper put it there, else the time of the broker's dead-lettering,
// else its AMQP timestamp. ok is false when none is known.
func DeadLetterTime(m *Message) (time.Time, bool) {
	if t, ok := ParseTime(m.Headers[HeaderDeadLetterTime]); ok {
		return t, true
	}
	if d := lastDeath(m); !d.time.IsZero() {
		return d.time, true
	}
	if !m.Timestamp.IsZero() {
		return m.Timestamp, true
	}
	return time.Time{}, false
}

// ReplayCount is the message's x-replay-count (0 when never replayed).
func ReplayCount(m *Message) int {
	return Counter(m.Headers[HeaderReplayCount])
}

type death struct {
	queue, reason, exchange, routingKey string
	time                                time.Time
	ok                                  bool
}

// lastDeath reads the most recent x-death entry: the dead-lettering that
// put the message where it is now.
func lastDeath(m *Message) death {
	list, ok := m.Headers[HeaderDeath].([]any)
	if !ok || len(list) == 0 {
		return death{}
	}
	e, ok := list[0].(map[string]any)
	if !ok {
		return death{}
	}
	str := func(v any) string {
		switch x := v.(type) {
		case string:
			return x
		case []byte:
			return string(x)
		}
		return ""
	}
	d := death{queue: str(e["queue"]), reason: str(e["reason"]), exchange: str(e["exchange"]), ok: true}
	if keys, ok := e["routing-keys"].([]any); ok && len(keys) > 0 {
		d.routingKey = str(keys[0])
	}
	if t, ok := e["time"].(time.Time); ok {
		d.time = t
	}
	return d
}

// dlqEntryHeaders describe a message's stay in the DLQ; a replayed copy is
// no longer there, and Hopper writes them afresh if it comes back.
var dlqEntryHeaders = []string{
	HeaderDeadLetterReason, HeaderDeadLetterTime,
	HeaderFinalStatusCode, HeaderFinalError, HeaderFinalRetryCount,
}

// attemptHeaders are Hopper's attempt history, cleared by a replay that
// resets attempts.
var attemptHeaders = []string{
	HeaderRetryCount, HeaderRequeueCount, HeaderCrashCount,
	HeaderFirstFailureTime, HeaderLastFailureTime, HeaderLastStatusCode,
}

// ReplayCopy is the copy a replay publishes out of the DLQ dlq: the DLQ
// stamp removed, the attempt history kept (or cleared with resetAttempts),
// the deadline kept (or cleared with clearDeadline), the replay counted, and
// — for a message the broker dead-lettered — its origin pinned from x-death,
// so the app sees the routing key it was first published with.
func ReplayCopy(m *Message, dlq string, now time.Time, resetAttempts, clearDeadline bool) *Message {
	cp := m.Clone()
	for _, h := range dlqEntryHeaders {
		delete(cp.Headers, h)
	}
	if resetAttempts {
		for _, h := range attemptHeaders {
			delete(cp.Headers, h)
		}
	}
	if clearDeadline {
		delete(cp.Headers, HeaderDeadline)
	}
	if _, ok := cp.Headers[HeaderOriginalRoutingKey]; !ok {
		if ex, rk, ok := Origin(m); ok {
			cp.Headers[HeaderOriginalExchange] = ex
			cp.Headers[HeaderOriginalRoutingKey] = rk
		}
	}
	KeepDeathReadable(cp.Headers)
	cp.Headers[HeaderReplayCount] = int64(min(ReplayCount(m)+1, MaxCount))
	cp.Headers[HeaderReplayTime] = now.UTC().Format(time.RFC3339Nano)
	if dlq != "" {
		cp.Headers[HeaderReplayedFrom] = dlq
	}
	return cp
}
