package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/internal/backoff"
	"github.com/hopper-sidecar/hopper/msg"
)

// Errors a move can end with. In every case the caller must nack the
// original with requeue: the copy may or may not exist, the original must.
var (
	ErrReturned    = errors.New("broker returned the message as unroutable (no such queue)")
	ErrNacked      = errors.New("broker refused the message (publisher nack, e.g. queue full with overflow=reject-publish)")
	ErrConfirmWait = errors.New("no publisher confirm in time")
)

// PublisherOptions configure a Publisher. Zero values take the defaults
// named.
type PublisherOptions struct {
	// Options are the connection's; Name defaults to "hopper-publisher".
	Options
	// Channels is the number of confirm-mode channels used in parallel.
	// Default 1.
	Channels int
	// ConfirmTimeout bounds the wait for the broker's confirm; a blocked
	// connection restarts it. Default 15s.
	ConfirmTimeout time.Duration
}

// Publisher publishes moves on its own connection, in confirm mode,
// mandatory and persistent. Each channel carries one publish at a time, so a
// basic.return is known to belong to the publish it precedes.
type Publisher struct {
	opts PublisherOptions

	mu     sync.Mutex
	conn   *amqp.Connection
	gen    int // bumped on every new connection
	urlIdx int
	bo     backoff.Backoff
	next   time.Time // no dial before this
	pool   chan *pubChannel

	// blocked is closed while publishing is not blocked. Only the watcher
	// of the current connection (blockedGen) may change it, so a watcher of
	// a connection already replaced can neither unblock nor re-close it.
	blockedMu  sync.Mutex
	blocked    chan struct{}
	blockedGen int
	blockEpoch atomic.Int64 // bumped on every block
}

type pubChannel struct {
	ch      *amqp.Channel
	gen     int
	returns chan amqp.Return
	closed  chan *amqp.Error
}

// NewPublisher returns a publisher that connects on first use.
func NewPublisher(o PublisherOptions) *Publisher {
	if o.Channels < 1 {
		o.Channels = 1
	}
	if o.ConfirmTimeout <= 0 {
		o.ConfirmTimeout = 15 * time.Second
	}
	if o.Name == "" {
		o.Name = "hopper-publisher"
	}
	p := &Publisher{opts: o, pool: make(chan *pubChannel, o.Channels)}
	p.bo = backoff.Backoff{Min: o.ReconnectMin, Max: o.ReconnectMax}
	for range o.Channels {
		p.pool <- nil // a slot; the channel opens lazily
	}
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
	// While the broker blocks publishing (memory or disk alarm) the move
	// waits, however long: failing it would only put the message back to be
	// delivered and fail again. The confirm timeout starts after.
	if err := p.waitUnblocked(ctx); err != nil {
		return err
	}
	tctx, cancel := context.WithTimeout(ctx, p.opts.ConfirmTimeout)
	defer cancel()
	var slot *pubChannel
	select {
	case slot = <-p.pool:
	case <-tctx.Done():
		return fmt.Errorf("wait for a publish channel: %w", tctx.Err())
	}
	ok := false
	defer func() {
		if !ok && slot != nil {
			// A channel whose confirm never came is in an unknown state.
			slot.ch.Close()
			slot = nil
		}
		p.pool <- slot
	}()

	if slot == nil || slot.ch.IsClosed() || slot.gen != p.generation() {
		var err error
		if slot, err = p.openChannel(tctx); err != nil {
			return err
		}
	}
	// Drop a stale return left by an earlier publish that timed out.
	for len(slot.returns) > 0 {
		<-slot.returns
	}
	epoch := p.blockEpoch.Load()
	// The write itself may stall while the broker blocks the connection
	// (it stops reading); the confirm wait below starts after it.
	dc, err := slot.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key,
		true,  // mandatory: an unroutable copy must come back, not vanish
		false, // immediate
		toPublishing(m))
	if err != nil {
		return fmt.Errorf("publish to %q: %w", key, err)
	}
	timer := time.NewTimer(p.opts.ConfirmTimeout)
	defer timer.Stop()
	for waiting := true; waiting; {
		select {
		case <-dc.Done():
			waiting = false
		case e := <-slot.closed:
			return fmt.Errorf("publish channel closed before confirm: %w", amqpErr(e))
		case <-ctx.Done():
			return fmt.Errorf("publish to %q: %w", key, ctx.Err())
		case <-timer.C:
			if now := p.blockEpoch.Load(); now != epoch {
				// The broker blocked the connection meanwhile: the confirm
				// is late, not lost. Wait out the block, then give it the
				// full timeout again.
				epoch = now
				if err := p.waitUnblocked(ctx); err != nil {
					return err
				}
				timer.Reset(p.opts.ConfirmTimeout)
				continue
			}
			return fmt.Errorf("publish to %q: %w after %s", key, ErrConfirmWait, p.opts.ConfirmTimeout)
		}
	}
	// The reader goroutine delivers basic.return before the confirm it
	// precedes, so a return for this publish is already in the buffer.
	select {
	case r := <-slot.returns:
		return fmt.Errorf("publish to %q: %w (%d %s)", key, ErrReturned, r.ReplyCode, r.ReplyText)
	default:
	}
	if !dc.Acked() {
		return fmt.Errorf("publish to %q: %w", key, ErrNacked)
	}
	ok = true
	return nil
}

func amqpErr(e *amqp.Error) error {
	if e == nil {
		return amqp.ErrClosed
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
	pc := &pubChannel{
		ch:      ch,
		gen:     gen,
		returns: ch.NotifyReturn(make(chan amqp.Return, 1)),
		closed:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}
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
