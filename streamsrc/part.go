package streamsrc

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// part is one stream a Source reads: the stream itself, or one partition
// of a super stream. Each keeps its own offsets under the consumer name,
// and the stored offset of each only ever names an offset at or below
// which everything read from that stream is settled. Its fields are under
// the Source's mu unless atomic.
type part struct {
	name string
	// value is name as a header value, made once: every message read
	// carries it (msg.HeaderStream), and boxing the string for each one
	// would allocate each time.
	value any
	// offsets follows what was read from the stream since reading it
	// last started: a single active consumer starts afresh, after the
	// offset stored then, each time it is promoted.
	offsets *Offsets
	// stored is the last offset stored, -1 for none.
	stored int64
	// save stores an offset for the consumer name on this stream; nil
	// while the stream is not subscribed.
	save func(int64) error
	// ahead gives the credits of the subscription to this stream; nil
	// while it is not subscribed, or subscribed through a super stream
	// consumer, whose credits the client gives.
	ahead *readAhead
	// lastSeen is the stream's last committed chunk and its last message
	// when last read.
	lastSeen struct{ committed, last int64 }
	// active is false while a single active consumer stands by.
	active atomic.Bool
	// pos is the position last looked up.
	pos atomic.Pointer[Position]
}

func newPart(name string) *part {
	return &part{name: name, value: name, offsets: NewOffsets(), stored: -1, lastSeen: struct{ committed, last int64 }{-1, -1}}
}

// partNamed returns the part of the stream called name, made when the
// source has not read it before (a partition added to a super stream).
func (s *Source) partNamed(name string) *part {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.parts {
		if p.name == name {
			return p
		}
	}
	p := newPart(name)
	s.parts = append(s.parts, p)
	return p
}

// logFor is the log of what concerns p: the source's own, with the
// partition named for a super stream.
func (s *Source) logFor(p *part) *slog.Logger {
	if s.o.SuperStream {
		return s.log.With("partition", p.name)
	}
	return s.log
}

// partList is the parts as they are now.
func (s *Source) partList() []*part {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*part(nil), s.parts...)
}

// startAt says where a subscription to p reads from: after the last offset
// read, when this source has read p before; else after the offset the
// broker stored for the consumer; else where the options say a new
// consumer starts.
func (s *Source) startAt(env *stream.Environment, p *part) (stream.OffsetSpecification, error) {
	s.mu.Lock()
	tracker := p.offsets
	s.mu.Unlock()
	if next, ok := tracker.Next(); ok {
		return stream.OffsetSpecification{}.Offset(next), nil
	}
	stored, err := env.QueryOffset(s.o.Consumer, p.name)
	switch {
	case errors.Is(err, stream.OffsetNotFoundError):
		return s.firstStart(), nil
	case err != nil:
		return stream.OffsetSpecification{}, fmt.Errorf("query the stored offset of %s: %w", p.name, err)
	}
	tracker.Resume(stored)
	s.mu.Lock()
	p.stored = stored
	s.mu.Unlock()
	return stream.OffsetSpecification{}.Offset(stored + 1), nil
}

// promote is told by the broker whether this single active consumer is
// now the active reader of its name on p, and answers where it starts:
// after the offset stored now (by whichever reader was active before),
// with a new tracker, since what the last active reader left unsettled is
// to be read again. A standby stores nothing. A reader the broker sets
// aside while active (it hands a partition of a super stream to another
// reader) first stores what it settled, so that the next one starts
// there.
func (s *Source) promote(env *stream.Environment, p *part, active bool) stream.OffsetSpecification {
	log := s.logFor(p)
	if !active {
		if p.active.Load() {
			s.storePart(p)
		}
		p.active.Store(false)
		log.Info("another reader of the consumer name is active; standing by", "event", "STREAM_STANDBY")
		return stream.OffsetSpecification{}.Next()
	}
	fresh := NewOffsets()
	stored, err := env.QueryOffset(s.o.Consumer, p.name)
	spec := stream.OffsetSpecification{}
	switch {
	case errors.Is(err, stream.OffsetNotFoundError):
		spec, stored = s.firstStart(), -1
	case err != nil:
		// Where the last reader stopped is unknown: from the first message
		// kept, every one is read again rather than one skipped.
		log.Warn("could not read the stored offset on promotion; reading the stream from its first message",
			"event", "STREAM_OFFSET_UNKNOWN", "error", err.Error())
		spec, stored = spec.First(), -1
	default:
		fresh.Resume(stored)
		spec = spec.Offset(stored + 1)
	}
	s.mu.Lock()
	p.offsets, p.stored = fresh, stored
	s.mu.Unlock()
	p.active.Store(true)
	log.Info("promoted: the active reader of the consumer name", "event", "STREAM_ACTIVE", "from", spec.String())
	return spec
}

// storePart writes p's settled offset on the broker when it moved, unless
// this reader stands by on p.
func (s *Source) storePart(p *part) {
	if !p.active.Load() {
		return
	}
	s.mu.Lock()
	save, stored, tracker := p.save, p.stored, p.offsets
	s.mu.Unlock()
	off, ok := tracker.Settled()
	if !ok || off <= stored || save == nil {
		return
	}
	if err := save(off); err != nil {
		s.logFor(p).Warn("could not store the stream offset; storing it again later", "event", "STREAM_OFFSET_STORE_FAILED",
			"offset", off, "error", err.Error())
		return
	}
	s.mu.Lock()
	p.stored = max(p.stored, off)
	s.mu.Unlock()
}
