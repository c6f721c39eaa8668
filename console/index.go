package console

import (
	"cmp"
	"encoding/hex"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
)

// Index is what one scan of a DLQ learnt: the failure group of every
// message, by message id. It keeps no bodies and no headers beyond the
// group key, which is stored once per group, so a DLQ of a hundred
// thousand messages costs a few megabytes: per message its id, its
// dead-letter time and the number of its group.
type Index struct {
	groups []*Group
	byKey  map[dlq.GroupKey]int32
	// entries are in the order the scan read them: the DLQ's order.
	entries []entry
	// Scanned counts the messages indexed; Oldest and Newest are their
	// dead-letter times (zero when none had one).
	Scanned        int
	Oldest, Newest time.Time
	// Runs counts, per replay run, its messages that failed again and are
	// back in the DLQ.
	Runs map[string]int
}

type entry struct {
	id    string
	at    int64 // dead-letter time in Unix milliseconds; 0 unknown
	group int32
}

// Group is one failure group of a DLQ.
type Group struct {
	// ID names the group in URLs: a hash of its key, so that it stays the
	// same across rescans.
	ID  string       `json:"id"`
	Key dlq.GroupKey `json:"key"`
	// Count is the number of its messages; Share their part of the DLQ
	// (0 to 1).
	Count int     `json:"count"`
	Share float64 `json:"share"`
	// First and Last are the earliest and latest dead-letter times.
	First time.Time `json:"first,omitzero"`
	Last  time.Time `json:"last,omitzero"`
	// Sample is the message id of one of its messages, and SampleError
	// that message's x-final-error as it was (the key holds only its
	// fingerprint).
	Sample      string `json:"sample"`
	SampleError string `json:"sampleError,omitempty"`
	// Queues are the original queues its messages came from.
	Queues []string `json:"queues"`
	// Ignored is true while an operator has it marked ignored; IgnoredBy
	// and IgnoredAt say who marked it and when.
	Ignored   bool      `json:"ignored"`
	IgnoredBy string    `json:"ignoredBy,omitempty"`
	IgnoredAt time.Time `json:"ignoredAt,omitzero"`
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{byKey: map[dlq.GroupKey]int32{}, Runs: map[string]int{}}
}

// Add indexes one message.
func (ix *Index) Add(m *msg.Message) {
	key := dlq.GroupOf(m)
	gi, ok := ix.byKey[key]
	if !ok {
		gi = int32(len(ix.groups))
		ix.byKey[key] = gi
		ix.groups = append(ix.groups, &Group{ID: GroupID(key), Key: key, Sample: m.MessageID, SampleError: m.String(msg.HeaderFinalError)})
	}
	g := ix.groups[gi]
	g.Count++
	if key.ReplayRun != "" {
		if _, seen := ix.Runs[key.ReplayRun]; !seen {
			key.ReplayRun = strings.Clone(key.ReplayRun)
		}
		ix.Runs[key.ReplayRun]++
	}
	if q := msg.OriginalQueue(m); q != "" && !slices.Contains(g.Queues, q) {
		g.Queues = append(g.Queues, q)
	}
	// A clone, so that the id does not keep alive whatever buffer the
	// message was decoded from.
	e := entry{id: strings.Clone(m.MessageID), group: gi}
	if t, ok := msg.DeadLetterTime(m); ok {
		e.at = t.UnixMilli()
		t = time.UnixMilli(e.at).UTC()
		if g.First.IsZero() || t.Before(g.First) {
			g.First = t
		}
		if t.After(g.Last) {
			g.Last = t
		}
		if ix.Oldest.IsZero() || t.Before(ix.Oldest) {
			ix.Oldest = t
		}
		if t.After(ix.Newest) {
			ix.Newest = t
		}
	}
	ix.entries = append(ix.entries, e)
	ix.Scanned++
}

// GroupID is the stable name of a group key.
func GroupID(k dlq.GroupKey) string {
	h := fnv.New64a()
	for _, s := range []string{k.Reason, k.Status, k.Fingerprint, k.RoutingKey} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	// Only when set, so that a group's id stays what it was before runs
	// were named.
	if k.ReplayRun != "" {
		h.Write([]byte(k.ReplayRun))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Groups returns copies of the groups, largest first (then by key, so the
// order is stable), each with its share of the messages indexed.
func (ix *Index) Groups() []Group {
	out := make([]Group, len(ix.groups))
	for i, g := range ix.groups {
		out[i] = *g
		out[i].Queues = slices.Clone(g.Queues)
		if ix.Scanned > 0 {
			out[i].Share = float64(g.Count) / float64(ix.Scanned)
		}
	}
	slices.SortFunc(out, func(a, b Group) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return out
}

// Group returns the group named id.
func (ix *Index) Group(id string) (Group, bool) {
	for _, g := range ix.Groups() {
		if g.ID == id {
			return g, true
		}
	}
	return Group{}, false
}

// Entry is one indexed message.
type Entry struct {
	ID string `json:"id"`
	// DeadLettered is zero when the message had no time.
	DeadLettered time.Time `json:"deadLettered,omitzero"`
}

// Messages returns up to limit messages of the group named id, in the
// DLQ's order, and how many it has.
func (ix *Index) Messages(id string, limit int) ([]Entry, int) {
	gi := int32(-1)
	for i, g := range ix.groups {
		if g.ID == id {
			gi = int32(i)
		}
	}
	if gi < 0 {
		return nil, 0
	}
	var out []Entry
	for _, e := range ix.entries {
		if e.group != gi {
			continue
		}
		if len(out) == limit {
			break
		}
		en := Entry{ID: e.id}
		if e.at != 0 {
			en.DeadLettered = time.UnixMilli(e.at).UTC()
		}
		out = append(out, en)
	}
	return out, ix.groups[gi].Count
}

// GroupOfMessage returns the group of the message with id (the first
// indexed with it).
func (ix *Index) GroupOfMessage(id string) (Group, bool) {
	for _, e := range ix.entries {
		if e.id == id {
			g := *ix.groups[e.group]
			return g, true
		}
	}
	return Group{}, false
}
