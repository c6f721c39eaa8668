package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/internal/backoff"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

// Errors a move can end with. In every case the caller must nack the
// original with requeue: the copy may or may not exist, the original must.
var (
	ErrReturned    = errors.New("broker returned the message as unroutable (no such queue)")
	ErrNacked      = errors.New("broker refused the message (publisher nack, e.g. queue full with overflow=reject-publish)")
	ErrConfirmWait = errors.New("no publisher confirm in time")
	// ErrChannelClosed: the publish channel closed before the confirm came
	// (connection lost, channel error); the broker did not refuse the copy.
	ErrChannelClosed = errors.New("publish channel closed before the confirm")
	// ErrTooLarge: the broker closed the channel because the body is
	// larger than its max_message_size (16 MiB by default on RabbitMQ
	// 4.x, 128 MiB on 3.x), which counts the body alone: a copy of a
	// message the broker took fits unless the limit was lowered since.
	ErrTooLarge = errors.New("the broker refuses a message body larger than its max_message_size")
)

// PublisherOptions configure a Publisher. Zero values take the defaults
// named.
type PublisherOptions struct {
	// Options are the connection's; Name defaults to "hopper-publisher".
	Options
	// Channels is the number of confirm-mode channels publishes are spread
	// over. Default 1.
	Channels int
	// InFlight bounds the publishes awaiting their confirm on one channel.
	// Default 256.
	InFlight int
	// ConfirmTimeout bounds the wait for the broker's confirm; a blocked
	// connection restarts it. Default 15s.
	ConfirmTimeout time.Duration
	// Topology lists the plans whose queues the publisher moves messages
	// to. A copy the broker returns as unroutable from one of their queues
	// (through the default exchange) means the queue was deleted: with the
	// plan's Declare the queue is declared again with its planned arguments
	// and the copy published once more; without it the queue is reported
	// missing (MissingQueues, event QUEUE_MISSING) and the publish fails as
	// returned. Default none.
	Topology []*topology.Plan
}

// Publisher publishes moves on its own connection, in confirm mode,
// mandatory and persistent. Publishes are pipelined: many await their
// confirm on one channel at once, each tracked by its sequence number, so
// the broker confirms them in batches instead of one round trip each.
type Publisher struct {
	opts PublisherOptions

	mu     sync.Mutex
	conn   *amqp.Connection
	gen    int // bumped on every new connection
	urlIdx int
	bo     backoff.Backoff
	next   time.Time // no dial before this

	slots []pubSlot
	turn  atomic.Uint64 // round robin over slots

	// blocked is closed while publishing is not blocked. Only the watcher
	// of the current connection (blockedGen) may change it, so a watcher of
	// a connection already replaced can neither unblock nor re-close it.
	blockedMu  sync.Mutex
	blocked    chan struct{}
	blockedGen int
	blockEpoch atomic.Int64 // bumped on every block

	publishSeq atomic.Int64 // the last publish id handed out

	planned *plannedQueues
}

// pubSlot holds one of the publisher's channels, reopened when it is lost.
type pubSlot struct {
	mu sync.Mutex
	ch *pubChannel
}

// pubChannel is one confirm-mode channel and the publishes in flight on it.
type pubChannel struct {
	ch   *amqp.Channel
	gen  int
	room chan struct{} // a token per publish awaiting its confirm

	// closed is closed once the channel is; err then says why.
	closed chan struct{}
	err    error

	// returns receives the broker's basic.return frames. The client
	// library hands a return over before it reads the confirm that
	// follows it, so once a publish's confirm is in, its return (if any)
	// is in this buffer or already matched to its publish in pending.
	// Every publish drains the buffer on its way out, under mu; the
	// buffer is sized so that the client's reader never waits on it.
	returns chan amqp.Return
	mu      sync.Mutex
	// pending holds the publishes awaiting their confirm by publish id.
	pending map[int64]*sent

	// retired channels take no new publishes; the last publish in flight
	// on one closes it.
	retired atomic.Bool
}

// sent is one publish on its way: published, its confirm not yet read.
// One allocation holds what the wait for its confirm needs.
type sent struct {
	p     *Publisher
	pc    *pubChannel
	ctx   context.Context
	dc    *amqp.DeferredConfirmation
	key   string
	id    int64 // headerPublishID
	epoch int64 // blockEpoch when it was published
	// returned is the broker's basic.return of this publish, matched by
	// matchReturns under pc.mu.
	returned *amqp.Return
}

// headerPublishID carries a number unique to each publish of a Publisher.
// A basic.return names no sequence number, and two copies in flight may
// agree in everything else it carries (exchange, routing key, message id,
// body: a message replayed twice, two moves of look-alike messages), so a
// return is matched to its publish by this header alone. fromDelivery
// drops it: the app and the tools never see it, and a copy of a delivered
// message is published under a number of its own.
const headerPublishID = "x-hopper-publish-id"

// NewPublisher returns a publisher that connects on first use.
func NewPublisher(o PublisherOptions) *Publisher {
	if o.Channels < 1 {
		o.Channels = 1
	}
	if o.InFlight < 1 {
		o.InFlight = 256
	}
	if o.ConfirmTimeout <= 0 {
		o.ConfirmTimeout = 15 * time.Second
	}
	if o.Name == "" {
		o.Name = "hopper-publisher"
	}
	p := &Publisher{opts: o, slots: make([]pubSlot, o.Channels), planned: newPlannedQueues(o.Topology)}
	p.bo = backoff.Backoff{Min: o.ReconnectMin, Max: o.ReconnectMax}
	unblocked := make(chan struct{})
	close(unblocked)
	p.blocked = unblocked
	return p
}

// Publish sends m to queue through the default exchange and waits for the
// broker to confirm it. It returns nil only when the broker has taken
// responsibility for the copy.
func (p *Publisher) Publish(ctx context.Context, queue string, m *msg.Message) error {
	return p.PublishTo(ctx, "", queue, m)
}

// PublishTo is Publish to an exchange and routing key.
func (p *Publisher) PublishTo(ctx context.Context, exchange, key string, m *msg.Message) error {
	if exchange != "" {
		return p.publishOnce(ctx, exchange, key, m)
	}
	pq, ok := p.planned.byName[key]
	if !ok {
		return p.publishOnce(ctx, exchange, key, m)
	}
	started := time.Now()
	err := p.publishOnce(ctx, exchange, key, m)
	if !errors.Is(err, ErrReturned) {
		if err == nil {
			p.planned.found(p.opts.logger(), key)
		}
		return err
	}
	// The default exchange routes to every queue by its name: one of the
	// plan's queues was deleted under Hopper.
	if !pq.plan.Declare || !pq.q.Owned {
		p.planned.missing(p.opts.logger(), pq)
		return fmt.Errorf("%w: %s queue %q does not exist, and with topology.declare false Hopper does not create it", err, pq.q.Role, key)
	}
	if derr := p.redeclare(ctx, pq, started); derr != nil {
		p.planned.missing(p.opts.logger(), pq)
		return errors.Join(err, fmt.Errorf("declare %s queue %q again: %w", pq.q.Role, key, derr))
	}
	// The copy was returned, so it exists nowhere: publishing it again
	// makes no duplicate.
	err = p.publishOnce(ctx, exchange, key, m)
	switch {
	case err == nil:
		p.planned.found(p.opts.logger(), key)
	case errors.Is(err, ErrReturned):
		p.planned.missing(p.opts.logger(), pq)
	}
	return err
}

// publishOnce publishes m once and waits for its confirm.
func (p *Publisher) publishOnce(ctx context.Context, exchange, key string, m *msg.Message) error {
	s, err := p.send(ctx, exchange, key, m)
	if err != nil {
		return err
	}
	return s.wait()
}

// Send is PublishTo in two steps: it publishes m before it returns, so
// that a caller's successive sends leave on the channel in the caller's
// order (with Channels 1), and returns the wait for the broker's answer,
// which must be called exactly once. A caller so keeps many copies in
// flight in order, where PublishTo would wait for each confirm in turn.
func (p *Publisher) Send(ctx context.Context, exchange, key string, m *msg.Message) (wait func() error) {
	s, err := p.send(ctx, exchange, key, m)
	if err != nil {
		return func() error { return err }
	}
	return s.wait
}

// send publishes m and returns the publish, to be waited for exactly
// once. Each move passes here, so the usual case (the channel open, room
// on it) takes no timer and no context of its own: those are made only
// when the publish has to wait for a channel to open or for room.
func (p *Publisher) send(ctx context.Context, exchange, key string, m *msg.Message) (*sent, error) {
	// While the broker blocks publishing (memory or disk alarm) the move
	// waits, however long: failing it would only put the message back to be
	// delivered and fail again. The confirm timeout starts after.
	if err := p.waitUnblocked(ctx); err != nil {
		return nil, err
	}
	s, err := p.take(ctx, key)
	if err != nil {
		return nil, err
	}
	pc := s.pc

	s.epoch = p.blockEpoch.Load()
	// The write itself may stall while the broker blocks the connection
	// (it stops reading); the confirm wait below starts after it.
	pub := toPublishing(m)
	if pub.Headers == nil {
		pub.Headers = amqp.Table{}
	}
	pub.Headers[headerPublishID] = s.id
	s.dc, err = pc.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key,
		true,  // mandatory: an unroutable copy must come back, not vanish
		false, // immediate
		pub)
	if err != nil {
		s.takeReturn()
		s.release()
		return nil, fmt.Errorf("publish to %q: %w", key, err)
	}
	return s, nil
}

// take picks a channel, takes room on it for one more publish in flight
// and registers the publish there. A channel that is retired (a queue
// refused a publish on it) or closed while the publish waited for room
// has not been written to by it, so the publish picks a channel again
// rather than fail, for at most the confirm timeout: a retired channel
// takes no new publishes and is closed once its last one is answered,
// which may be while others wait for its room.
func (p *Publisher) take(ctx context.Context, key string) (*sent, error) {
	var deadline time.Time
	for {
		pc, err := p.channel(ctx)
		if err != nil {
			return nil, err
		}
		select {
		case pc.room <- struct{}{}:
		default:
			if err := p.waitRoom(ctx, pc); err != nil {
				if !errors.Is(err, errRoomGone) {
					return nil, err
				}
				if deadline, err = p.pickAgain(deadline, key, err); err != nil {
					return nil, err
				}
				continue
			}
		}
		// Registered under pc.mu, where closeIfRetired looks for publishes
		// in flight, so the channel is not closed under this one.
		pc.mu.Lock()
		if pc.retired.Load() || pc.isClosed() || pc.ch.IsClosed() {
			pc.mu.Unlock()
			<-pc.room
			pc.closeIfRetired()
			if deadline, err = p.pickAgain(deadline, key, errRoomGone); err != nil {
				return nil, err
			}
			continue
		}
		s := &sent{p: p, pc: pc, ctx: ctx, key: key, id: p.publishSeq.Add(1)}
		pc.pending[s.id] = s
		pc.mu.Unlock()
		return s, nil
	}
}

// pickAgain starts the confirm timeout on the first pick that found its
// channel gone, and fails with why once it has passed.
func (p *Publisher) pickAgain(deadline time.Time, key string, why error) (time.Time, error) {
	now := time.Now()
	if deadline.IsZero() {
		return now.Add(p.opts.ConfirmTimeout), nil
	}
	if now.After(deadline) {
		return deadline, fmt.Errorf("publish to %q: no publish channel kept room for it within %s: %w", key, p.opts.ConfirmTimeout, why)
	}
	return deadline, nil
}

// errRoomGone is a wait for room on a channel that closed meanwhile.
var errRoomGone = errors.New("publish channel closed while waiting for room")

// waitRoom waits, at most the confirm timeout, until pc has room for one
// more publish in flight, and takes it.
func (p *Publisher) waitRoom(ctx context.Context, pc *pubChannel) error {
	tctx, cancel := context.WithTimeout(ctx, p.opts.ConfirmTimeout)
	defer cancel()
	select {
	case pc.room <- struct{}{}:
		return nil
	case <-pc.closed:
		return fmt.Errorf("%w: %w", errRoomGone, pc.err)
	case <-tctx.Done():
		return fmt.Errorf("wait for room on a publish channel: %w", tctx.Err())
	}
}

// takeReturn matches the returns in the buffer to their publishes, takes
// this publish out of the pending ones and says whether the broker
// returned it.
func (s *sent) takeReturn() *amqp.Return {
	pc := s.pc
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.matchReturns()
	delete(pc.pending, s.id)
	return s.returned
}

// release gives the publish's room on its channel back.
func (s *sent) release() {
	<-s.pc.room
	s.pc.closeIfRetired()
}

// wait waits for the broker's answer to the publish.
func (s *sent) wait() error {
	defer s.release()
	return s.confirm()
}

// confirm waits for the broker's answer to one publish.
func (s *sent) confirm() error {
	p, pc, dc, ctx, key, epoch, returned := s.p, s.pc, s.dc, s.ctx, s.key, s.epoch, s.takeReturn
	timer := time.NewTimer(p.opts.ConfirmTimeout)
	defer timer.Stop()
	for waiting := true; waiting; {
		select {
		case <-dc.Done():
			waiting = false
		case <-pc.closed:
			returned()
			return fmt.Errorf("publish to %q: %w: %w", key, ErrChannelClosed, pc.err)
		case <-ctx.Done():
			returned()
			return fmt.Errorf("publish to %q: %w", key, ctx.Err())
		case <-timer.C:
			if now := p.blockEpoch.Load(); now != epoch {
				// The broker blocked the connection meanwhile: the confirm
				// is late, not lost. Wait out the block, then give it the
				// full timeout again.
				epoch = now
				if err := p.waitUnblocked(ctx); err != nil {
					returned()
					return err
				}
				timer.Reset(p.opts.ConfirmTimeout)
				continue
			}
			// A channel whose confirm never came is in an unknown state:
			// close it, failing what else is in flight on it (each of
			// those is put back by its caller, never lost).
			returned()
			pc.ch.Close()
			return fmt.Errorf("publish to %q: %w after %s", key, ErrConfirmWait, p.opts.ConfirmTimeout)
		}
	}
	if r := returned(); r != nil {
		return fmt.Errorf("publish to %q: %w (%d %s)", key, ErrReturned, r.ReplyCode, r.ReplyText)
	}
	if !dc.Acked() {
		select {
		case <-pc.closed: // the library fails what was in flight on a closed channel
			return fmt.Errorf("publish to %q: %w: %w", key, ErrChannelClosed, pc.err)
		default:
		}
		if pc.ch.IsClosed() {
			// Closed, and the close not yet seen on pc.closed: the library
			// marks a channel closed before it fails what was in flight,
			// so this is the close, not the queue refusing the message.
			// Its notification follows (the library always delivers it
			// and closes the channel of notifications), with the broker's
			// reason.
			select {
			case <-pc.closed:
				return fmt.Errorf("publish to %q: %w: %w", key, ErrChannelClosed, pc.err)
			case <-ctx.Done():
				return fmt.Errorf("publish to %q: %w", key, ErrChannelClosed)
			}
		}
		// A channel a queue has refused may go on being refused by it
		// after the queue has room again (a quorum queue with
		// overflow=reject-publish): publish the retry on a fresh one.
		pc.retired.Store(true)
		return fmt.Errorf("publish to %q: %w", key, ErrNacked)
	}
	return nil
}

// closeIfRetired closes a retired channel once nothing is in flight on it.
func (pc *pubChannel) closeIfRetired() {
	if !pc.retired.Load() {
		return
	}
	pc.mu.Lock()
	idle := len(pc.pending) == 0
	pc.mu.Unlock()
	if idle {
		pc.ch.Close()
	}
}

// matchReturns hands each return in the buffer to the pending publish it
// belongs to, by the publish id it carries back (headerPublishID), never
// to a publish that merely looks alike. A return whose publish has
// already gone (given up on) is dropped. Called with pc.mu held.
func (pc *pubChannel) matchReturns() {
	for {
		select {
		case r, ok := <-pc.returns:
			if !ok {
				return // the channel is closed
			}
			id, _ := r.Headers[headerPublishID].(int64)
			if s := pc.pending[id]; s != nil {
				s.returned = &r
			}
		default:
			return
		}
	}
}

// channel picks the next channel in turn, opening it when it is not open on
// the current connection.
func (p *Publisher) channel(ctx context.Context) (*pubChannel, error) {
	s := &p.slots[(p.turn.Add(1)-1)%uint64(len(p.slots))]
	s.mu.Lock()
	defer s.mu.Unlock()
	if pc := s.ch; pc != nil && !pc.isClosed() && !pc.retired.Load() && pc.gen == p.generation() {
		return pc, nil
	}
	// Opening (and dialling, when the connection is down) is bounded like
	// the wait for a confirm.
	ctx, cancel := context.WithTimeout(ctx, p.opts.ConfirmTimeout)
	defer cancel()
	pc, err := p.openChannel(ctx)
	if err != nil {
		return nil, err
	}
	s.ch = pc
	return pc, nil
}

func (pc *pubChannel) isClosed() bool {
	select {
	case <-pc.closed:
		return true
	default:
		return false
	}
}

func amqpErr(e *amqp.Error) error {
	if e == nil {
		return amqp.ErrClosed
	}
	if e.Code == amqp.PreconditionFailed && strings.Contains(e.Reason, "larger than configured max size") {
		return fmt.Errorf("%w: %w", ErrTooLarge, e)
	}
	return e
}

func (p *Publisher) generation() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gen
}

func (p *Publisher) openChannel(ctx context.Context) (*pubChannel, error) {
	conn, gen, err := p.connection(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open publish channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil { // noWait=false
		ch.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	n := p.opts.InFlight
	pc := &pubChannel{
		ch:     ch,
		gen:    gen,
		room:   make(chan struct{}, n),
		closed: make(chan struct{}),
		// The library's reader waits while this buffer is full, and with
		// it every confirm: it holds one return per publish in flight and
		// as many of publishes given up on (cancelled), which wait until
		// the next publish's confirm drains them. Each return is 264
		// bytes, so a buffer of four times that (2 MiB over the default 8
		// channels) was most of the live heap once moves began.
		returns: ch.NotifyReturn(make(chan amqp.Return, 2*n)),
		pending: make(map[int64]*sent, n),
	}
	notify := ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		pc.err = amqpErr(<-notify)
		close(pc.closed)
	}()
	return pc, nil
}

// connection returns the live publishing connection, dialling when there is
// none (at most once per backoff step, so a dead broker is not hammered by
// every worker).
func (p *Publisher) connection(ctx context.Context) (*amqp.Connection, int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil && !p.conn.IsClosed() {
		return p.conn, p.gen, nil
	}
	if wait := time.Until(p.next); wait > 0 {
		return nil, 0, fmt.Errorf("publisher connection down; next attempt in %s", wait.Round(time.Millisecond))
	}
	conn, idx, err := p.opts.dialOnce(ctx, p.urlIdx)
	p.urlIdx = idx
	if err != nil {
		p.next = time.Now().Add(p.bo.Next())
		return nil, 0, fmt.Errorf("publisher connect: %w", err)
	}
	p.bo.Reset()
	p.conn = conn
	p.gen++
	p.setBlocked(p.gen, false) // a new connection starts unblocked
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go p.watchBlocked(p.gen, blocked)
	return conn, p.gen, nil
}

// watchBlocked pauses publishing while the broker says the connection is
// blocked (memory or disk alarm), instead of letting moves time out.
func (p *Publisher) watchBlocked(gen int, ch <-chan amqp.Blocking) {
	for b := range ch {
		if b.Active {
			p.opts.logger().Warn("broker blocked publishing", "event", "BROKER_BLOCKED", "reason", b.Reason)
		} else {
			p.opts.logger().Info("broker unblocked publishing", "event", "BROKER_UNBLOCKED")
		}
		p.setBlocked(gen, b.Active)
	}
	// Connection gone: never leave publishers waiting on it.
	p.setBlocked(gen, false)
}

// setBlocked records connection gen's blocked state. A connection newer
// than gen takes ownership of the state; an older one is ignored. Waiters
// on a blocked state are released exactly once, when it ends.
func (p *Publisher) setBlocked(gen int, active bool) {
	p.blockedMu.Lock()
	defer p.blockedMu.Unlock()
	if gen < p.blockedGen {
		return
	}
	p.blockedGen = gen
	select {
	case <-p.blocked: // not blocked now
		if active {
			p.blockEpoch.Add(1)
			p.blocked = make(chan struct{})
		}
	default: // blocked now
		if !active {
			close(p.blocked)
		}
	}
}

func (p *Publisher) waitUnblocked(ctx context.Context) error {
	p.blockedMu.Lock()
	ch := p.blocked
	p.blockedMu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("broker connection blocked: %w", ctx.Err())
	}
}

// Close closes the publishing connection.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	if err := p.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("close publisher connection: %w", err)
	}
	return nil
}
