package streamsrc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// Position is where a consumer name stands in its stream, as a running
// reader sees it (Source.Position).
type Position struct {
	// Stored is the offset stored for the consumer name, -1 for none.
	Stored int64
	// First is the oldest offset the stream keeps, Last the offset of
	// its last message; -1 for an empty stream.
	First, Last int64
	// Lag is the offsets after Stored (or from First) up to Last: the
	// backlog of the consumer name. Offset tracking takes offsets too
	// (one per store, of any consumer name of the stream), so among
	// messages it counts those few as well.
	Lag int64
	// At is when the position was taken; zero before the first time.
	At time.Time
}

// lag is the messages after stored up to last, of a stream that keeps
// first..last.
func lag(stored, first, last int64) int64 {
	if last < 0 {
		return 0
	}
	from := max(stored+1, first)
	return max(last-from+1, 0)
}

// Position returns where the consumer name stands, as last looked up
// (every PositionEvery while subscribed); ok is false before the first
// look-up. Of a super stream it is the total over the partitions: Lag
// sums theirs, Stored, First and Last are -1 (offsets of different
// streams do not add up), At is the oldest look-up; Partitions says each.
func (s *Source) Position() (Position, bool) {
	if !s.o.SuperStream {
		for _, p := range s.partList() {
			if pos := p.pos.Load(); pos != nil {
				return *pos, true
			}
		}
		return Position{}, false
	}
	parts := s.Partitions()
	if len(parts) == 0 {
		return Position{}, false
	}
	total := Position{Stored: -1, First: -1, Last: -1, At: parts[0].At}
	for _, p := range parts {
		total.Lag += p.Lag
		if p.At.Before(total.At) {
			total.At = p.At
		}
	}
	return total, true
}

// PartitionPosition is where the consumer name stands on one partition
// of a super stream (on the stream itself, for a stream).
type PartitionPosition struct {
	Stream string
	Position
	// Active is whether this reader is the active one on it.
	Active bool
}

// Partitions returns the position on each stream read that was looked up
// at least once, in the order the streams were listed.
func (s *Source) Partitions() []PartitionPosition {
	var out []PartitionPosition
	for _, p := range s.partList() {
		if pos := p.pos.Load(); pos != nil {
			out = append(out, PartitionPosition{Stream: p.name, Position: *pos, Active: s.connected.Load() && p.active.Load()})
		}
	}
	return out
}

// watch keeps the positions up to date until ctx ends.
func (s *Source) watch(ctx context.Context, env *stream.Environment) {
	t := time.NewTicker(s.o.PositionEvery)
	defer t.Stop()
	parts := s.partList()
	if len(parts) == 0 {
		return
	}
	stats := since311(env, parts[0].name)
	for {
		for _, p := range parts {
			s.observe(env, stats, p)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// observe looks the bounds of p's stream up and keeps its position: the
// stored offset is this reader's own while it is active, the broker's
// (the active reader's) while it stands by. The last message is the last
// one read while nothing was committed after it; otherwise the last
// chunk is read to find it (what follows may be offset tracking only).
// A broker that gives no stats (stats false) says nothing of what was
// committed: both ends are then read off the stream every time.
func (s *Source) observe(env *stream.Environment, stats bool, p *part) {
	first, committed := int64(-1), int64(-1)
	if stats {
		st, err := env.StreamStats(p.name)
		if err != nil {
			s.log.Debug("could not look the stream's stats up", "event", "STREAM_STATS_FAILED", "error", err.Error())
			return
		}
		if c, err := st.CommittedChunkId(); err == nil {
			committed = c
			first, _ = st.FirstOffset()
		}
	} else {
		f, ok, err := firstOffset(env, p.name)
		if err != nil {
			s.log.Debug("could not read the stream's first chunk", "event", "STREAM_STATS_FAILED", "error", err.Error())
			return
		}
		if ok {
			// Unknown: taken as past anything read, so that the last
			// chunk is read again.
			first, committed = f, math.MaxInt64
		}
	}
	s.mu.Lock()
	stored, tracker := p.stored, p.offsets
	s.mu.Unlock()
	read := int64(-1)
	if !p.active.Load() {
		stored = -1
		if off, err := env.QueryOffset(s.o.Consumer, p.name); err == nil {
			stored = off
		} else if !errors.Is(err, stream.OffsetNotFoundError) {
			return
		}
	} else if next, ok := tracker.Next(); ok {
		read = next - 1
	}
	last := read
	if committed > read {
		// Reading the last chunk takes a subscription (and a connection):
		// only when something was committed since the last look-up.
		s.mu.Lock()
		seen := p.lastSeen
		s.mu.Unlock()
		l := seen.last
		if !stats || committed != seen.committed {
			var err error
			if l, _, err = lastOffset(env, p.name); err != nil {
				s.log.Debug("could not read the stream's last chunk", "event", "STREAM_STATS_FAILED", "error", err.Error())
				return
			}
			s.mu.Lock()
			p.lastSeen.committed, p.lastSeen.last = committed, l
			s.mu.Unlock()
		}
		last = max(last, l)
	}
	p.pos.Store(&Position{Stored: stored, First: first, Last: last, Lag: lag(stored, first, last), At: time.Now()})
}

// Status is what the broker says of a consumer name on its stream.
type Status struct {
	Stream   string `json:"stream"`
	Consumer string `json:"consumer"`
	// Stored is the offset stored for the consumer name; HasStored is
	// false when none is (a new consumer starts where queue.stream.offset
	// says).
	Stored    int64 `json:"storedOffset"`
	HasStored bool  `json:"hasStoredOffset"`
	// First and Last are the oldest and the newest offset the stream
	// keeps (-1 for an empty stream); Committed the first offset of its
	// last committed chunk.
	First     int64 `json:"firstOffset"`
	Last      int64 `json:"lastOffset"`
	Committed int64 `json:"committedChunkId"`
	// Lag is the messages after Stored (after First-1 without one) up to
	// Last; of a super stream, the total over its partitions.
	Lag int64 `json:"lagMessages"`
	// Partitions are the status of each partition of a super stream,
	// whose own Stored, First, Last and Committed are -1.
	Partitions []Status `json:"partitions,omitempty"`
}

// Inspect connects to the stream listener and reports the consumer name's
// stored offset and the stream's bounds, the last offset counted exactly
// (by reading the last chunk).
func Inspect(o Options) (Status, error) {
	o.defaults()
	env, err := connect(o)
	if err != nil {
		return Status{}, err
	}
	defer env.Close()
	return inspect(env, o)
}

func connect(o Options) (*stream.Environment, error) {
	quietClient()
	return dial(o, envOptions(o).SetMaxConsumersPerClient(1))
}

func inspect(env *stream.Environment, o Options) (Status, error) {
	if o.SuperStream {
		return inspectSuper(env, o)
	}
	st := Status{Stream: o.Stream, Consumer: o.Consumer, Stored: -1, First: -1, Last: -1, Committed: -1}
	if ok, err := env.StreamExists(o.Stream); err != nil {
		return st, fmt.Errorf("look for the stream: %w", err)
	} else if !ok {
		return st, fmt.Errorf("stream %q: %w", o.Stream, ErrNoStream)
	}
	if since311(env, o.Stream) {
		stats, err := env.StreamStats(o.Stream)
		if err != nil {
			return st, fmt.Errorf("stream stats: %w", err)
		}
		if c, err := stats.CommittedChunkId(); err == nil {
			st.Committed = c
			st.First, _ = stats.FirstOffset()
			if st.Last, _, err = lastOffset(env, o.Stream); err != nil {
				return st, err
			}
		}
	} else {
		// Both ends read off the stream itself; an empty one has neither.
		var err error
		if st.First, _, err = firstOffset(env, o.Stream); err != nil {
			return st, err
		}
		if st.First >= 0 {
			if st.Last, _, err = lastOffset(env, o.Stream); err != nil {
				return st, err
			}
		}
	}
	off, err := env.QueryOffset(o.Consumer, o.Stream)
	switch {
	case errors.Is(err, stream.OffsetNotFoundError):
	case err != nil:
		return st, fmt.Errorf("query the stored offset: %w", err)
	default:
		st.Stored, st.HasStored = off, true
	}
	st.Lag = lag(st.Stored, st.First, st.Last)
	return st, nil
}

// since311 says whether the broker is RabbitMQ 3.11 or later, given a
// stream name that exists: one that answers a request for a stream's
// stats (an older one leaves it unanswered, and the client waits out its
// whole request timeout) and serves super streams. The client knows the
// broker's version but does not tell it. It does refuse, before it sends
// anything, a single active consumer to a broker older than 3.11, and to
// a later one a single active consumer without a name: asking for one
// without a name tells the two apart and subscribes to nothing.
func since311(env *stream.Environment, name string) bool {
	opts := stream.NewConsumerOptions().SetSingleActiveConsumer(stream.NewSingleActiveConsumer(
		func(string, bool) stream.OffsetSpecification { return stream.OffsetSpecification{}.First() }))
	c, err := env.NewConsumer(name, func(stream.ConsumerContext, *amqp.Message) {}, opts)
	if err == nil {
		_ = c.Close() // not expected: the client subscribed after all
		return true
	}
	return !errors.Is(err, stream.SingleActiveConsumerNotSupported)
}

// firstOffset reads the stream's first message and returns its offset, ok
// false when the stream holds none: where the broker cannot say it.
func firstOffset(env *stream.Environment, name string) (int64, bool, error) {
	return firstFrom(env, name, stream.OffsetSpecification{}.First(), "the first chunk")
}

// firstReadTimeout bounds the wait for the first message of a chunk that
// a look-up subscribes at: the broker sends a chunk at once when there is
// one.
const firstReadTimeout = 3 * time.Second

// lastOffset reads the stream's last chunk of messages and returns the
// offset of its last message, ok false when the stream holds none. The
// stream's stats cannot say it: they name chunks, not messages, and the
// last chunk may hold offset tracking, which takes offsets of its own
// (one per store of any consumer name) but is no message.
func lastOffset(env *stream.Environment, name string) (int64, bool, error) {
	var (
		mu   sync.Mutex
		last = int64(-1)
		left = -1
	)
	done := make(chan struct{})
	var once sync.Once
	c, err := env.NewConsumer(name, func(cc stream.ConsumerContext, _ *amqp.Message) {
		mu.Lock()
		defer mu.Unlock()
		if left < 0 {
			left = int(cc.GetEntriesCount())
		}
		last = max(last, cc.Consumer.GetOffset())
		left--
		if left <= 0 {
			once.Do(func() { close(done) })
		}
	}, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.Last()).SetClientProvidedName("hopper-stream-look-up"))
	if err != nil {
		return -1, false, fmt.Errorf("read the last chunk: %w", err)
	}
	defer c.Close() //nolint:errcheck // read-only
	select {
	case <-done:
	case <-time.After(firstReadTimeout):
	}
	mu.Lock()
	defer mu.Unlock()
	return last, last >= 0, nil
}

// firstAt returns the offset of the first message of the first chunk
// written at or after t, ok false when none is yet: the broker finds it,
// for a consumer that subscribes at that time.
func firstAt(env *stream.Environment, name string, t time.Time) (int64, bool, error) {
	return firstFrom(env, name, stream.OffsetSpecification{}.Timestamp(t.UnixMilli()), t.Format(time.RFC3339))
}

// firstFrom subscribes at spec and returns the offset of the first
// message the broker sends, ok false when it sends none in
// firstReadTimeout (there is none yet).
func firstFrom(env *stream.Environment, name string, spec stream.OffsetSpecification, what string) (int64, bool, error) {
	got := make(chan int64, 1)
	c, err := env.NewConsumer(name, func(cc stream.ConsumerContext, _ *amqp.Message) {
		select {
		case got <- cc.Consumer.GetOffset():
		default:
		}
	}, stream.NewConsumerOptions().SetOffset(spec).SetClientProvidedName("hopper-stream-look-up"))
	if err != nil {
		return -1, false, fmt.Errorf("subscribe at %s: %w", what, err)
	}
	defer c.Close() //nolint:errcheck // read-only
	select {
	case off := <-got:
		return off, true, nil
	case <-time.After(firstReadTimeout):
		return -1, false, nil
	}
}

// inspectSuper is inspect for a super stream: each partition's status,
// and the total lag.
func inspectSuper(env *stream.Environment, o Options) (Status, error) {
	st := Status{Stream: o.Stream, Consumer: o.Consumer, Stored: -1, First: -1, Last: -1, Committed: -1}
	names, err := env.QueryPartitions(o.Stream)
	switch {
	case errors.Is(err, stream.StreamDoesNotExist) || err == nil && len(names) == 0:
		return st, fmt.Errorf("super stream %q: %w", o.Stream, ErrNoStream)
	case err != nil:
		return st, fmt.Errorf("list the partitions of super stream %s: %w", o.Stream, err)
	}
	if !since311(env, names[0]) {
		return st, fmt.Errorf("%w: super streams need RabbitMQ 3.11 or later", ErrNoSuperStream)
	}
	for _, name := range names {
		po := o
		po.Stream, po.SuperStream = name, false
		ps, err := inspect(env, po)
		if err != nil {
			return st, err
		}
		st.Lag += ps.Lag
		st.HasStored = st.HasStored || ps.HasStored
		st.Partitions = append(st.Partitions, ps)
	}
	return st, nil
}

// Target is where Seek moves a consumer name: the next message it reads.
type Target struct {
	// Kind is first, last (after the last message: only what is written
	// from now on), offset or time.
	Kind   string
	Offset int64
	Time   time.Time
	// Partition restricts the seek of a super stream to one partition:
	// its stream's name, or its index among the partitions. An offset
	// is one partition's, so a super stream takes one only with it.
	Partition string
}

// ParseTarget reads first, last, an offset number or an RFC 3339 time.
func ParseTarget(s string) (Target, error) {
	s = strings.TrimSpace(s)
	switch s {
	case "first", "last":
		return Target{Kind: s}, nil
	}
	var n int64
	if _, err := fmt.Sscanf(s, "%d", &n); err == nil && fmt.Sprint(n) == s {
		if n < 0 {
			return Target{}, fmt.Errorf("an offset is 0 or more, got %d", n)
		}
		return Target{Kind: "offset", Offset: n}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return Target{Kind: "time", Time: t}, nil
	}
	return Target{}, fmt.Errorf("must be first, last, an offset or an RFC 3339 time, got %q", s)
}

// Move is what Seek did, or would do.
type Move struct {
	Status
	// Next is the offset the consumer name reads next after the move;
	// NewStored the offset stored for that (Next-1). Of a super stream
	// both are -1: Partitions say each.
	Next      int64 `json:"nextOffset"`
	NewStored int64 `json:"newStoredOffset"`
	// LagAfter is the consumer name's lag after the move; of a super
	// stream, like Lag, the total over the partitions moved.
	LagAfter int64 `json:"lagMessagesAfter"`
	// Done is true once the new offset is stored (false on a dry run).
	Done bool `json:"done"`
	// Partitions are the moves of a super stream's partitions, in the
	// order the broker lists them (only the one named by
	// Target.Partition when it is set). They stand for the partitions'
	// status, which the super stream's own Status then leaves out.
	Partitions []Move `json:"partitions,omitempty"`
}

// ErrPartitionNeeded is why Seek refuses an offset for a super stream as
// a whole: each partition counts its own offsets.
var ErrPartitionNeeded = errors.New("an offset is one partition's: name the partition (its stream's name, or its index) to seek a super stream to an offset")

// ErrNoPartition is why Seek refuses a Target.Partition: the super
// stream has no such partition.
var ErrNoPartition = errors.New("no such partition")

// ErrReaderActive is why Seek refuses: a reader of the consumer name is
// running, and would store its own offset over the new one.
var ErrReaderActive = errors.New("a reader of this consumer name is active")

// Seek moves the offset stored for the consumer name so that it reads
// to.Kind next (dry: only says what it would store); of a super stream,
// on every partition, or on the one to.Partition names. A running reader
// stores its own progress over it, so with SingleActive Seek first
// subscribes as the name's single active consumer (of the super stream,
// on every partition) and stores only if the broker makes it the active
// one everywhere: while a Hopper reads, it stands by, and Seek returns
// ErrReaderActive with nothing stored. Without SingleActive the broker
// cannot tell, and the caller must know no reader runs. Every target is
// found before anything is stored: a partition whose target cannot be
// found leaves every partition as it was.
func Seek(o Options, to Target, dry bool) (Move, error) {
	o.defaults()
	if o.SuperStream && to.Kind == "offset" && to.Partition == "" {
		return Move{}, ErrPartitionNeeded
	}
	if !o.SuperStream && to.Partition != "" {
		return Move{}, fmt.Errorf("%s is a stream, not a super stream: it has no partitions to choose from", o.Stream)
	}
	env, err := connect(o)
	if err != nil {
		return Move{}, err
	}
	defer env.Close()
	st, err := inspect(env, o)
	if err != nil {
		return Move{Status: st}, err
	}
	var mv Move
	if o.SuperStream {
		mv, err = moveSuper(env, st, to)
	} else {
		mv, err = moveTo(env, st, to)
	}
	if err != nil || dry {
		return mv, err
	}
	moves := []*Move{&mv}
	if o.SuperStream {
		moves = moves[:0]
		for i := range mv.Partitions {
			moves = append(moves, &mv.Partitions[i])
		}
	}
	store := func() error {
		for i, m := range moves {
			if err := env.StoreOffset(o.Consumer, m.Stream, m.NewStored); err != nil {
				if i > 0 {
					return fmt.Errorf("store the offset of %s (those before it are stored): %w", m.Stream, err)
				}
				return fmt.Errorf("store the offset of %s: %w", m.Stream, err)
			}
			m.Done = true
		}
		mv.Done = true
		return nil
	}
	if !o.SingleActive {
		return mv, store()
	}
	names := []string{o.Stream}
	if o.SuperStream {
		names = names[:0]
		for _, p := range st.Partitions {
			names = append(names, p.Stream)
		}
	}
	subscribe := func(cb func(string, bool) stream.OffsetSpecification) (func(), error) {
		sac := stream.NewSingleActiveConsumer(cb)
		if !o.SuperStream {
			c, err := env.NewConsumer(o.Stream, func(stream.ConsumerContext, *amqp.Message) {},
				stream.NewConsumerOptions().SetConsumerName(o.Consumer).SetManualCommit().
					SetOffset(stream.OffsetSpecification{}.Next()).SetClientProvidedName("hopper-stream-seek").
					SetSingleActiveConsumer(sac))
			return func() { _ = c.Close() }, err
		}
		c, err := env.NewSuperStreamConsumer(o.Stream, func(stream.ConsumerContext, *amqp.Message) {},
			stream.NewSuperStreamConsumerOptions().SetConsumerName(o.Consumer).SetManualCommit().
				SetOffset(stream.OffsetSpecification{}.Next()).SetClientProvidedName("hopper-stream-seek").
				SetSingleActiveConsumer(sac))
		return func() { _ = c.Close() }, err
	}
	return mv, storeHoldingActive(subscribe, names, store)
}

// moveTo works out the move of one stream, whose status is st.
func moveTo(env *stream.Environment, st Status, to Target) (Move, error) {
	mv := Move{Status: st}
	switch to.Kind {
	case "first":
		mv.Next = max(st.First, 0)
	case "last":
		mv.Next = st.Last + 1
	case "offset":
		mv.Next = to.Offset
	case "time":
		off, ok, err := firstAt(env, st.Stream, to.Time)
		if err != nil {
			return mv, err
		}
		mv.Next = off
		if !ok {
			mv.Next = st.Last + 1 // nothing written since
		}
	default:
		return mv, fmt.Errorf("seek to %q", to.Kind)
	}
	mv.NewStored = mv.Next - 1
	mv.LagAfter = lag(mv.NewStored, st.First, st.Last)
	return mv, nil
}

// moveSuper works out the move of each partition of a super stream whose
// status is st (of the one to.Partition names, when set), and the total.
func moveSuper(env *stream.Environment, st Status, to Target) (Move, error) {
	parts := st.Partitions
	if to.Partition != "" {
		p, err := partitionNamed(st, to.Partition)
		if err != nil {
			return Move{Status: st}, err
		}
		parts = []Status{p}
	}
	st.Partitions, st.Lag = nil, 0
	mv := Move{Status: st, Next: -1, NewStored: -1}
	for _, p := range parts {
		pm, err := moveTo(env, p, to)
		if err != nil {
			return mv, fmt.Errorf("partition %s (nothing stored in any partition): %w", p.Stream, err)
		}
		mv.Lag += pm.Lag
		mv.LagAfter += pm.LagAfter
		mv.Partitions = append(mv.Partitions, pm)
	}
	return mv, nil
}

// partitionNamed is the status of the partition name names: its stream's
// name, or its index in the broker's list of them.
func partitionNamed(st Status, name string) (Status, error) {
	var names []string
	for _, p := range st.Partitions {
		if p.Stream == name {
			return p, nil
		}
		names = append(names, p.Stream)
	}
	var i int
	if _, err := fmt.Sscanf(name, "%d", &i); err == nil && fmt.Sprint(i) == name && i >= 0 && i < len(st.Partitions) {
		return st.Partitions[i], nil
	}
	return Status{}, fmt.Errorf("%w %q in super stream %s: it has %s (or their index, 0 to %d)",
		ErrNoPartition, name, st.Stream, strings.Join(names, ", "), len(names)-1)
}

// storeHoldingActive subscribes through subscribe as the consumer name's
// single active consumer of each stream in names and calls store once the broker made it the active one of all,
// or returns ErrReaderActive when another reader stays active on any.
// A reader standing by is promoted when it ends and reads after the
// offsets stored meanwhile. The broker may take a partition of a super
// stream back for a reader that joins; it waits for the answer to that
// update, which waits for a store under way: the joining reader then
// reads after the new offset, and a partition taken before the store
// means nothing is stored.
func storeHoldingActive(subscribe func(func(string, bool) stream.OffsetSpecification) (func(), error), names []string, store func() error) error {
	var mu sync.Mutex
	active := map[string]bool{}
	promoted := make(chan struct{})
	var once sync.Once
	all := func() bool {
		for _, n := range names {
			if !active[n] {
				return false
			}
		}
		return true
	}
	release, err := subscribe(func(name string, isActive bool) stream.OffsetSpecification {
		mu.Lock()
		defer mu.Unlock()
		active[name] = isActive
		if isActive && all() {
			once.Do(func() { close(promoted) })
		}
		return stream.OffsetSpecification{}.Next()
	})
	if errors.Is(err, stream.SingleActiveConsumerNotSupported) {
		return ErrNoSingleActive
	}
	if err != nil {
		return fmt.Errorf("subscribe as the single active consumer: %w", err)
	}
	// Ends the subscription after mu is unlocked: an update waiting for
	// mu holds the connection that the unsubscription is answered on.
	defer release()
	select {
	case <-promoted:
	case <-time.After(firstReadTimeout):
		return ErrReaderActive
	}
	mu.Lock()
	defer mu.Unlock()
	if !all() {
		return ErrReaderActive
	}
	return store()
}
