package msg

import (
	"strconv"
	"time"
)

// Info is what Hopper knows about a delivery beyond the message itself,
// read from its headers: where it was first published, how often it was
// tried and requeued, and its deadline. The app receives it as request
// headers; the outcome table decides from it.
type Info struct {
	// Queue is the work queue the message was consumed from.
	Queue string
	// Exchange and RoutingKey are the ones it was first published with,
	// also after a delay tier or a give-back delivered it again through the
	// default exchange.
	Exchange   string
	RoutingKey string
	// Retries is the number of failed attempts so far (x-retry-count);
	// Attempt, the 1-based number of the delivery in progress, is one more.
	Retries int
	Attempt int
	// Requeues is the number of 425 requeues so far (x-requeue-count).
	Requeues int
	// Crashes is the number of times a request with this message ended with
	// the app dying under it (x-hopper-crash-count).
	Crashes int
	// Deadline is when the message goes stale; zero when it has none.
	Deadline time.Time
	// Suspect says the message is to be delivered on its own
	// (x-hopper-crash-suspect).
	Suspect bool
	// Due is when a scheduled message may be delivered; zero when it is
	// not scheduled or scheduling is off. Read does not set it: the
	// delivery loop does, with scheduling on (see When).
	Due time.Time
	// Route is the route the queue's routing rules chose for the message,
	// "" for none: the app URL is then the queue's own. It is not read
	// from the headers; the delivery loop sets it.
	Route string
}

// Read reads a delivery's history. deadlineHeader names an optional
// application header holding an absolute deadline; now is the time of
// receipt, from which an AMQP expiration is counted on a first delivery.
func Read(m *Message, queue, deadlineHeader string, now time.Time) Info {
	// Counters come from whoever published the message: each is read
	// saturating into [0, MaxCount], so the attempt built on it is always
	// a small positive number.
	in := Info{
		Queue:      queue,
		Exchange:   m.Exchange,
		RoutingKey: m.RoutingKey,
		Retries:    Counter(m.Headers[HeaderRetryCount]),
		Requeues:   Counter(m.Headers[HeaderRequeueCount]),
		Crashes:    Counter(m.Headers[HeaderCrashCount]),
		Deadline:   deadline(m, deadlineHeader, now),
		Suspect:    m.Headers[HeaderCrashSuspect] == true,
	}
	in.Attempt = in.Retries + 1
	if _, moved := m.Headers[HeaderOriginalRoutingKey]; moved {
		in.Exchange = m.String(HeaderOriginalExchange)
		in.RoutingKey = m.String(HeaderOriginalRoutingKey)
	}
	return in
}

// deadline is, in order: Hopper's own header (pinned on an earlier move,
// never reset), the configured deadline header, or the AMQP expiration
// counted from first receipt.
func deadline(m *Message, header string, now time.Time) time.Time {
	if ms, ok := m.Int(HeaderDeadline); ok && ms > 0 {
		return time.UnixMilli(ms)
	}
	if header != "" {
		if t, ok := ParseTime(m.Headers[header]); ok {
			return t
		}
	}
	if m.Expiration != "" {
		if ms, err := strconv.ParseInt(m.Expiration, 10, 64); err == nil && ms >= 0 {
			return now.Add(time.Duration(ms) * time.Millisecond)
		}
	}
	return time.Time{}
}

// ParseTime reads an absolute time header: an AMQP timestamp, an RFC 3339
// string, or Unix milliseconds.
func ParseTime(v any) (time.Time, bool) {
	switch x := v.(type) {
	case time.Time:
		return x, true
	case string:
		if t, err := time.Parse(time.RFC3339Nano, x); err == nil {
			return t, true
		}
	}
	if ms, ok := AsInt(v); ok && ms > 0 {
		return time.UnixMilli(ms), true
	}
	return time.Time{}, false
}

// When reads when a message may be delivered: Hopper's own due time
// (pinned = true: written on an earlier hop), else the publisher's
// absolute time (HeaderNotBefore), else x-delay counted from now, the
// time of receipt. Zero when it says nothing, or nothing readable; an
// x-delay of zero or less, as the plugin does, means at once. parked says
// the message is back from a parking queue and has not reached the app
// since.
func When(m *Message, now time.Time) (due time.Time, pinned, parked bool) {
	parked = m.Headers[HeaderParked] == true
	if ms, ok := m.Int(HeaderDue); ok && ms > 0 {
		return time.UnixMilli(ms), true, parked
	}
	if v, ok := m.Headers[HeaderNotBefore]; ok {
		if t, ok := ParseTime(v); ok {
			return t, false, parked
		}
	}
	if ms, ok := AsInt(m.Headers[HeaderDelay]); ok && ms > 0 {
		// Saturating: a hostile delay of years is refused as too far
		// by the schedule, never overflowed into the past.
		return now.Add(time.Duration(min(ms, maxDelayMillis)) * time.Millisecond), false, parked
	}
	return time.Time{}, false, parked
}

// maxDelayMillis bounds an x-delay read, well within a time.Duration.
const maxDelayMillis = int64(100 * 365 * 24 * time.Hour / time.Millisecond)
