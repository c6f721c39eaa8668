// Package streamsrc reads a RabbitMQ stream through the stream protocol and
// hands each message to the delivery loop as a queue's consumer does. It is
// the only package that imports the stream client, as broker is the only
// one that imports the AMQP 0.9.1 client: what the loop, the deciders and
// the app side see is a msg.Message and a delivery to settle once.
//
// A stream is not a queue. Reading does not remove anything, and nothing
// can be put back: the consumer only has a position, an offset the broker
// stores under the consumer's name. So settling a delivery here means
// marking its offset done, and a retry or a dead letter is a copy that
// goes elsewhere (the subscription's own queue behind the delay tiers, the
// DLQ), never back into the stream. The life of one message:
//
//	read (offset marked pending) ─→ delivered ─→ settled: acked, or its
//	   │                                          copy confirmed elsewhere
//	   │                                             │
//	   └─ shutdown before it was                     └─→ offset done; the
//	      settled: left pending,                         stored offset moves
//	      read again after a restart                     up to the highest one
//	                                                     with nothing pending
//	                                                     behind it (Offsets)
//
// A delivery given back (the app could not take it) is handed to the loop
// again after a while, at the same offset: a stream has no requeue. The
// stored offset is written every StoreEvery and once more at Close, and
// only ever names an offset at or below which everything read is settled,
// so a restart, even after a SIGKILL, resumes after it and skips nothing:
// what was settled after the last store is delivered again (at least
// once).
//
// A super stream is read as its partitions, each a stream like any other
// with offsets of its own under the consumer name (Options.SuperStream).
package streamsrc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/backoff"
	"github.com/hopper-sidecar/hopper/internal/tlsfiles"
	"github.com/hopper-sidecar/hopper/msg"
)

// Options configure a Source. Zero values take the defaults named.
type Options struct {
	// Host, Port, User, Password and VHost reach the broker's stream
	// listener. Defaults 127.0.0.1, 5552, guest, guest and "/".
	Host     string
	Port     int
	User     string
	Password string
	VHost    string
	// TLS, when set, reaches the stream listener over TLS with it (the
	// broker's TLS stream listener, 5551 by default on RabbitMQ). Default
	// nil: plain TCP.
	TLS *tls.Config
	// Stream and Consumer name the stream and the reader; the broker
	// stores the offset under Consumer. Required.
	Stream, Consumer string
	// Start is where a consumer with no stored offset starts. Default
	// first.
	Start config.StreamStart
	// Declare creates the stream when it is missing, with the retention
	// below; otherwise a missing stream is an error, retried. Default
	// false.
	Declare bool
	// MaxAge, MaxLengthBytes and MaxSegmentSizeBytes are the retention of
	// a stream Declare creates. Default 0: the broker's own.
	MaxAge                              time.Duration
	MaxLengthBytes, MaxSegmentSizeBytes int64
	// StoreEvery is how often the settled offset is stored while it
	// advances. Default 1s.
	StoreEvery time.Duration
	// PositionEvery is how often the stream's bounds are looked up for
	// Position (the lag). Default 5s.
	PositionEvery time.Duration
	// Heartbeat is the stream connection's heartbeat; the client takes
	// nothing under 3s. Default 10s.
	Heartbeat time.Duration
	// ReconnectMin and ReconnectMax bound the jittered backoff between
	// attempts to subscribe again. Defaults 500ms and 30s.
	ReconnectMin, ReconnectMax time.Duration
	// RedeliverAfter is how long a delivery given back waits before it is
	// handed to the loop again. Default 1s.
	RedeliverAfter time.Duration
	// Prefetch bounds the deliveries handed to the loop and not settled
	// yet, as a queue's prefetch does: the loop's hand-off queue must hold
	// that many, so that handing one over never blocks. The stream client
	// reads about as many ahead (see readAhead). Default 50.
	Prefetch int
	// Follow, when set, is the bound to hold now, at most Prefetch: the
	// prefetch of a queue whose consumer follows the app's concurrency
	// limit. It is looked up every FollowEvery while subscribed. A stream
	// has no consumer to register again for a new bound, so it follows
	// every change. Default nil: Prefetch throughout.
	Follow func() int
	// FollowEvery is how often Follow is looked up. Default 100ms.
	FollowEvery time.Duration
	// SingleActive subscribes as a single active consumer: of the
	// readers with this consumer name (the replicas of one app), the
	// broker delivers to one at a time and promotes another when it goes
	// away, which starts after the offset stored then. Needs RabbitMQ
	// 3.11 or later. Default false.
	SingleActive bool
	// SuperStream reads Stream as a super stream: every partition stream
	// bound to the exchange of that name, each with its own offsets under
	// Consumer. With SingleActive the broker spreads the partitions among
	// the readers of the consumer name, one active reader per partition.
	// Needs RabbitMQ 3.11 or later. Default false.
	SuperStream bool
	// Partitions is the number of partitions of a super stream Declare
	// creates (RabbitMQ 3.13 or later). Default 3.
	Partitions int
	// PrefetchBytes bounds the body bytes of those deliveries, as
	// consumer.prefetchBytes bounds a queue's; one delivery is handed over
	// whatever its size. Default 0: no byte bound.
	PrefetchBytes int
	// Name labels the connection on the broker. Default "hopper".
	Name string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// ConfigOptions maps an effective stream subscription config (see
// config.Config.ForStream) to a Source's options: the stream listener is
// on the first broker URL's host, with its credentials (and those of the
// username and password files) and virtual host, at queue.stream.port.
func ConfigOptions(c *config.Config, log *slog.Logger) (Options, error) {
	s := c.Queue.Stream
	start, err := s.Start()
	if err != nil {
		return Options{}, fmt.Errorf("queue.stream.offset: %w", err)
	}
	o := Options{
		Port: s.Port, Stream: s.Name, Consumer: s.Consumer, Start: start,
		Declare: c.Topology.Declare, MaxAge: s.MaxAge.D(),
		MaxLengthBytes: int64(s.MaxLengthBytes), MaxSegmentSizeBytes: int64(s.MaxSegmentSizeBytes),
		StoreEvery: s.StoreEvery.D(), Heartbeat: c.Broker.Heartbeat.D(),
		ReconnectMin: c.Broker.ReconnectMin.D(), ReconnectMax: c.Broker.ReconnectMax.D(),
		RedeliverAfter: c.App.UnavailableBackoff.D(),
		Name:           "hopper-stream " + s.Name + " " + s.Consumer, Logger: log,
		SingleActive: s.SingleActiveConsumer != nil && *s.SingleActiveConsumer,
		SuperStream:  s.SuperStream, Partitions: s.Partitions,
	}
	if len(c.Broker.URLs) == 0 {
		return Options{}, errors.New("no broker URL")
	}
	u, err := url.Parse(c.Broker.URLs[0])
	if err != nil {
		return Options{}, errors.New("broker.urls[0]: not a URL")
	}
	o.Host = u.Hostname()
	if u.Scheme == "amqps" {
		// The stream listener is reached as the AMQP one is: the same CA,
		// client certificate and checks. A certificate is checked against
		// the host dialled unless broker.tls.serverName names another;
		// the client also dials the node that leads a stream, so the name
		// must be one every node's certificate is valid for.
		t := c.Broker.TLS
		cfg, err := tlsfiles.Client(tlsfiles.Files{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify})
		if err != nil {
			return Options{}, fmt.Errorf("broker.tls: %w", err)
		}
		if cfg.ServerName == "" {
			cfg.ServerName = o.Host
		}
		o.TLS = cfg
	}
	if u.User != nil {
		o.User = u.User.Username()
		o.Password, _ = u.User.Password()
	}
	if f := c.Broker.UsernameFile; f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return Options{}, fmt.Errorf("read username file: %w", err)
		}
		o.User = strings.TrimSpace(string(b))
	}
	if f := c.Broker.PasswordFile; f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return Options{}, fmt.Errorf("read password file: %w", err)
		}
		o.Password = strings.TrimRight(string(b), "\r\n")
	}
	// The AMQP URL's path is the virtual host, escaped ("/%2F" is "/").
	o.VHost = strings.TrimPrefix(u.Path, "/")
	return o, nil
}

func (o *Options) defaults() {
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.Port == 0 {
		o.Port = 5552
	}
	if o.User == "" {
		o.User, o.Password = "guest", "guest"
	}
	if o.VHost == "" {
		o.VHost = "/"
	}
	if o.Start.Kind == "" {
		o.Start.Kind = "first"
	}
	if o.StoreEvery <= 0 {
		o.StoreEvery = time.Second
	}
	o.Heartbeat = max(o.Heartbeat, 3*time.Second)
	if o.ReconnectMin <= 0 {
		o.ReconnectMin = 500 * time.Millisecond
	}
	if o.ReconnectMax < o.ReconnectMin {
		o.ReconnectMax = max(30*time.Second, o.ReconnectMin)
	}
	if o.PositionEvery <= 0 {
		o.PositionEvery = 5 * time.Second
	}
	if o.RedeliverAfter <= 0 {
		o.RedeliverAfter = time.Second
	}
	if o.Prefetch <= 0 {
		o.Prefetch = 50
	}
	if o.FollowEvery <= 0 {
		o.FollowEvery = 100 * time.Millisecond
	}
	if o.Partitions <= 0 {
		o.Partitions = 3
	}
	if o.Name == "" {
		o.Name = "hopper"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// ErrNoStream is why a stream that Hopper does not declare cannot be read.
var ErrNoStream = errors.New("stream not found")

// ErrNoSingleActive is why a reader configured as a single active
// consumer cannot read: the broker is older than RabbitMQ 3.11, which
// brought single active consumers to streams. Subscribing again cannot
// help, so Run returns it.
var ErrNoSingleActive = errors.New("the broker does not support a single active consumer on a stream (RabbitMQ 3.11 or later does): upgrade it, or set queue.stream.singleActiveConsumer: false")

// PauseBreaker is the reason Pause pauses for.
const PauseBreaker = "breaker"

// Source reads one stream, or the partitions of a super stream, for one
// consumer name and hands each message to the delivery loop.
type Source struct {
	o   Options
	log *slog.Logger

	mu sync.Mutex
	// parts are the streams read: the stream, or the partitions of the
	// super stream as last listed.
	parts []*part
	// pauses are the reasons reading is paused for; wake is closed (and
	// replaced) whenever they change and at stop.
	pauses map[string]bool
	wake   chan struct{}
	// stopping is set once reading ends: nothing more is handed to the
	// loop. stopped is closed then.
	stopping bool
	stopped  chan struct{}
	// halted is whether pauses holds a reason or stopping is set, for
	// hand to read without the lock.
	halted atomic.Bool
	// gen is the subscription now reading: a message from an earlier
	// one (still being dispatched by the client after a reconnect) is
	// not read, since the new subscription reads it again.
	gen uint64
	// handing counts the calls of handle in progress and the deliveries
	// waiting to be handed again; stop waits for them.
	handing sync.WaitGroup
	// unsubscribe ends the subscription now reading; nil when none.
	unsubscribe func() error
	env         *stream.Environment

	// closed is closed by Close: a handler the client calls after the
	// stop returns then.
	closed    chan struct{}
	closeOnce sync.Once
	connected atomic.Bool
	handle    func(*Delivery)
	// held counts the deliveries handed and not settled, and their bytes.
	held *budget
}

// New returns a source; Run reads.
func New(o Options) *Source {
	o.defaults()
	quietClient()
	s := &Source{
		o: o, log: o.Logger.With("stream", o.Stream, "consumer", o.Consumer),
		pauses: map[string]bool{}, wake: make(chan struct{}), stopped: make(chan struct{}),
		closed: make(chan struct{}), held: newBudget(o.Prefetch, o.PrefetchBytes),
	}
	if !o.SuperStream {
		s.parts = []*part{newPart(o.Stream)}
	}
	return s
}

// Delivery is one message read from the stream (a partition of a super
// stream). Ack marks its offset settled; it is safe to call from any
// goroutine, once.
type Delivery struct {
	m      *msg.Message
	offset int64
	src    *Source
	// stream is the stream it was read from, offsets the tracker it was
	// read under.
	stream  string
	offsets *Offsets
}

// Message returns the broker-neutral message.
func (d *Delivery) Message() *msg.Message { return d.m }

// Offset is the message's offset in the stream.
func (d *Delivery) Offset() int64 { return d.offset }

// Stream is the stream the message was read from: the stream, or the
// partition of a super stream.
func (d *Delivery) Stream() string { return d.stream }

// Ack marks the delivery settled: the stored offset may pass it.
func (d *Delivery) Ack() error {
	if !d.offsets.Settle(d.offset) {
		return fmt.Errorf("offset %d of stream %s settled twice", d.offset, d.stream)
	}
	d.src.held.give(len(d.m.Body))
	return nil
}

// Nack with requeue hands the delivery to the loop again after
// RedeliverAfter, at the same offset, flagged redelivered (a stream has no
// requeue); once reading has stopped it stays unsettled, to be read again
// after a restart. Without requeue the message is let go, as a queue
// without a dead-letter exchange would drop it: its offset is settled.
func (d *Delivery) Nack(requeue bool) error {
	if !requeue {
		return d.Ack()
	}
	d.src.redeliver(d)
	return nil
}

// Connected reports whether the source is subscribed to the stream.
func (s *Source) Connected() bool { return s.connected.Load() }

// Settled returns the offset the source would store now for the stream
// (ok false when none): every offset it read at or below it is settled.
// Of a super stream, SettledOf says it per partition.
func (s *Source) Settled() (int64, bool) { return s.SettledOf(s.o.Stream) }

// SettledOf is Settled for one stream read: the stream, or a partition of
// the super stream; ok is false for one not read.
func (s *Source) SettledOf(name string) (int64, bool) {
	for _, p := range s.partList() {
		if p.name == name {
			return s.tracker(p).Settled()
		}
	}
	return -1, false
}

// Active reports whether the source is subscribed and the one reader of
// its consumer name that the broker delivers to (always, without
// SingleActive); of a super stream, on at least one partition.
func (s *Source) Active() bool {
	if !s.connected.Load() {
		return false
	}
	for _, p := range s.partList() {
		if p.active.Load() {
			return true
		}
	}
	return false
}

// ActivePartitions are the streams this source is the active reader of,
// subscribed: the stream, or the partitions of the super stream the
// broker gave it.
func (s *Source) ActivePartitions() []string {
	var out []string
	if !s.connected.Load() {
		return out
	}
	for _, p := range s.partList() {
		if p.active.Load() {
			out = append(out, p.name)
		}
	}
	return out
}

func (s *Source) tracker(p *part) *Offsets {
	s.mu.Lock()
	defer s.mu.Unlock()
	return p.offsets
}

// Held is the number of deliveries handed to the loop and not settled,
// and their body bytes.
func (s *Source) Held() (n, bytes int) { return s.held.held() }

// Pending is the number of offsets read and not yet stored past.
func (s *Source) Pending() int {
	n := 0
	for _, p := range s.partList() {
		n += s.tracker(p).Pending()
	}
	return n
}

// Run subscribes to the stream and hands each message to handle until ctx
// ends, subscribing again (from the first offset not read yet) whenever
// the subscription is lost. It returns once nothing more will be handed:
// a call of handle in progress has returned, a message read but not
// handed stays unsettled. Close then stores the settled offset and
// disconnects; call it once the loop has settled what it holds. It
// returns nil when ctx ended, and ErrNoSingleActive at once when the
// broker cannot do what the options ask.
func (s *Source) Run(ctx context.Context, handle func(*Delivery)) error {
	s.handle = handle
	bo := backoff.Backoff{Min: s.o.ReconnectMin, Max: s.o.ReconnectMax}
	for {
		began := time.Now()
		err := s.session(ctx)
		if ctx.Err() != nil {
			s.stop()
			return nil
		}
		if errors.Is(err, ErrNoSingleActive) || errors.Is(err, ErrNoSuperStream) {
			s.stop()
			return err
		}
		if time.Since(began) > s.o.ReconnectMax {
			bo.Reset()
		}
		wait := bo.Next()
		s.log.Warn("stream subscription lost; subscribing again", "event", "STREAM_RECONNECTING",
			"error", err.Error(), "in", wait.String())
		if backoff.Sleep(ctx, wait) != nil {
			s.stop()
			return nil
		}
	}
}

// session is one subscription: it returns when the subscription is lost
// (of a super stream, when any partition's is), and at once (keeping the
// subscription for Close's store) when ctx ends.
func (s *Source) session(ctx context.Context) error {
	env, err := s.environment()
	if err != nil {
		return err
	}
	if s.o.SuperStream {
		names, err := s.partitions(env)
		if err != nil {
			return err
		}
		for _, n := range names {
			s.partNamed(n)
		}
	} else if err := s.declare(env); err != nil {
		return err
	}
	if s.o.Follow != nil {
		s.follow()
	}
	s.mu.Lock()
	s.gen++
	gen := s.gen
	s.mu.Unlock()
	// lost hears of every stream whose subscription closed; the first
	// ends the session.
	lost := make(chan error, len(s.partList())+1)
	var unsubscribe func() error
	if s.o.SuperStream && s.o.SingleActive {
		unsubscribe, err = s.subscribeSuper(env, gen, lost)
	} else {
		unsubscribe, err = s.subscribeEach(env, gen, lost)
	}
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.unsubscribe = unsubscribe
	s.mu.Unlock()
	s.connected.Store(true)
	tick := time.NewTicker(s.o.StoreEvery)
	defer tick.Stop()
	var follow <-chan time.Time
	if s.o.Follow != nil {
		t := time.NewTicker(s.o.FollowEvery)
		defer t.Stop()
		follow = t.C
	}
	watching, unwatch := context.WithCancel(ctx)
	defer unwatch()
	go s.watch(watching, env)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-lost:
			s.connected.Store(false)
			s.mu.Lock()
			unsubscribe := s.unsubscribe
			s.unsubscribe = nil
			for _, p := range s.parts {
				p.save, p.ahead = nil, nil
			}
			s.mu.Unlock()
			// The streams still subscribed are read again with the rest.
			// Close may have ended the subscription first (that is what
			// lost it, then), leaving nothing to end here.
			if unsubscribe != nil {
				_ = unsubscribe() // the subscription is being replaced
			}
			return err
		case <-tick.C:
			s.store()
			s.refill()
		case <-follow:
			s.follow()
		}
	}
}

// follow sets the bound on what the loop holds to what Options.Follow
// says now.
func (s *Source) follow() {
	s.held.setCount(min(max(s.o.Follow(), 1), s.o.Prefetch))
}

// refill gives a credit to each subscription that has waited on the
// client for a chunk for a whole StoreEvery while its stream holds
// messages it has not read (see readAhead.refill).
func (s *Source) refill() {
	quiet := time.Now().Add(-s.o.StoreEvery)
	for _, p := range s.partList() {
		s.mu.Lock()
		ahead, tracker := p.ahead, p.offsets
		s.mu.Unlock()
		if ahead == nil || !p.active.Load() {
			continue
		}
		next, read := tracker.Next()
		pos := p.pos.Load()
		if ahead.refill(quiet, read && pos != nil && pos.Last >= next) {
			s.logFor(p).Warn("the stream client waited for a chunk it had no credit for; gave it one",
				"event", "STREAM_CREDIT_REFILLED", "next", next, "last", pos.Last)
		}
	}
}

// declare creates the stream when the options say so and it is missing,
// and otherwise checks that it is there.
func (s *Source) declare(env *stream.Environment) error {
	if !s.o.Declare {
		if ok, err := env.StreamExists(s.o.Stream); err != nil {
			return fmt.Errorf("look for the stream: %w", err)
		} else if !ok {
			return ErrNoStream
		}
		return nil
	}
	if err := env.DeclareStream(s.o.Stream, s.retention()); err != nil {
		return fmt.Errorf("declare stream: %w", err)
	}
	return nil
}

// retention is the retention a declared stream (each partition of a
// declared super stream) gets.
func (s *Source) retention() *stream.StreamOptions {
	opts := stream.NewStreamOptions()
	s.setRetention(func(d time.Duration) { opts.SetMaxAge(d) },
		func(b *stream.ByteCapacity) { opts.SetMaxLengthBytes(b) },
		func(b *stream.ByteCapacity) { opts.SetMaxSegmentSizeBytes(b) })
	return opts
}

// setRetention calls the setters of the retention the options give, those
// of a stream's options or of a super stream's.
func (s *Source) setRetention(maxAge func(time.Duration), maxLength, maxSegment func(*stream.ByteCapacity)) {
	if s.o.MaxAge > 0 {
		maxAge(s.o.MaxAge)
	}
	if s.o.MaxLengthBytes > 0 {
		maxLength(stream.ByteCapacity{}.B(s.o.MaxLengthBytes))
	}
	if s.o.MaxSegmentSizeBytes > 0 {
		maxSegment(stream.ByteCapacity{}.B(s.o.MaxSegmentSizeBytes))
	}
}

// subscribeEach subscribes to every stream read with a consumer of its
// own, each starting where startAt says (or, as a single active consumer,
// where promote says once the broker makes it the active one). It
// returns what ends them all.
func (s *Source) subscribeEach(env *stream.Environment, gen uint64, lost chan<- error) (func() error, error) {
	var consumers []*stream.Consumer
	unsubscribe := func() error {
		var errs []error
		for _, c := range consumers {
			if err := c.Close(); err != nil && !errors.Is(err, stream.AlreadyClosed) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	for _, p := range s.partList() {
		spec, err := s.startAt(env, p)
		if err != nil {
			_ = unsubscribe() // the error says why
			return nil, err
		}
		ahead := newReadAhead(s.held)
		opts := consumerOptions().
			SetConsumerName(s.o.Consumer).
			SetManualCommit().
			SetOffset(spec).
			SetClientProvidedName(s.o.Name)
		if s.o.SingleActive {
			// The broker says when this reader is promoted, and it starts
			// where promote says, not at spec.
			p.active.Store(false)
			opts.SetSingleActiveConsumer(stream.NewSingleActiveConsumer(func(_ string, active bool) stream.OffsetSpecification {
				return s.promote(env, p, active)
			}))
		} else {
			p.active.Store(true)
		}
		cons, err := env.NewConsumer(p.name, func(cc stream.ConsumerContext, m *amqp.Message) {
			ahead.seen(cc, bodySize(m))
			s.onMessage(gen, p, cc.Consumer.GetOffset(), m)
			ahead.handed()
		}, opts)
		if err != nil {
			_ = unsubscribe() // the error says why
			if errors.Is(err, stream.SingleActiveConsumerNotSupported) {
				return nil, ErrNoSingleActive
			}
			return nil, fmt.Errorf("subscribe to %s: %w", p.name, err)
		}
		consumers = append(consumers, cons)
		ahead.attach(cons)
		s.mu.Lock()
		p.save, p.ahead = cons.StoreCustomOffset, ahead
		s.mu.Unlock()
		go func(closed stream.ChannelClose) {
			ev := <-closed
			lost <- closeError(p.name, ev)
		}(cons.NotifyClose())
		s.logFor(p).Info("reading the stream", "event", "STREAM_SUBSCRIBED", "from", spec.String())
	}
	return unsubscribe, nil
}

// closeError says why the subscription to name closed.
func closeError(name string, ev stream.Event) error {
	if ev.Err != nil {
		return fmt.Errorf("subscription to %s closed (%s): %w", name, ev.Reason, ev.Err)
	}
	return fmt.Errorf("subscription to %s closed (%s)", name, ev.Reason)
}

// envOptions reach the stream listener of o. The socket buffers are left
// to the kernel: the client's own default, 8 KiB each way, caps the
// receive window so low that a chunk of a few hundred messages takes
// seconds to arrive (a backlog of 256-byte messages read at about 250
// per second, against tens of thousands with the kernel's autotuning).
func envOptions(o Options) *stream.EnvironmentOptions {
	eo := stream.NewEnvironmentOptions().
		SetHost(o.Host).SetPort(o.Port).SetUser(o.User).SetPassword(o.Password).SetVHost(o.VHost).
		SetReadBuffer(0).SetWriteBuffer(0)
	if o.TLS != nil {
		eo = eo.IsTLS(true).SetTLSConfig(o.TLS)
	}
	return eo
}

// environment is the connection to the stream listener, made again when
// the last one closed.
func (s *Source) environment() (*stream.Environment, error) {
	if s.env != nil && !s.env.IsClosed() {
		return s.env, nil
	}
	env, err := dial(s.o, envOptions(s.o).
		SetRequestedHeartbeat(s.o.Heartbeat).
		SetMaxConsumersPerClient(1))
	if err != nil {
		return nil, err
	}
	s.env = env
	return env, nil
}

// dial connects to the stream listener of o with eo. Over TLS it shakes
// hands on a connection of its own first: the client starts its handshake
// only with its first request, and a certificate it refuses then shows as
// that request's 10 s timeout, not as what is wrong.
func dial(o Options, eo *stream.EnvironmentOptions) (*stream.Environment, error) {
	addr := net.JoinHostPort(o.Host, strconv.Itoa(o.Port))
	if o.TLS != nil {
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: o.TLS}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("connect to the stream listener %s over TLS: %w", addr, err)
		}
		_ = c.Close() // only the handshake was wanted
	}
	env, err := stream.NewEnvironment(eo)
	if err != nil {
		if env != nil {
			_ = env.Close() // the error says what went wrong
		}
		return nil, fmt.Errorf("connect to the stream listener %s: %w", addr, err)
	}
	return env, nil
}

// firstStart is where a consumer name with no stored offset starts.
func (s *Source) firstStart() stream.OffsetSpecification {
	spec := stream.OffsetSpecification{}
	switch s.o.Start.Kind {
	case "last":
		return spec.Last()
	case "next":
		return spec.Next()
	case "offset":
		return spec.Offset(s.o.Start.Offset)
	case "time":
		return spec.Timestamp(s.o.Start.Time.UnixMilli())
	}
	return spec.First()
}

// onMessage is called by the client, one message of p at a time in offset
// order, for subscription gen. It blocks while the loop's hand-off is full
// or reading is paused, which holds the client's credit back and so stops
// the broker sending more.
func (s *Source) onMessage(gen uint64, p *part, off int64, m *amqp.Message) {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		// Keep the client from reading on while Close is awaited.
		<-s.closed
		return
	}
	if gen != s.gen || !p.offsets.Read(off) {
		// Read already, or read by the subscription that replaced this one.
		s.mu.Unlock()
		return
	}
	tracker := p.offsets
	s.handing.Add(1)
	s.mu.Unlock()
	defer s.handing.Done()
	// Room first: the loop holds no more unsettled deliveries of the
	// stream than the prefetch (and its bytes), so handing one over never
	// blocks.
	r := &received{}
	fromStream(&r.m, m, p.value, off)
	r.d = Delivery{m: &r.m, offset: off, src: s, stream: p.name, offsets: tracker}
	if !s.held.take(len(r.m.Body)) {
		return // read, never handed: it stays unsettled
	}
	s.hand(&r.d)
}

// received is a delivery and its message, made together: one allocation
// for each message read rather than two.
type received struct {
	d Delivery
	m msg.Message
}

// hand waits while reading is paused, then hands d, which is counted in
// held, to the loop; once reading stops it returns without: d stays
// unsettled.
func (s *Source) hand(d *Delivery) {
	if !s.halted.Load() {
		// Neither paused nor stopping: no lock to take. A pause or a stop
		// that comes meanwhile finds this delivery handed, as it would had
		// it come a moment later; stop waits for the handing to return.
		s.handle(d)
		return
	}
	for {
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			return
		}
		if len(s.pauses) == 0 {
			s.mu.Unlock()
			break
		}
		w := s.wake
		s.mu.Unlock()
		<-w
	}
	s.handle(d)
}

// redeliver hands d to the loop again after RedeliverAfter; it stays
// counted in held meanwhile.
func (s *Source) redeliver(d *Delivery) {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return
	}
	s.handing.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.handing.Done()
		t := time.NewTimer(s.o.RedeliverAfter)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.stopped:
			return
		}
		d.m.Redelivered = true
		s.hand(&Delivery{m: d.m, offset: d.offset, src: s, stream: d.stream, offsets: d.offsets})
	}()
}

// stop ends the handing over: nothing is handed after it returns.
func (s *Source) stop() {
	s.mu.Lock()
	if !s.stopping {
		s.stopping = true
		s.halted.Store(true)
		close(s.stopped)
		close(s.wake)
		s.wake = make(chan struct{})
		s.held.stop()
	}
	s.mu.Unlock()
	s.handing.Wait()
}

// store writes the settled offset of every stream read on the broker
// where it moved, unless this reader stands by there.
func (s *Source) store() {
	for _, p := range s.partList() {
		s.storePart(p)
	}
}

// Close stops reading (if Run has not), stores the settled offsets a last
// time and disconnects. What is still unsettled is read again by the next
// consumer of the same name.
func (s *Source) Close() error {
	s.stop()
	s.store()
	s.closeOnce.Do(func() { close(s.closed) })
	s.mu.Lock()
	unsubscribe, env := s.unsubscribe, s.env
	s.unsubscribe, s.env = nil, nil
	stored := map[string]int64{}
	for _, p := range s.parts {
		stored[p.name] = p.stored
		p.save, p.ahead = nil, nil
	}
	s.mu.Unlock()
	s.connected.Store(false)
	var errs []error
	if unsubscribe != nil {
		if err := unsubscribe(); err != nil {
			errs = append(errs, fmt.Errorf("close the subscription: %w", err))
		}
	}
	if env != nil {
		if err := env.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close the stream connection: %w", err))
		}
	}
	if s.o.SuperStream {
		s.log.Info("stream reading stopped", "event", "STREAM_CLOSED", "stored_offsets", stored, "pending", s.Pending())
	} else {
		s.log.Info("stream reading stopped", "event", "STREAM_CLOSED", "stored_offset", stored[s.o.Stream], "pending", s.Pending())
	}
	return errors.Join(errs...)
}

// PauseFor stops handing messages to the loop for reason until ResumeFor
// the same reason; a message read meanwhile waits, and with it the
// client's credit, so the broker stops sending.
func (s *Source) PauseFor(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pauses[reason] = true
	s.halted.Store(true)
}

// ResumeFor lifts the pause for reason.
func (s *Source) ResumeFor(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.pauses[reason] {
		return
	}
	delete(s.pauses, reason)
	s.halted.Store(s.stopping || len(s.pauses) > 0)
	close(s.wake)
	s.wake = make(chan struct{})
}

// ResumeWith lifts the pause for reason; a stream has no prefetch to
// set (see Resume).
func (s *Source) ResumeWith(reason string, _ int) { s.ResumeFor(reason) }

// Pause pauses for the breaker (the app is down).
func (s *Source) Pause() { s.PauseFor(PauseBreaker) }

// Resume lifts the breaker's pause. A stream has no prefetch: what the
// loop takes is bounded by its hand-off queue.
func (s *Source) Resume(int) { s.ResumeFor(PauseBreaker) }

// Paused reports whether reading is paused for any reason.
func (s *Source) Paused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pauses) > 0
}

// StoredOffset asks the broker for the offset stored for consumer on
// stream; ok is false when none is stored.
func StoredOffset(o Options) (off int64, ok bool, err error) {
	o.defaults()
	quietClient()
	env, err := dial(o, envOptions(o))
	if err != nil {
		return 0, false, err
	}
	defer env.Close()
	off, err = env.QueryOffset(o.Consumer, o.Stream)
	switch {
	case errors.Is(err, stream.OffsetNotFoundError):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("query the stored offset: %w", err)
	}
	return off, true, nil
}
