package dlq

import (
	"hash/fnv"
	"strconv"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/schedule"
)

// The parking queues of scheduled messages are read by the same means as
// a DLQ (see Browse and Rotation), with one difference. A parking queue
// delays every message by its x-message-ttl from when it entered, so a
// copy rotated to its tail would wait a whole delay again: a message with
// a second left in the 1h queue would come back an hour late. Each
// message read is instead handed back where the schedule puts it now
// (Reparker): the parking queue of the longest step its time left
// allows, or the work queue once it is due. That is one more hop of the
// kind Hopper makes itself, from the absolute due time the message
// carries, so it reaches the app as close to its due time as without the
// listing; and like a rotation it is publish → confirm → ack, spending no
// delivery of a quorum queue's delivery limit.

// Parked is a message waiting in a parking queue, as listed.
type Parked struct {
	ID string `json:"id"`
	// Due is when it may be delivered; zero when it does not say.
	Due time.Time `json:"due,omitzero"`
	// Left is how long until Due when it was read; negative once due.
	Left time.Duration `json:"-"`
	// LeftMs is Left in milliseconds, for JSON.
	LeftMs int64 `json:"leftMs"`
	// Queue is the parking queue it was read from.
	Queue string `json:"parkQueue"`
	// RoutingKey is the one it was first published with.
	RoutingKey string `json:"routingKey,omitempty"`
}

// Reparker lists the messages read from a queue's parking queues and
// says where each goes back (see Rotation.To). The parking queues are
// read longest first: a message only ever moves to a shorter step (or
// out to the work queue), so one Hopper moves while the listing runs is
// met again in a queue not read yet rather than missed, and is listed
// once.
type Reparker struct {
	Policy schedule.Policy
	// Work is the work queue: where a message goes once due.
	Work string
	// Park is the parking queue of a step, false when there is none.
	Park func(step time.Duration) (string, bool)
	// Now is the clock; default time.Now.
	Now func() time.Time

	// ours counts, by queue, the copies handed back there by this
	// listing and not read since; seen the messages listed.
	ours map[string]map[string]int
	seen map[string]bool
	// Again counts the messages read a second time and not listed
	// again: moved to a shorter step while the listing ran, or
	// identical copies (same id, due time and body) parked twice.
	Again int
}

func (r *Reparker) now() time.Time {
	if r.Now == nil {
		return time.Now()
	}
	return r.Now()
}

// identity tells copies of one message apart from other messages.
func identity(m *msg.Message) string {
	h := fnv.New64a()
	h.Write(m.Body) //nolint:errcheck // never fails
	due, _ := m.Int(msg.HeaderDue)
	return m.MessageID + "\x00" + strconv.FormatInt(due, 10) + "\x00" + strconv.FormatUint(h.Sum64(), 16)
}

// Read is a message read from queue: its listing, and false when it is
// not listed because this listing has shown it already (its own copy, or
// one met again; see Again).
func (r *Reparker) Read(queue string, m *msg.Message) (Parked, bool) {
	id := identity(m)
	if n := r.ours[queue][id]; n > 0 {
		r.ours[queue][id] = n - 1
		return Parked{}, false
	}
	if r.seen[id] {
		r.Again++
		return Parked{}, false
	}
	if r.seen == nil {
		r.seen = map[string]bool{}
	}
	r.seen[id] = true
	p := Parked{ID: m.MessageID, Queue: queue, RoutingKey: msg.OriginalRoutingKey(m)}
	if due, ok := m.Int(msg.HeaderDue); ok && due > 0 {
		p.Due = time.UnixMilli(due).UTC()
		p.Left = p.Due.Sub(r.now())
		p.LeftMs = p.Left.Milliseconds()
	}
	return p, true
}

// To is where the message read from queue goes back: the work queue when
// it is due (less than half a step left, as Hopper decides), else the
// parking queue of the longest step not past its due time. A message
// that says no due time stays in queue.
func (r *Reparker) To(queue string, m *msg.Message) string {
	to := queue
	if ms, ok := m.Int(msg.HeaderDue); ok && ms > 0 {
		dec := r.Policy.Decide(schedule.When{Due: time.UnixMilli(ms), Pinned: true}, r.now())
		switch dec.Action {
		case schedule.Deliver:
			to = r.Work
		case schedule.Park:
			if q, ok := r.Park(dec.Step); ok {
				to = q
			}
		}
	}
	if r.ours == nil {
		r.ours = map[string]map[string]int{}
	}
	if r.ours[to] == nil {
		r.ours[to] = map[string]int{}
	}
	r.ours[to][identity(m)]++
	return to
}
