package dlq

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// MarksQueue is the queue that keeps the console's marks on the failure
// groups of dlq (which groups an operator marked ignored), beside the DLQ
// on the broker, so that they outlive any one console and every console
// looking at the DLQ sees the same ones. It holds console marks only,
// never a dead letter.
func MarksQueue(dlq string) string { return dlq + ".console-marks" }

// MarksType is the AMQP type property of a marks message; MarksFormat the
// version of its body that this code writes and reads.
const (
	MarksType   = "hopper.console-marks"
	MarksFormat = 1
)

// Mark is one group marked ignored: by whom (the token's label and
// address), when, and how many messages the group held then.
type Mark struct {
	By       string    `json:"by"`
	At       time.Time `json:"at,omitzero"`
	Messages int       `json:"messages,omitempty"`
}

// Marks is the whole set of marks of one DLQ, as one message of its
// MarksQueue holds it. Every change stores a new set with Seq one higher
// than the set it was made from; a reader takes the highest Seq, so a
// set that could not yet be removed after its successor was stored is
// simply outdated.
type Marks struct {
	Format  int       `json:"format"`
	DLQ     string    `json:"dlq"`
	Seq     int64     `json:"seq"`
	Updated time.Time `json:"updated,omitzero"`
	By      string    `json:"by,omitempty"`
	// Ignored are the marked groups by group id.
	Ignored map[string]Mark `json:"ignored"`
}

// Clone is a copy of m that shares nothing with it.
func (m Marks) Clone() Marks {
	m.Ignored = maps.Clone(m.Ignored)
	if m.Ignored == nil {
		m.Ignored = map[string]Mark{}
	}
	return m
}

// IDs are the ids of the groups marked ignored, sorted.
func (m Marks) IDs() []string {
	return slices.Sorted(maps.Keys(m.Ignored))
}

// ErrNotMarks means a message of a marks queue is not a set of console
// marks this code can read. Nothing is changed over it: it is left in the
// queue for an operator to look at (or the queue deleted, which clears
// every mark).
var ErrNotMarks = errors.New("not a set of console marks")

// EncodeMarks is the persistent message that stores m.
func EncodeMarks(m Marks) (*msg.Message, error) {
	m = m.Clone()
	m.Format = MarksFormat
	body, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode marks: %w", err)
	}
	return &msg.Message{
		MessageID:   "console-marks-" + strconv.FormatInt(m.Seq, 10),
		Type:        MarksType,
		ContentType: "application/json",
		// Persistent: the marks must survive a restart of the broker as
		// the queue they are in does.
		DeliveryMode: 2,
		Timestamp:    m.Updated,
		Headers:      map[string]any{},
		Body:         body,
	}, nil
}

// DecodeMarks reads the marks a message of dlq's MarksQueue stores. A
// message that is not one (another type, a body that is not the JSON of
// Marks, another DLQ's) or that a newer Hopper wrote in a format this one
// does not know fails with ErrNotMarks: rewriting it would lose what it
// says.
func DecodeMarks(dlq string, m *msg.Message) (Marks, error) {
	var out Marks
	if m.Type != MarksType {
		return out, fmt.Errorf("%w: message %q has type %q, want %q", ErrNotMarks, m.MessageID, m.Type, MarksType)
	}
	if err := json.Unmarshal(m.Body, &out); err != nil {
		return Marks{}, fmt.Errorf("%w: message %q: %w", ErrNotMarks, m.MessageID, err)
	}
	if out.Format != MarksFormat {
		return Marks{}, fmt.Errorf("%w: message %q is in format %d, this Hopper reads format %d", ErrNotMarks, m.MessageID, out.Format, MarksFormat)
	}
	if out.DLQ != dlq {
		return Marks{}, fmt.Errorf("%w: message %q holds the marks of %q, not of %q", ErrNotMarks, m.MessageID, out.DLQ, dlq)
	}
	if out.Ignored == nil {
		out.Ignored = map[string]Mark{}
	}
	return out, nil
}

// LatestMarks is the newest of the sets read from a marks queue (the
// highest Seq; the later update between equal ones), and the index of it
// in sets; -1 with the empty set of dlq when there is none.
func LatestMarks(dlq string, sets []Marks) (Marks, int) {
	best := -1
	for i, m := range sets {
		if best < 0 || m.Seq > sets[best].Seq || m.Seq == sets[best].Seq && m.Updated.After(sets[best].Updated) {
			best = i
		}
	}
	if best < 0 {
		return Marks{Format: MarksFormat, DLQ: dlq, Ignored: map[string]Mark{}}, -1
	}
	return sets[best].Clone(), best
}

// Next is the set that follows m once change has been made to a copy of
// it: one Seq higher, updated now by who.
func (m Marks) Next(now time.Time, who string, change func(*Marks)) Marks {
	n := m.Clone()
	n.Format = MarksFormat
	change(&n)
	n.Seq = m.Seq + 1
	n.Updated, n.By = now.UTC(), who
	return n
}
