package broker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/internal/backoff"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

// Delivery is one message received on a consumer channel. Ack and Nack go to
// that channel only; once it is gone they fail with ErrChannelGone and the
// broker has already put the message back in the queue.
type Delivery struct {
	m   *msg.Message
	tag uint64
	s   *session
}

// ErrChannelGone means the delivery's channel closed: it cannot be settled,
// and the broker redelivers it.
var ErrChannelGone = errors.New("delivery channel is closed; the broker will redeliver the message")

// Alive reports whether the delivery's channel is still open. A delivery of
// a dead channel has already been requeued by the broker: delivering it to
// the app would only make a duplicate.
func (d *Delivery) Alive() bool { return !d.s.dead.Load() && !d.s.ch.IsClosed() }

// Message returns the broker-neutral message.
func (d *Delivery) Message() *msg.Message { return d.m }

// Tag is the delivery tag on the channel it came from.
func (d *Delivery) Tag() uint64 { return d.tag }

// Server is the address and port of the broker connection the delivery
// came on ("" and 0 when unknown).
func (d *Delivery) Server() (string, int) {
	if d.s == nil || d.s.conn == nil {
		return "", 0
	}
	addr := d.s.conn.RemoteAddr()
	if addr == nil {
		return "", 0
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String(), 0
	}
	n, _ := strconv.Atoi(port)
	return host, n
}

// Ack acknowledges the delivery on its own channel.
func (d *Delivery) Ack() error {
	if d.s.dead.Load() {
		return ErrChannelGone
	}
	if d.s.acker != nil {
		if err := d.s.acker.ack(d.tag, time.Now()); err != nil {
			return fmt.Errorf("ack: %w", err)
		}
		return nil
	}
	if err := d.s.ch.Ack(d.tag, false); err != nil { // multiple=false
		return fmt.Errorf("ack: %w", err)
	}
	return nil
}

// SendAcks puts on the wire the acks of the delivery's channel that wait
// to be coalesced and may go now: those below its oldest delivery not yet
// settled. A caller that settles deliveries in groups (a batch) calls it
// once a group is settled, so that the group's acks go as one frame at
// once rather than waiting for more acks or for the next periodic flush,
// the messages of the group counting against the prefetch all that time.
func (d *Delivery) SendAcks() error {
	if d.s.dead.Load() || d.s.acker == nil {
		return nil
	}
	if err := d.s.acker.sendReady(); err != nil {
		return fmt.Errorf("send acks: %w", err)
	}
	return nil
}

// Nack rejects the delivery on its own channel; requeue puts it back.
func (d *Delivery) Nack(requeue bool) error {
	if d.s.dead.Load() {
		return ErrChannelGone
	}
	if d.s.acker != nil {
		if err := d.s.acker.nack(d.tag, requeue); err != nil {
			return fmt.Errorf("nack: %w", err)
		}
		return nil
	}
	if err := d.s.ch.Nack(d.tag, false, requeue); err != nil { // multiple=false
		return fmt.Errorf("nack: %w", err)
	}
	return nil
}

// session is one connection and consumer channel.
type session struct {
	conn *amqp.Connection
	ch   *amqp.Channel
	dead atomic.Bool
	// acker coalesces acks on a consumer channel (nil for tools that get
	// one message at a time).
	acker    *acker
	stopAck  chan struct{}
	stopOnce sync.Once
}

// ackInterval is how long an ack may wait to be coalesced with others.
const ackInterval = 2 * time.Millisecond

func (s *session) startAcker() {
	s.acker = newAcker(s.ch)
	s.stopAck = make(chan struct{})
	go flushEvery(s.acker, ackInterval, s.stopAck)
}

// end sends the acks still held (when the channel is alive) and stops the
// acker.
func (s *session) end() {
	s.stopOnce.Do(func() {
		if s.acker != nil {
			if !s.dead.Load() && !s.ch.IsClosed() {
				s.acker.flush(time.Now(), true) //nolint:errcheck // a dead channel: the broker redelivers
			}
			close(s.stopAck)
		}
	})
}

// ConsumerOptions configure a Consumer. Zero values take the defaults
// named.
type ConsumerOptions struct {
	// Options are the connection's when the consumer runs alone (Run); in a
	// Group the group's connection options apply. Name defaults to
	// "hopper-consumer".
	Options
	// Queue is the queue consumed. Required.
	Queue string
	// Prefetch is the per-consumer QoS until Resume sets another. Default 0
	// (unlimited): callers always set it.
	Prefetch int
	// PrefetchBytes bounds the message bytes the consumer's unsettled
	// deliveries may take, whatever prefetch it is asked for (see
	// Consumer). Default 0: the prefetch alone bounds them.
	PrefetchBytes int
	// Topology is declared or verified (as it says) on every new connection
	// before consuming, so a queue deleted under Hopper comes back. An error
	// is retried with backoff.
	Topology *topology.Plan
	// OnReconnect, when set, is told each time a lost consumer is back,
	// with the reason it was lost (metrics, trace events). In a Group the
	// group's OnReconnect is told of a lost connection instead.
	OnReconnect func(reason string)
	// Quorum says the queue is a quorum queue, which counts every return of
	// a message (a nack, a closed channel) against its delivery limit.
	// Deliveries received but never handed over when the consumer stops at
	// shutdown are then given back as a republished copy → confirm → ack
	// through Publisher instead of a nack. Default false.
	Quorum bool
	// Publisher publishes those copies; without one they are nacked.
	Publisher *Publisher
	// Ordered, set for a queue consumed in order, says whether a message
	// must keep its place in line (a message without an ordering key need
	// not). Those of the copies above are logged and told to OnOrderBroken:
	// they went to the tail of the queue, behind messages that came after
	// them. Both optional.
	Ordered       func(m *msg.Message) bool
	OnOrderBroken func(n int)
	// DeadlineHeader names the application header holding a message's
	// absolute deadline, pinned on the copy as on every give-back. Default
	// "" (none).
	DeadlineHeader string
	// SingleActive says the queue has a single active consumer, so the
	// consumer follows whether it is the one the broker delivers to (see
	// Role). Default false.
	SingleActive bool
	// Priority, when not 0, is the consumer's priority (x-priority). On a
	// single-active-consumer quorum queue of RabbitMQ 4.0 or later the
	// broker makes the consumer of highest priority the active one, and
	// hands over to a higher one that subscribes once the active one has
	// settled what it holds. Default 0 (none).
	Priority int
	// KeepActive keeps a registered consumer of a single-active-consumer
	// queue registered while paused and when its prefetch changes (the
	// change waits for the next registration): cancelling it would hand
	// the active role to a standby while this one still holds unacked
	// messages, and the standby would deliver the messages behind them
	// first. Paused, it takes no more than its prefetch. For queues
	// consumed in order. Default false.
	KeepActive bool
	// StandbyCheck is how often a single-active consumer that has received
	// nothing looks at the queue's ready messages to tell standby from
	// idle. Default 2s.
	StandbyCheck time.Duration
}

// Roles of a consumer on a single-active-consumer queue (see Role).
const (
	// RoleActive: the broker delivers to this consumer.
	RoleActive = "active"
	// RoleStandby: another consumer of the queue is active; this one takes
	// over when that one goes.
	RoleStandby = "standby"
	// RoleIdle: nothing has been delivered and the queue is empty, so
	// active and standby look alike.
	RoleIdle = "idle"
)

// Consumer keeps one consumer on a queue alive across connection loss,
// broker restarts and broker-side cancels, re-preparing and re-consuming each
// time with jittered backoff. It runs alone (Run) or as one member of a
// Group, which shares one connection between the consumers of several
// queues, each on a channel of its own.
//
// Pause and Resume let the circuit breaker stop deliveries while the app is
// down without dropping the connection: a paused consumer is cancelled on
// the broker, so prefetched messages are not pushed to Hopper and returned
// messages stay in the queue for other consumers or for later.
//
// With PrefetchBytes set, the bytes held are bounded from the first
// delivery on, whatever prefetch SetPrefetch or Resume ask for. The broker
// counts messages, not bytes (RabbitMQ does not implement a prefetch
// size), so the consumer turns the budget into a count: 1 until it has
// seen a body, then the budget over the size of recent bodies (at least
// 1: a message larger than the whole budget is delivered alone, never
// refused). A new prefetch needs a new broker consumer, and the old one's
// deliveries are still held when it starts, so a new consumer starts only
// once those and its own prefetch fit in the budget together; until then
// the consumer waits for settles. The bound holds exactly for bodies no
// larger than those seen recently; a body larger than any before lowers
// the prefetch at once, and only the deliveries already pushed can exceed
// it. Deliveries of a lost connection are not counted on the new one: the
// broker has requeued them, and they are dropped as their workers find
// the channel gone, but until then they are still in memory.
type Consumer struct {
	opts  ConsumerOptions
	group atomic.Pointer[Group]

	mu       sync.Mutex
	cur      *session
	paused   map[string]bool // why consuming is paused; empty when it is not
	prefetch int             // asked for by the caller; capped by bytes in want
	sizes    bodySize        // recent bodies, for PrefetchBytes
	wake     chan struct{}
	active   atomic.Bool
	started  atomic.Bool // a consumer was registered at least once
	// Reconnects counts sessions after the first.
	Reconnects atomic.Int64
	// Reconsumes counts consumers started again on a live connection after
	// the broker cancelled one (queue deleted, quorum leader moved).
	Reconsumes atomic.Int64

	// delivered: a delivery came on the broker consumer registered now;
	// waitingChecks counts the standby checks in a row since it was
	// registered that saw ready messages while it received none.
	delivered     atomic.Bool
	waitingChecks atomic.Int32
}

// Role says, for a single-active-consumer queue, whether this consumer is
// the one the broker delivers to: "" while no consumer is registered.
//
// AMQP 0-9-1 tells a consumer nothing when it becomes the active one (the
// broker's management API and rabbitmqctl list_consumers show it; the
// protocol does not), so the role is read from what the consumer sees. The
// broker keeps the active consumer until it is cancelled or its channel
// closes, and delivers to no other meanwhile; so a consumer that has
// received a delivery since it was registered is the active one, until it
// is registered anew. One that has received nothing while the queue held
// ready messages at two checks in a row (StandbyCheck apart: an active
// consumer with room in its prefetch is sent ready messages at once) is a
// standby. One that has received nothing from an empty queue cannot tell:
// it is idle, and becomes active or standby as messages arrive. A standby
// learns it took over only when its first delivery arrives.
func (c *Consumer) Role() string {
	switch {
	case !c.active.Load():
		return ""
	case c.delivered.Load():
		return RoleActive
	case c.waitingChecks.Load() >= 2:
		return RoleStandby
	}
	return RoleIdle
}

// SingleActive reports whether the queue has a single active consumer.
func (c *Consumer) SingleActive() bool { return c.opts.SingleActive }

// checkStandby looks at the queue's ready messages for a single-active
// consumer that has received nothing yet, on a channel of its own (a
// failed passive declare closes its channel).
func (c *Consumer) checkStandby(s *session) {
	if c.delivered.Load() {
		return
	}
	ch, err := s.conn.Channel()
	if err != nil {
		return // the session's own watchers see a closed connection
	}
	defer closeQuietly(ch)
	q, err := declarePassive(ch, c.opts.Queue)
	switch {
	case err != nil || c.delivered.Load():
	case q.Messages > 0:
		if c.waitingChecks.Add(1) == 2 {
			c.opts.logger().Info("single active consumer: another consumer of the queue is active; standing by",
				"event", "CONSUMER_STANDBY", "queue", c.opts.Queue, "ready", q.Messages)
		}
	default:
		c.waitingChecks.Store(0)
	}
}

// NewConsumer returns a consumer; Run starts it, or a Group it is added to.
func NewConsumer(o ConsumerOptions) *Consumer {
	if o.Name == "" {
		o.Name = "hopper-consumer"
	}
	return &Consumer{opts: o, prefetch: o.Prefetch, paused: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// Connected reports whether the consumer's connection is up (consuming or
// deliberately paused).
func (c *Consumer) Connected() bool {
	g := c.group.Load()
	return g != nil && g.connected.Load()
}

// Started reports whether a consumer was ever registered on the broker by
// this Consumer.
func (c *Consumer) Started() bool { return c.started.Load() }

// Active reports whether a consumer is registered on the broker now.
func (c *Consumer) Active() bool { return c.active.Load() }

// Paused reports whether consuming is paused for any reason.
func (c *Consumer) Paused() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.paused) > 0
}

// PauseReasons lists why consuming is paused, sorted; empty when it is not.
func (c *Consumer) PauseReasons() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(maps.Keys(c.paused))
}

// Reasons to pause. Each holds the consumer paused on its own: consuming
// resumes once none is left.
const (
	// PauseBreaker: the app is unavailable and the circuit breaker is open.
	PauseBreaker = "app unavailable"
	// PauseMoves: moving a message (to a delay tier, the DLQ or back to the
	// work queue) keeps failing; taking more would only pile up held
	// deliveries.
	PauseMoves = "moves failing"
	// PauseRefused: the app refuses Hopper's credentials (a 401 to every
	// request); messages wait in the queue until it accepts a probe. A
	// reason of its own, so that the breaker closing (the app is up) does
	// not lift it.
	PauseRefused = "app refuses Hopper's credentials"
)

// PauseFor cancels the consumer on the broker and keeps it cancelled,
// across reconnects, until ResumeFor is called with the same reason and no
// other reason holds it.
func (c *Consumer) PauseFor(reason string) {
	c.mu.Lock()
	c.paused[reason] = true
	c.mu.Unlock()
	c.poke()
}

// ResumeFor drops one reason to pause.
func (c *Consumer) ResumeFor(reason string) {
	c.mu.Lock()
	delete(c.paused, reason)
	c.mu.Unlock()
	c.poke()
}

// Pause pauses for the circuit breaker.
func (c *Consumer) Pause() { c.PauseFor(PauseBreaker) }

// Resume ends the circuit breaker's pause and consumes with the given
// prefetch (0 keeps the configured one), capped by PrefetchBytes like any
// other: a paused consumer comes back no larger than the budget allows.
func (c *Consumer) Resume(prefetch int) { c.ResumeWith(PauseBreaker, prefetch) }

// ResumeWith drops one reason to pause, as ResumeFor does, and consumes
// with the given prefetch (0 keeps the configured one) once no other
// reason holds it, capped by PrefetchBytes like any other.
func (c *Consumer) ResumeWith(reason string, prefetch int) {
	if prefetch <= 0 {
		prefetch = c.opts.Prefetch
	}
	c.mu.Lock()
	delete(c.paused, reason)
	c.prefetch = prefetch
	c.mu.Unlock()
	c.poke()
}

// SetPrefetch changes the prefetch without touching a pause. The broker
// applies a prefetch to consumers started after it is set, so a change
// means a new consumer on the same channel: deliveries already received
// stay with Hopper and are settled as usual. Callers change it seldom.
func (c *Consumer) SetPrefetch(prefetch int) {
	if prefetch <= 0 {
		return
	}
	c.mu.Lock()
	c.prefetch = prefetch
	c.mu.Unlock()
	c.poke()
}

// Prefetch is the prefetch the consumer runs (or will run) with: the one
// asked for, capped by PrefetchBytes.
func (c *Consumer) Prefetch() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cappedLocked()
}

// Requested is the prefetch last asked for by SetPrefetch or Resume (or
// the configured one), before PrefetchBytes caps it.
func (c *Consumer) Requested() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.prefetch
}

// roomLocked is how many deliveries fit in PrefetchBytes at the size of recent
// bodies: 1 before any body was seen, at least 1 always, 0 without a
// budget (no bound).
func (c *Consumer) roomLocked() int {
	budget := c.opts.PrefetchBytes
	if budget <= 0 {
		return 0
	}
	if !c.sizes.seen {
		return 1
	}
	return max(1, int(float64(budget)/c.sizes.est))
}

// cappedLocked is the prefetch asked for, bounded by room.
func (c *Consumer) cappedLocked() int {
	if room := c.roomLocked(); room > 0 {
		return min(c.prefetch, room)
	}
	return c.prefetch
}

// received notes a delivery's body size. The consume loop is woken when
// the room it gives changes enough to start a new consumer: at the first
// body (the prefetch of 1 taken before any size was known grows to what
// the budget holds), when a larger body lowers it (at once: memory is the
// risk), or when smaller bodies raised it half again.
func (c *Consumer) received(body int) {
	if c.opts.PrefetchBytes <= 0 {
		return
	}
	c.mu.Lock()
	seen, before := c.sizes.seen, c.roomLocked()
	c.sizes.observe(body)
	after := c.roomLocked()
	c.mu.Unlock()
	if !seen || after < before || after >= before+before/2 && after > before {
		c.poke()
	}
}

// bodySize follows the size of recent bodies from above: it takes a larger
// body at once (memory is the risk) and drifts down toward smaller ones,
// 1/32 of the way per delivery, so a run of small messages after large
// ones regains the prefetch over a few dozen deliveries while a single
// small one does not let a burst of large ones in.
type bodySize struct {
	est  float64 // bytes; at least 1 once seen
	seen bool
}

func (b *bodySize) observe(n int) {
	s := float64(max(n, 1))
	if !b.seen || s > b.est {
		b.est, b.seen = s, true
		return
	}
	b.est += (s - b.est) / 32
}

// replace says whether a consumer running with cur must make way for one
// with prefetch: always when prefetch is lower (the budget or the caller
// asks for less); when higher, if the caller asked for exactly that, or if
// it is half again as large, so that a body-size estimate drifting down
// does not start a new consumer for every step.
func replace(cur, prefetch, requested int) bool {
	switch {
	case prefetch < cur:
		return true
	case prefetch > cur:
		return prefetch == requested || prefetch >= cur+cur/2
	}
	return false
}

func (c *Consumer) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// want is what the consume loop should do: pause, or run with prefetch;
// requested is the uncapped prefetch, room the deliveries the byte budget
// holds (0: no budget).
func (c *Consumer) want() (paused bool, prefetch, requested, room int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.paused) > 0, c.cappedLocked(), c.prefetch, c.roomLocked()
}

// Run consumes until ctx is done, calling handle for each delivery from the
// connection's dispatch goroutine (handle must hand off quickly). When ctx
// is done it cancels the consumer so no new deliveries arrive, gives back
// those it received but had not handed over yet, and keeps the channel open
// so in-flight deliveries can still be settled; Close ends it.
func (c *Consumer) Run(ctx context.Context, handle func(*Delivery)) error {
	g := NewGroup(c.opts.Options, c.opts.OnReconnect)
	g.Add(c, handle)
	return g.Run(ctx)
}

// consume runs one session until it fails or ctx is done, and says why it
// ended. Within the session it follows Pause and Resume.
func (c *Consumer) consume(ctx context.Context, s *session, handle func(*Delivery)) string {
	connClosed := s.conn.NotifyClose(make(chan *amqp.Error, 1))
	chClosed := s.ch.NotifyClose(make(chan *amqp.Error, 1))
	cancels := s.ch.NotifyCancel(make(chan string, 4))
	blocked := s.conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go drain(blocked)

	c.mu.Lock()
	c.cur = s
	c.mu.Unlock()
	defer c.active.Store(false)
	var standby <-chan time.Time
	if c.opts.SingleActive {
		every := c.opts.StandbyCheck
		if every <= 0 {
			every = 2 * time.Second
		}
		tick := time.NewTicker(every)
		defer tick.Stop()
		standby = tick.C
	}

	var (
		deliveries <-chan amqp.Delivery
		tag        string
		seq        int
		curPrefch  int
		// keptPaused: a KeepActive consumer was told it is paused.
		keptPaused bool
	)
	// stop cancels the broker consumer. What the library had already
	// buffered is handed over when pausing (the breaker returns it); at
	// shutdown it is given back to the queue at once (with held, a
	// delivery taken but not handed over), never left to the channel's
	// close, which a quorum queue counts against each message's delivery
	// limit.
	stop := func(handOver bool, held ...amqp.Delivery) error {
		c.active.Store(false)
		err := s.ch.Cancel(tag, false) // noWait=false
		left := held
		for d := range deliveries {
			if handOver {
				s.acker.register(d.DeliveryTag)
				handle(newDelivery(&d, s))
			} else {
				left = append(left, d)
			}
		}
		deliveries = nil
		c.giveBack(s, left)
		return err
	}
	// take hands a delivery over.
	take := func(d amqp.Delivery) {
		s.acker.register(d.DeliveryTag)
		c.received(len(d.Body))
		if c.opts.SingleActive && !c.delivered.Swap(true) {
			c.opts.logger().Info("single active consumer: this consumer is the active one", "event", "CONSUMER_ACTIVE",
				"queue", c.opts.Queue, "consumer_tag", tag)
		}
		handle(newDelivery(&d, s))
	}
	for {
		paused, prefetch, requested, room := c.want()
		keep := c.opts.KeepActive && c.opts.SingleActive
		if keep && deliveries != nil && paused != keptPaused {
			keptPaused = paused
			if paused {
				c.opts.logger().Info("consumer paused; it stays registered to keep the single active consumer's role and takes no more than its prefetch",
					"event", "CONSUMER_PAUSED", "queue", c.opts.Queue, "prefetch", curPrefch)
			}
		}
		if deliveries != nil && !keep && (paused || replace(curPrefch, prefetch, requested)) {
			if err := stop(true); err != nil {
				return fmt.Sprintf("cancel consumer: %v", err)
			}
			if paused {
				c.opts.logger().Info("consumer paused", "event", "CONSUMER_PAUSED", "queue", c.opts.Queue)
			}
		}
		// The deliveries of earlier consumers on this channel are still
		// held: a new consumer's prefetch comes on top of them, so under a
		// byte budget it starts once both fit.
		waitRoom := false
		if deliveries == nil && !paused && room > 0 {
			_, waitRoom = s.acker.heldOver(room-prefetch, c.wake)
		}
		if deliveries == nil && !paused && !waitRoom {
			// RabbitMQ applies a per-consumer prefetch (global=false) to
			// consumers started after it is set, so a new prefetch needs a
			// new consumer.
			if err := s.ch.Qos(prefetch, 0, false); err != nil { // prefetchSize=0, global=false
				return fmt.Sprintf("set prefetch: %v", err)
			}
			seq++
			tag = fmt.Sprintf("hopper-%s-%d-%d-%d", c.opts.Queue, c.Reconnects.Load(), c.Reconsumes.Load(), seq)
			var args amqp.Table
			if c.opts.Priority != 0 {
				args = amqp.Table{"x-priority": int32(c.opts.Priority)}
			}
			// Consume, not ConsumeWithContext: the client starts a
			// goroutine per consumer that waits for the context or the
			// channel's close, and a cancelled consumer does not end it.
			// With a prefetch that follows the limit this loop replaces
			// its consumer again and again on one channel, and each
			// replacement would leave a goroutine behind for as long as
			// the channel lives. The loop cancels its consumer itself
			// when ctx ends (stop).
			d, err := s.ch.Consume(c.opts.Queue, tag,
				false, // autoAck
				false, // exclusive
				false, // noLocal
				false, // noWait
				args)
			if err != nil {
				return fmt.Sprintf("consume: %v", err)
			}
			deliveries, curPrefch = d, prefetch
			c.delivered.Store(false)
			c.waitingChecks.Store(0)
			c.active.Store(true)
			c.started.Store(true)
			c.opts.logger().Info("consuming", "event", "CONSUMER_STARTED", "queue", c.opts.Queue, "prefetch", prefetch, "consumer_tag", tag)
		}

		select {
		case <-ctx.Done():
			// Stop taking deliveries; keep the channel for in-flight acks.
			if deliveries != nil {
				if err := stop(false); err != nil {
					c.opts.logger().Warn("cancel consumer", "error", err.Error())
				}
			}
			return "shutdown"
		case <-c.wake:
		case <-standby:
			if deliveries != nil {
				c.checkStandby(s)
			}
		case e := <-connClosed:
			return fmt.Sprintf("connection closed: %v", e)
		case e := <-chClosed:
			return fmt.Sprintf("channel closed: %v", e)
		case t := <-cancels:
			if t != tag || deliveries == nil {
				continue // an earlier consumer of this channel, already replaced
			}
			if ctx.Err() != nil {
				// Shutting down cancels the consumer too (the select does
				// not prefer ctx): this is Hopper stopping, not the broker
				// cancelling.
				if err := stop(false); err != nil {
					c.opts.logger().Warn("cancel consumer", "error", err.Error())
				}
				return "shutdown"
			}
			if reason := c.reconsume(ctx, s, t, &deliveries, handle); reason != "" {
				return reason
			}
		case d, ok := <-deliveries:
			if ctx.Err() != nil {
				// Shutting down (the select does not prefer ctx): d and
				// the rest go back to the queue, not to the handler.
				var held []amqp.Delivery
				if ok {
					held = append(held, d)
				}
				if err := stop(false, held...); err != nil {
					c.opts.logger().Warn("cancel consumer", "error", err.Error())
				}
				return "shutdown"
			}
			if !ok {
				// The library closes the delivery channel when the broker
				// cancels the consumer; the cancel notice may still be on
				// its way.
				if s.ch.IsClosed() || s.conn.IsClosed() {
					return "delivery channel closed"
				}
				deliveries = nil
				if reason := c.reconsume(ctx, s, tag, &deliveries, handle); reason != "" {
					return reason
				}
				continue
			}
			take(d)
			// What the client has buffered meanwhile is taken in one go,
			// up to consumeBurst deliveries: the select above, which
			// watches shutdown, the settings and the connection, cost more
			// than the rest of a delivery's way through here. A burst
			// stops at shutdown and when the settings changed (wake holds
			// a signal), which the loop's top then reads; a closed
			// delivery channel is left to the select, where it is seen
			// again.
		burst:
			for range consumeBurst {
				if ctx.Err() != nil || len(c.wake) > 0 {
					break
				}
				select {
				case d, ok := <-deliveries:
					if !ok {
						break burst
					}
					take(d)
				default:
					break burst
				}
			}
		}
	}
}

// consumeBurst is the most deliveries the consumer takes from the client's
// buffer between two looks at its settings and its connection.
const consumeBurst = 64

// giveBack returns deliveries the consumer received but never handed over,
// at shutdown, while their channel is still open: on a classic queue a nack
// with requeue; on a quorum queue, which counts a nack or the channel's
// close against the message's delivery limit, a copy made as every
// give-back makes it (msg.ReturnCopy: counters, origin and deadline kept)
// is published to the queue, and the original acked once the copy is
// confirmed. A copy that cannot be published leaves its original nacked,
// the one way left to keep it. A dead channel's deliveries are already
// back in the queue.
func (c *Consumer) giveBack(s *session, ds []amqp.Delivery) {
	if len(ds) == 0 || s.dead.Load() || s.ch.IsClosed() {
		return
	}
	log := c.opts.logger()
	settleFailed := func(d *Delivery, op string, err error) {
		log.Warn("could not settle delivery; the broker will redeliver it", "event", "SETTLE_FAILED",
			"op", op, "message_id", d.m.MessageID, "error", err.Error())
	}
	back := make([]*Delivery, len(ds))
	for i := range ds {
		s.acker.register(ds[i].DeliveryTag)
		back[i] = newDelivery(&ds[i], s)
	}
	if !c.opts.Quorum || c.opts.Publisher == nil {
		for _, d := range back {
			if err := d.Nack(true); err != nil { // requeue
				settleFailed(d, "nack", err)
			}
		}
		log.Info("deliveries not yet handed over returned to the queue", "event", "SHUTDOWN_RETURNED",
			"queue", c.opts.Queue, "count", len(back))
		return
	}
	// Two confirm waits bound each publish; a broker that blocks publishing
	// must not hold the shutdown longer.
	ctx, cancel := context.WithTimeout(context.Background(), 2*c.opts.Publisher.opts.ConfirmTimeout)
	defer cancel()
	now := time.Now()
	var (
		wg     sync.WaitGroup
		nacked atomic.Int64
		broken atomic.Int64
	)
	for _, d := range back {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cp := msg.ReturnCopy(d.m, msg.Read(d.m, c.opts.Queue, c.opts.DeadlineHeader, now))
			if err := c.opts.Publisher.Publish(ctx, c.opts.Queue, cp); err != nil {
				nacked.Add(1)
				log.Warn("could not republish a returned message; nacking it instead", "event", "RETURN_NACKED",
					"queue", c.opts.Queue, "message_id", d.m.MessageID, "error", err.Error())
				if err := d.Nack(true); err != nil { // requeue
					settleFailed(d, "nack", err)
				}
				return
			}
			if c.opts.Ordered != nil && c.opts.Ordered(d.m) {
				broken.Add(1)
			}
			if err := d.Ack(); err != nil {
				// The copy exists and the original comes back: a duplicate.
				settleFailed(d, "ack after return", err)
			}
		}()
	}
	wg.Wait()
	republished := int64(len(back)) - nacked.Load()
	log.Info("deliveries not yet handed over returned to the queue", "event", "SHUTDOWN_RETURNED",
		"queue", c.opts.Queue, "count", len(back), "republished", republished)
	if n := broken.Load(); n > 0 {
		log.Warn("ordered messages returned to the tail of the queue at shutdown; later messages may come first",
			"event", "ORDER_BROKEN", "queue", c.opts.Queue, "count", n, "reason", "returned")
		if c.opts.OnOrderBroken != nil {
			c.opts.OnOrderBroken(int(n))
		}
	}
}

// reconsume handles a consumer the broker cancelled (its queue was deleted,
// its quorum leader moved, the node hosting it went down) while the channel
// and connection live on. Deliveries already received stay valid on this
// channel: they are handed over, and the acks held for settled ones go out
// now, so none of them is redelivered. The topology is prepared again (a
// deleted queue comes back) with backoff, and the loop then consumes anew
// on the same channel. It returns a reason when the session must end.
func (c *Consumer) reconsume(ctx context.Context, s *session, tag string, deliveries *<-chan amqp.Delivery,
	handle func(*Delivery)) string {
	log := c.opts.logger()
	c.active.Store(false)
	if *deliveries != nil {
		for d := range *deliveries {
			s.acker.register(d.DeliveryTag)
			handle(newDelivery(&d, s))
		}
		*deliveries = nil
	}
	if err := s.acker.flush(time.Now(), false); err != nil {
		return fmt.Sprintf("flush acks after consumer cancel: %v", err)
	}
	log.Warn("consumer cancelled by the broker; consuming again on the same connection",
		"event", "CONSUMER_CANCELLED", "queue", c.opts.Queue, "consumer_tag", tag)
	bo := backoff.Backoff{Min: c.opts.ReconnectMin, Max: c.opts.ReconnectMax}
	for {
		err := prepare(ctx, s.conn, c.opts.Topology)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return "shutdown"
		}
		if s.conn.IsClosed() || s.ch.IsClosed() {
			return fmt.Sprintf("prepare topology after consumer cancel: %v", err)
		}
		wait := bo.Next()
		log.Warn("topology not ready after consumer cancel; retrying", "event", "TOPOLOGY_RETRY",
			"error", err.Error(), "retry_in", wait.String())
		if backoff.Sleep(ctx, wait) != nil {
			return "shutdown"
		}
	}
	c.Reconsumes.Add(1)
	if c.opts.OnReconnect != nil {
		c.opts.OnReconnect(fmt.Sprintf("consumer %s cancelled by the broker", tag))
	}
	return ""
}

// Close closes the consumer's connection (in a Group, the connection all
// its members share). Unsettled deliveries go back to the queue: the broker
// requeues everything a closed channel held.
func (c *Consumer) Close() error {
	if g := c.group.Load(); g != nil {
		return g.Close()
	}
	return nil
}

func drain[T any](ch <-chan T) {
	for range ch { //nolint:revive // only keeps the reader goroutine unblocked
	}
}
