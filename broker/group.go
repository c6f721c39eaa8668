package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/internal/backoff"
)

// Group runs the consumers of several queues over one connection, each on a
// channel of its own, so that each keeps its own prefetch, acks and pause
// state while the sidecar holds a single consuming connection to the broker.
//
// The members share the connection's fate: when it is lost, or when one
// member's channel dies, the whole session ends and every member consumes
// again on a new connection. A delivery of the old session is never acked on
// the new one.
type Group struct {
	opts        Options
	onReconnect func(reason string)
	members     []member

	mu       sync.Mutex
	conn     *amqp.Connection
	sessions []*session

	connected atomic.Bool
	// Reconnects counts sessions after the first.
	Reconnects atomic.Int64
}

type member struct {
	c      *Consumer
	handle func(*Delivery)
}

// NewGroup returns a group connecting with o; onReconnect, when set, is told
// each time a lost session is back, with the reason it was lost.
func NewGroup(o Options, onReconnect func(reason string)) *Group {
	if o.Name == "" {
		o.Name = "hopper-consumer"
	}
	return &Group{opts: o, onReconnect: onReconnect}
}

// Add makes c a member; handle receives its deliveries from the connection's
// dispatch goroutine and must hand off quickly. Add is called before Run.
func (g *Group) Add(c *Consumer, handle func(*Delivery)) {
	c.group.Store(g)
	g.members = append(g.members, member{c: c, handle: handle})
}

// Connected reports whether the group's connection is up.
func (g *Group) Connected() bool { return g.connected.Load() }

// Run consumes on every member until ctx is done. When ctx is done each
// member cancels its consumer but keeps its channel open, so in-flight
// deliveries can still be settled; Close ends the connection.
func (g *Group) Run(ctx context.Context) error {
	log := g.opts.logger()
	bo := backoff.Backoff{Min: g.opts.ReconnectMin, Max: g.opts.ReconnectMax}
	urlIdx := 0
	first := true
	lastReason := ""
	for {
		if ctx.Err() != nil {
			return nil
		}
		conn, sessions, idx, err := g.open(ctx, urlIdx)
		urlIdx = idx
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			wait := bo.Next()
			log.Warn("broker connect failed", "event", "BROKER_CONNECT_FAILED", "error", err.Error(), "retry_in", wait.String())
			if backoff.Sleep(ctx, wait) != nil {
				return nil
			}
			continue
		}
		if !first {
			g.Reconnects.Add(1)
			for _, m := range g.members {
				m.c.Reconnects.Add(1)
			}
			if g.onReconnect != nil {
				g.onReconnect(lastReason)
			}
		}
		first = false
		bo.Reset()
		reason := g.consume(ctx, conn, sessions)
		lastReason = reason
		g.connected.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		// The session is lost: its deliveries cannot be acked any more.
		for _, s := range sessions {
			s.dead.Store(true)
			s.end()
		}
		if err := conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			log.Debug("close lost connection", "error", err.Error())
		}
		wait := bo.Next()
		log.Warn("consumer lost, reconnecting", "event", "BROKER_RECONNECT", "reason", reason, "retry_in", wait.String())
		if backoff.Sleep(ctx, wait) != nil {
			return nil
		}
	}
}

// open dials, prepares every member's topology and opens one channel per
// member.
func (g *Group) open(ctx context.Context, start int) (*amqp.Connection, []*session, int, error) {
	conn, idx, err := g.opts.dialOnce(ctx, start)
	if err != nil {
		return nil, nil, idx, err
	}
	wholeBodies(conn)
	var sessions []*session
	fail := func(err error) (*amqp.Connection, []*session, int, error) {
		for _, s := range sessions {
			s.dead.Store(true)
			s.end()
		}
		conn.Close()
		return nil, nil, (idx + 1) % len(g.opts.URLs), err
	}
	for _, m := range g.members {
		if err := prepare(ctx, conn, m.c.opts.Topology); err != nil {
			return fail(fmt.Errorf("queue %s: %w", m.c.opts.Queue, err))
		}
	}
	for _, m := range g.members {
		ch, err := conn.Channel()
		if err != nil {
			return fail(fmt.Errorf("open channel for queue %s: %w", m.c.opts.Queue, err))
		}
		s := &session{conn: conn, ch: ch}
		s.startAcker()
		sessions = append(sessions, s)
	}
	return conn, sessions, idx, nil
}

// consume runs every member on its channel until the session ends and says
// why. One member losing its channel ends the session for all: the
// connection is closed so the others stop too, and all come back together.
func (g *Group) consume(ctx context.Context, conn *amqp.Connection, sessions []*session) string {
	g.mu.Lock()
	g.conn, g.sessions = conn, sessions
	g.mu.Unlock()
	g.connected.Store(true)
	reasons := make(chan string, len(g.members))
	for i, m := range g.members {
		go func() { reasons <- m.c.consume(ctx, sessions[i], m.handle) }()
	}
	first := ""
	for range g.members {
		r := <-reasons
		if first != "" {
			continue
		}
		first = r
		if ctx.Err() == nil && len(g.members) > 1 {
			if err := conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
				g.opts.logger().Debug("close connection after a member was lost", "error", err.Error())
			}
		}
	}
	return first
}

// Close closes the connection. Settled deliveries' acks go out first;
// unsettled ones go back to their queues, which the broker requeues when
// the channels close.
func (g *Group) Close() error {
	g.mu.Lock()
	conn, sessions := g.conn, g.sessions
	g.mu.Unlock()
	if conn == nil {
		return nil
	}
	for _, s := range sessions {
		s.end()
		s.dead.Store(true)
	}
	if err := conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("close consumer connection: %w", err)
	}
	return nil
}
