// Package sidecar wires one Hopper instance from a validated config: the
// topology check, the readiness gate, the publisher and consumer
// connections, the worker pool, the admin endpoint, and the ordered
// shutdown. cmd/hopper runs it; the integration tests run exactly the same
// code against a real broker.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/hopper-sidecar/hopper/app"
	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/backoff"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/order"
	"github.com/hopper-sidecar/hopper/proxy"
	"github.com/hopper-sidecar/hopper/route"
	"github.com/hopper-sidecar/hopper/streamsrc"
	"github.com/hopper-sidecar/hopper/telemetry"
	"github.com/hopper-sidecar/hopper/topology"
)

// Sidecar is one running Hopper. It consumes one queue or several (the
// config's subscriptions): each queue has its own topology, retry policy,
// consumer channel and delivery loop, while the app side (client, health
// gate, breaker, concurrency limit), the publishing connection and the
// consuming connection are one for the whole sidecar, since one app is
// behind them all.
type Sidecar struct {
	cfg  *config.Config
	log  *slog.Logger
	subs []*subscription

	// TracerProvider makes the spans (noop when nil); SpansDropped reports
	// spans the exporter lost. cmd/hopper sets both from OTEL_* variables.
	TracerProvider trace.TracerProvider
	SpansDropped   func() int64

	metrics *telemetry.Metrics

	ready, consuming atomic.Bool
	stopping         atomic.Bool
	// phase says what the sidecar waits for before it can consume.
	phase atomic.Value // string
	// notes are what the broker check at start found worth an
	// operator's look (a quorum queue's delivery limit Hopper cannot
	// read); /readyz shows them.
	notes     atomic.Value // []string
	group     atomic.Pointer[broker.Group]
	breaker   atomic.Pointer[app.Breaker]
	refusal   atomic.Pointer[app.Refusal]
	app       atomic.Pointer[app.Client]
	limiter   atomic.Pointer[app.Limiter]
	pub       atomic.Pointer[broker.Publisher]
	adminAddr atomic.Value // string

	// instance names this replica among the others consuming the same
	// queues: its host name (a pod's name) and process id.
	instance string
}

// subscription is one consumed queue: its effective config (the top-level
// one with the subscription's keys laid over it) and what runs it.
type subscription struct {
	cfg  config.Config
	plan topology.Plan
	// routes are the queue's routing rules, nil without any; routesErr
	// is why they did not compile (Validate reports it first).
	routes    *route.Table
	routesErr error
	px        atomic.Pointer[proxy.Loop]
	cons      atomic.Pointer[broker.Consumer]
	// src reads the stream of a stream subscription, beside cons, which
	// consumes the subscription's own queue (where its retries come
	// back); nil for a queue.
	src atomic.Pointer[streamsrc.Source]
	// parked is the last count of the queue's parking queues.
	parked parkedCount
}

func (sub *subscription) name() string { return sub.cfg.Queue.Name }

// prefetch is the consumer's QoS to start with: one for an ordered queue.
func (sub *subscription) prefetch() int {
	p, _, _ := sub.cfg.Concurrency()
	return p
}

func (sub *subscription) consuming() bool {
	c := sub.cons.Load()
	if src := sub.src.Load(); src != nil && !src.Connected() {
		return false
	}
	return c != nil && c.Connected() && c.Active()
}

func (sub *subscription) paused() bool {
	c := sub.cons.Load()
	return c != nil && c.Connected() && c.Paused()
}

// Version is the binary's version, for the hopper_build_info metric;
// cmd/hopper sets it from its link-time version.
var Version = "dev"

// New returns a sidecar for a validated config.
func New(cfg *config.Config, log *slog.Logger) *Sidecar {
	if log == nil {
		log = slog.Default()
	}
	s := &Sidecar{cfg: cfg, log: log, instance: instanceName()}
	var (
		queues []string
		tiers  []time.Duration
		steps  []time.Duration
		routes = map[string][]string{}
	)
	for _, c := range cfg.Consumed() {
		sub := &subscription{cfg: c, plan: topology.FromConfig(&c)}
		sub.routes, sub.routesErr = c.RouteTable()
		s.subs = append(s.subs, sub)
		queues = append(queues, sub.name())
		tiers = append(tiers, c.AllTiers()...)
		if c.Schedule.Enabled {
			steps = append(steps, c.ParkSteps()...)
		}
		if sub.routes != nil {
			names := []string{}
			for _, r := range sub.routes.Routes() {
				names = append(names, r.Name)
			}
			routes[sub.name()] = names
		}
	}
	slices.Sort(tiers)
	slices.Sort(steps)
	s.metrics = telemetry.NewMetrics(telemetry.Sources{
		Version:   Version,
		Queues:    queues,
		Tiers:     slices.Compact(tiers),
		Routes:    routes,
		ParkSteps: slices.Compact(steps),
		Connected: func() bool { g := s.group.Load(); return g != nil && g.Connected() },
		Paused:    s.Paused,
		Refusing:  s.refusing,
		HeadersSkipped: func() int64 {
			if a := s.app.Load(); a != nil {
				return a.HeadersSkipped.Load()
			}
			return 0
		},
		HeadersOmitted: func() map[string]int64 {
			if a := s.app.Load(); a != nil {
				return a.HeadersOmitted()
			}
			m := map[string]int64{}
			for _, r := range app.OmitReasons {
				m[r] = 0
			}
			return m
		},
		SpansDropped: func() int64 {
			if s.SpansDropped != nil {
				return s.SpansDropped()
			}
			return 0
		},
		ConcurrencyLimit: func() int64 { return int64(s.ConcurrencyLimit()) },
		ConsumerActive:   s.consumerActive,
		Parked:           s.parkedByQueue,
		StreamPositions:  s.streamPositions,
		StreamPartitions: s.streamPartitions,
		NextDue:          s.nextDueByQueue,
		MovesFailing: func() int64 {
			var n int64
			for _, sub := range s.subs {
				if px := sub.px.Load(); px != nil {
					n += px.Stats.MovesFailing.Load()
				}
			}
			return n
		},
	})
	return s
}

// Metrics are the sidecar's Prometheus metrics.
func (s *Sidecar) Metrics() *telemetry.Metrics { return s.metrics }

// event records a sidecar-level event (breaker change, reconnect) as a
// span of its own, so it shows on the trace timeline next to deliveries.
func (s *Sidecar) event(tr trace.Tracer, name string, attrs ...attribute.KeyValue) {
	_, span := tr.Start(context.Background(), name, trace.WithAttributes(attrs...))
	span.AddEvent(name, trace.WithAttributes(attrs...))
	span.End()
}

// Plan is the topology of the first (or only) queue.
func (s *Sidecar) Plan() *topology.Plan { return &s.subs[0].plan }

// Plans are the topologies of every consumed queue, in config order.
func (s *Sidecar) Plans() []*topology.Plan {
	out := make([]*topology.Plan, len(s.subs))
	for i, sub := range s.subs {
		out[i] = &sub.plan
	}
	return out
}

// Stats returns the delivery counters of the first (or only) queue (nil
// before consuming starts).
func (s *Sidecar) Stats() *proxy.Stats { return s.QueueStats(s.subs[0].name()) }

// QueueStats returns the delivery counters of the queue named (nil before
// consuming starts, or for a queue the sidecar does not consume).
func (s *Sidecar) QueueStats(queue string) *proxy.Stats {
	for _, sub := range s.subs {
		if sub.name() != queue {
			continue
		}
		if px := sub.px.Load(); px != nil {
			return &px.Stats
		}
	}
	return nil
}

// QueuePrefetch is the prefetch queue's consumer runs with now (0 before it
// exists).
func (s *Sidecar) QueuePrefetch(queue string) int {
	for _, sub := range s.subs {
		if c := sub.cons.Load(); c != nil && sub.name() == queue {
			return c.Prefetch()
		}
	}
	return 0
}

// QueueRole is, for a queue with a single active consumer, whether this
// sidecar's consumer is the active one (broker.RoleActive), a standby
// (broker.RoleStandby) or cannot tell yet on an empty queue
// (broker.RoleIdle); "" while it is not consuming, and for any other queue.
func (s *Sidecar) QueueRole(queue string) string {
	for _, sub := range s.subs {
		if sub.name() == queue {
			return sub.role()
		}
	}
	return ""
}

// role is the consumer's role on a single-active-consumer queue ("" on
// any other).
func (sub *subscription) role() string {
	c := sub.cons.Load()
	if c == nil || !c.SingleActive() || !c.Connected() {
		return ""
	}
	return c.Role()
}

// streamPositions are the stream subscriptions' positions, for the
// hopper_stream_* gauges: a subscription shows once its reader has looked
// its stream up.
func (s *Sidecar) streamPositions() map[string]telemetry.StreamPosition {
	m := map[string]telemetry.StreamPosition{}
	for _, sub := range s.subs {
		src := sub.src.Load()
		if src == nil {
			continue
		}
		if p, ok := src.Position(); ok {
			m[sub.name()] = telemetry.StreamPosition{Stored: float64(p.Stored), Last: float64(p.Last), Lag: float64(p.Lag)}
		}
	}
	return m
}

// streamPartitions are the positions on each partition of the super
// stream subscriptions, for the hopper_stream_partition_* gauges.
func (s *Sidecar) streamPartitions() map[[2]string]telemetry.StreamPosition {
	m := map[[2]string]telemetry.StreamPosition{}
	for _, sub := range s.subs {
		src := sub.src.Load()
		if src == nil || !sub.cfg.Queue.Stream.SuperStream {
			continue
		}
		for _, p := range src.Partitions() {
			active := 0.0
			if p.Active {
				active = 1
			}
			m[[2]string{sub.name(), p.Stream}] = telemetry.StreamPosition{Stored: float64(p.Stored), Last: float64(p.Last), Lag: float64(p.Lag), Active: active}
		}
	}
	return m
}

// consumerActive says, per queue, whether the broker delivers to this
// sidecar's consumer: on a single-active-consumer queue only while it is
// the active one, on any other while it is registered.
func (s *Sidecar) consumerActive() map[string]bool {
	m := make(map[string]bool, len(s.subs))
	for _, sub := range s.subs {
		if c := sub.cons.Load(); c != nil && c.SingleActive() {
			m[sub.name()] = sub.role() == broker.RoleActive
		} else {
			m[sub.name()] = sub.consuming()
		}
	}
	return m
}

// Consuming reports whether a consumer is live on the broker for every
// queue.
func (s *Sidecar) Consuming() bool {
	if !s.consuming.Load() {
		return false
	}
	for _, sub := range s.subs {
		if !sub.consuming() {
			return false
		}
	}
	return true
}

// Paused reports whether consuming of any queue is paused on purpose (the
// breaker and the app refusing Hopper's credentials pause them all; failing
// moves pause the queue whose moves fail). While the app refuses, consuming
// counts as paused also when one delivery is let through as a probe.
func (s *Sidecar) Paused() bool {
	if !s.consuming.Load() {
		return false
	}
	if s.refusing() {
		return true
	}
	for _, sub := range s.subs {
		if sub.paused() {
			return true
		}
	}
	return false
}

// PauseReasons lists why consuming is paused (empty when it is not); with
// several queues each reason names its queue.
func (s *Sidecar) PauseReasons() []string {
	var out []string
	for _, sub := range s.subs {
		for _, r := range s.pauseReasons(sub) {
			if len(s.subs) > 1 {
				r = sub.name() + ": " + r
			}
			out = append(out, r)
		}
	}
	return out
}

// pauseReasons lists why one queue's consuming is paused. Moves failing
// because a queue of its topology is gone (deleted while topology.declare
// is false, or not declarable) name that queue: the operator has to
// declare it again.
func (s *Sidecar) pauseReasons(sub *subscription) []string {
	c := sub.cons.Load()
	if c == nil {
		return nil
	}
	out := c.PauseReasons()
	if r := s.refusal.Load(); r != nil && r.Refusing() {
		// Also while the consumer runs for a probe: the app still refuses.
		i := slices.Index(out, broker.PauseRefused)
		if i < 0 {
			out, i = append(out, broker.PauseRefused), len(out)
		}
		if d := r.Describe(); d != "" {
			out[i] += " (" + d + ")"
		}
	}
	missing := s.missingQueues(sub)
	if len(missing) == 0 {
		return out
	}
	for i, r := range out {
		if r == broker.PauseMoves {
			out[i] = r + " (" + missingText(missing) + ")"
		}
	}
	return out
}

// missingQueues lists the queues of sub's topology that moves found
// missing.
func (s *Sidecar) missingQueues(sub *subscription) []string {
	pub := s.pub.Load()
	if pub == nil {
		return nil
	}
	var out []string
	for _, name := range pub.MissingQueues() {
		if slices.ContainsFunc(sub.plan.Queues(), func(q topology.Queue) bool { return q.Name == name }) {
			out = append(out, name)
		}
	}
	return out
}

func missingText(queues []string) string {
	if len(queues) == 1 {
		return "queue " + queues[0] + " does not exist"
	}
	return "queues " + strings.Join(queues, ", ") + " do not exist"
}

// refusing reports whether the app refuses Hopper's credentials now.
func (s *Sidecar) refusing() bool {
	r := s.refusal.Load()
	return r != nil && r.Refusing()
}

// ConcurrencyLimit is the adaptive limit on concurrent requests to the app
// (0 when the limiter is off).
func (s *Sidecar) ConcurrencyLimit() int {
	if l := s.limiter.Load(); l != nil {
		return l.Limit()
	}
	return 0
}

// BreakerState is "closed", "open" or "half-open" ("" without a breaker).
func (s *Sidecar) BreakerState() string {
	if b := s.breaker.Load(); b != nil {
		return b.State()
	}
	return ""
}

// AdminAddr is the admin endpoint's bound address ("" when disabled or not
// yet listening).
func (s *Sidecar) AdminAddr() string {
	a, _ := s.adminAddr.Load().(string)
	return a
}

// label names the sidecar's connections: its queue, or its queues.
func (s *Sidecar) label() string {
	names := make([]string, len(s.subs))
	for i, sub := range s.subs {
		names[i] = sub.name()
	}
	return strings.Join(names, ",")
}

// Run is the sidecar's lifetime: prepare the topology, wait for the app,
// consume until ctx is done, then drain within the grace period. It returns
// nil after a clean shutdown, and an error when it cannot start (a topology
// mismatch, an admin port in use). Each phase is a function of its own, in
// the order they run; what one phase makes, the next ones are handed.
func (s *Sidecar) Run(ctx context.Context) error {
	if err := s.checkQueues(); err != nil {
		return err
	}
	if s.cfg.Admin.Listen != "" {
		srv, err := s.serveAdmin(s.cfg.Admin.Listen)
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	s.phase.Store("waiting for the broker (declaring or verifying the topology)")
	if err := s.prepareTopology(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	tracer := s.tracer()
	side, err := s.connectApp(tracer)
	if err != nil {
		return err
	}
	if !s.waitForApp(ctx, side.ready) {
		return nil // shut down while waiting: nothing was consumed
	}
	if err := s.newSources(); err != nil {
		return err
	}
	pub := s.startPublisher()
	defer s.closePublisher(pub)
	group, gates := s.newConsumers(pub, tracer)
	deliverer := s.guardApp(ctx, side, gates, tracer)
	// workCtx ends when the grace period does: in-flight HTTP calls are cut
	// off then and their messages go back to the queue unacked.
	workCtx, endWork := context.WithCancel(context.WithoutCancel(ctx))
	defer endWork()
	s.startLoops(workCtx, deliverer, pub, group, tracer)
	if s.scheduling() {
		countCtx, stopCount := context.WithCancel(ctx)
		defer stopCount()
		go s.countParked(countCtx)
	}
	runErr := s.consume(ctx, group)
	s.drain(group, endWork)
	return runErr
}

// checkQueues refuses to start with a queue whose routing rules did not
// compile, and logs what the topology plans warn of.
func (s *Sidecar) checkQueues() error {
	log := s.log
	for _, sub := range s.subs {
		if sub.routesErr != nil {
			return fmt.Errorf("routing rules of queue %s: %w", sub.name(), sub.routesErr)
		}
	}
	for _, sub := range s.subs {
		for _, w := range sub.plan.Warnings() {
			log.Warn(w, "event", "TOPOLOGY_WARNING", "queue", sub.name())
		}
	}
	return nil
}

// tracer makes the sidecar's spans (noop without a TracerProvider).
func (s *Sidecar) tracer() trace.Tracer {
	tp := s.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	tracer := tp.Tracer("github.com/hopper-sidecar/hopper")
	return tracer
}

// appSide is what talks to the app before anything guards it: the
// client, its credentials, the health check, and the number of workers
// of all queues together.
type appSide struct {
	client  *app.Client
	auth    *app.Auth
	ready   *app.Ready
	workers int
}

// connectApp builds the app side shared by every queue: the client with
// its credentials and TLS, and the health check. An unreadable credential
// or TLS file ends the run.
func (s *Sidecar) connectApp(tracer trace.Tracer) (*appSide, error) {
	cfg, log := s.cfg, s.log
	// Every queue's workers may be in a request at once, so the pool and the
	// concurrency limit are sized for all of them.
	workers := 0
	queueURLs := map[string]string{}
	routeURLs := map[string]map[string]string{}
	for _, sub := range s.subs {
		workers += Workers(&sub.cfg)
		if sub.cfg.App.URL != cfg.App.URL {
			queueURLs[sub.name()] = sub.cfg.App.URL
		}
		if u := sub.cfg.RouteURLs(); u != nil {
			routeURLs[sub.name()] = u
		}
	}
	auth, err := app.NewAuth(app.AuthOptions{
		TokenFile:            cfg.App.Auth.Token.File,
		TokenHeader:          cfg.App.Auth.Token.Header,
		HMACKeyFile:          cfg.App.Auth.HMAC.KeyFile,
		StandardWebhooksFile: cfg.App.Auth.StandardWebhooks.SecretFile,
		OnReadError: func(err error) {
			log.Warn("a changed app.auth file could not be read", "event", "APP_AUTH_FILE_UNREADABLE", "error", err.Error())
		},
	})
	if err != nil {
		return nil, fmt.Errorf("app.auth: %w", err)
	}
	tlsCfg, err := app.NewTLS(app.TLSOptions{
		CAFile:   cfg.App.TLS.CAFile,
		CertFile: cfg.App.TLS.CertFile,
		KeyFile:  cfg.App.TLS.KeyFile,
		OnReadError: func(err error) {
			log.Warn("a changed app.tls file could not be loaded", "event", "APP_AUTH_FILE_UNREADABLE", "error", err.Error())
		},
	})
	if err != nil {
		return nil, fmt.Errorf("app.tls: %w", err)
	}
	client := app.NewClient(app.ClientOptions{
		URL:          cfg.App.URL,
		QueueURLs:    queueURLs,
		RouteURLs:    routeURLs,
		Timeout:      cfg.App.Timeout.D(),
		MaxConns:     workers + 4,
		MaxBodyBytes: cfg.App.MaxBodyBytes,
		Tracer:       tracer,
		CloudEvents:  cfg.App.CloudEvents,
		Limits: app.Limits{
			MaxHeaders:     cfg.App.Forward.MaxHeaders,
			MaxHeaderBytes: cfg.App.Forward.MaxHeaderBytes,
			MaxValueBytes:  cfg.App.Forward.MaxValueBytes,
		},
		Auth: auth,
		TLS:  tlsCfg,
	})
	s.app.Store(client)
	gate, err := app.NewReady(cfg.App.URL, cfg.App.HealthPath, 2*time.Second)
	if err != nil {
		return nil, err
	}
	gate.UseTLS(tlsCfg)
	return &appSide{client: client, auth: auth, ready: gate, workers: workers}, nil
}

// waitForApp holds consuming back until the app's health check passes.
// It reports false when ctx ended first.
func (s *Sidecar) waitForApp(ctx context.Context, gate *app.Ready) bool {
	log := s.log
	s.phase.Store("waiting for the app's health check")
	logged := false
	if err := gate.Wait(ctx, time.Second, func(err error) {
		if !logged {
			log.Info("waiting for the app before consuming", "event", "APP_NOT_READY", "error", err.Error())
			logged = true
		}
	}); err != nil {
		return false
	}
	log.Info("app ready", "event", "APP_READY")
	s.ready.Store(true)
	return true
}

// startPublisher opens the publishing connection every queue's moves go
// through.
func (s *Sidecar) startPublisher() *broker.Publisher {
	cfg, log := s.cfg, s.log
	pub := broker.NewPublisher(broker.PublisherOptions{
		Options:        broker.ConfigOptions(cfg.Broker, log, "hopper-publisher "+s.label()),
		Channels:       cfg.Broker.PublishChannels,
		ConfirmTimeout: cfg.Broker.ConfirmTimeout.D(),
		// A move that finds a queue of the topology deleted declares it
		// again (topology.declare) or names it in the pause it causes.
		Topology: s.Plans(),
	})
	s.pub.Store(pub)
	return pub
}

// closePublisher closes the publishing connection once everything that
// publishes has stopped.
func (s *Sidecar) closePublisher(pub *broker.Publisher) {
	if err := pub.Close(); err != nil {
		s.log.Warn("close publisher", "error", err.Error())
	}
}

// newConsumers makes every queue's consumer, on one consuming connection
// (the group), and the gate the breaker pauses them all with.
func (s *Sidecar) newConsumers(pub *broker.Publisher, tracer trace.Tracer) (*broker.Group, consumers) {
	cfg, log := s.cfg, s.log
	group := broker.NewGroup(broker.ConfigOptions(cfg.Broker, log, "hopper-consumer "+s.label()), func(reason string) {
		s.metrics.Reconnected()
		s.event(tracer, "hopper.reconnect", attribute.String("hopper.reason", reason))
	})
	gates := make(consumers, len(s.subs))
	for i, sub := range s.subs {
		cons := broker.NewConsumer(broker.ConsumerOptions{
			Options:  broker.ConfigOptions(cfg.Broker, log, "hopper-consumer "+sub.name()),
			Queue:    sub.name(),
			Prefetch: sub.prefetch(),
			// The consumer holds the byte budget so that every prefetch
			// it is given (the start, the limit's, the breaker's Resume)
			// is capped by it.
			PrefetchBytes: sub.prefetchBytes(),
			Topology:      &sub.plan,
			// What the consumer took but never handed to the loop when it
			// stops goes back as the loop gives back: a republished copy on
			// a quorum queue.
			Quorum:         sub.cfg.Queue.Type == "quorum",
			Publisher:      pub,
			DeadlineHeader: sub.cfg.Retry.DeadlineHeader,
			Ordered:        sub.ordered(),
			OnOrderBroken: func(n int) {
				for range n {
					s.metrics.ForQueue(sub.name()).OrderBroken(telemetry.OrderBrokenReturned)
				}
			},
			SingleActive: sub.cfg.Queue.SAC(),
			KeepActive:   sub.keepsActive(),
			Priority:     sub.consumerPriority(s.instance),
			OnReconnect: func(reason string) {
				s.metrics.Reconnected()
				s.event(tracer, "hopper.reconnect", attribute.String("hopper.reason", reason),
					attribute.String("hopper.queue", sub.name()))
			},
		})
		sub.cons.Store(cons)
		gates[i] = cons
		if src := sub.src.Load(); src != nil {
			gates = append(gates, src)
		}
	}
	return group, gates
}

// newSources makes the stream reader of every stream subscription.
func (s *Sidecar) newSources() error {
	for _, sub := range s.subs {
		if sub.cfg.Queue.Stream.Name == "" {
			continue
		}
		o, err := streamsrc.ConfigOptions(&sub.cfg, s.log)
		if err != nil {
			return fmt.Errorf("stream %s: %w", sub.cfg.Queue.Stream.Name, err)
		}
		// The loop's hand-off queue holds the stream's prefetch beside
		// its queue's (see newLoop).
		o.Prefetch = sub.maxPrefetch()
		o.PrefetchBytes = sub.prefetchBytes()
		if _, workers, follow := sub.cfg.Concurrency(); follow {
			// As a queue's prefetch follows the limit (followLimit), so
			// does what the stream reader hands over, and with it what
			// the stream client reads ahead. Held at the most the limit
			// could ask for (1,024 messages at the defaults, where a
			// queue's prefetch starts at 128), a stream read at the
			// defaults took more memory than a queue for no speed.
			o.Follow = func() int {
				lim := s.limiter.Load()
				if lim == nil {
					return o.Prefetch
				}
				return sub.cfg.FollowPrefetch(max(1, lim.Limit()/len(s.subs)), workers)
			}
			o.FollowEvery = followEvery
		}
		sub.src.Store(streamsrc.New(o))
	}
	return nil
}

// guardApp puts in front of the app side what decides whether and how much
// to call it: the limiter, the breaker, the app's refusal of Hopper's
// credentials. Their background work runs until ctx ends.
func (s *Sidecar) guardApp(ctx context.Context, side *appSide, gates consumers, tracer trace.Tracer) proxy.Deliverer {
	cfg, log := s.cfg, s.log
	client, gate, auth, workers := side.client, side.ready, side.auth, side.workers
	// The app side, outermost first: breaker (is the app up?), limiter (how
	// much can it take?), client. One of each for every queue: the app is
	// one. The limit's fair sharing lets an ordered queue's single request
	// take its turn beside busy queues; a sidecar of ordered queues only has
	// no use for a limit.
	var deliverer proxy.Deliverer = client
	var lim *app.Limiter
	if cfg.Limiter.Enabled && !allOrdered(s.subs) {
		lim = app.NewLimiter(client, app.LimiterOptions{
			Max:              workers,
			Initial:          initialLimit(s.subs),
			LatencyTolerance: cfg.Limiter.LatencyTolerance,
		})
		s.limiter.Store(lim)
		deliverer = lim
		go followLimit(ctx, lim, s.subs)
	}
	if cfg.Breaker.Enabled {
		br := app.NewBreaker(deliverer, app.BreakerOptions{
			Failures:      cfg.Breaker.Failures,
			OpenTimeout:   cfg.Breaker.OpenTimeout.D(),
			ProbeInterval: cfg.Breaker.ProbeInterval.D(),
			Health:        gate,
			Restarted:     client.Restarted,
			Gate:          gates,
			Limiter:       lim,
			Logger:        log,
			OnState: func(state string) {
				s.metrics.SetBreaker(state)
				if state == "open" {
					s.metrics.BreakerOpened()
				}
				s.event(tracer, "hopper.breaker."+state)
			},
		})
		s.breaker.Store(br)
		go br.Run(ctx)
		deliverer = br
	}
	// Outermost: whether the app takes Hopper's requests at all. An answer
	// the outcome table makes pause (401 by default) is about Hopper's
	// credentials, the same for every message; every queue pauses for a
	// reason of its own beside the breaker's, and a real delivery probes
	// until one is accepted (see app.Refusal).
	var credentialsChanged func() bool
	if auth != nil {
		credentialsChanged = auth.Changed
	}
	ref := app.NewRefusal(deliverer, app.RefusalOptions{
		Gate:               reasonGate{cs: gates, reason: broker.PauseRefused},
		MaxRefused:         cfg.App.Auth.MaxRefused.D(),
		CredentialsChanged: credentialsChanged,
		Logger:             log,
		OnChange: func(refused bool) {
			if refused {
				s.metrics.CredentialsRefused()
				s.event(tracer, "hopper.app.credentials_refused")
				return
			}
			s.event(tracer, "hopper.app.credentials_accepted")
		},
	})
	s.refusal.Store(ref)
	go ref.Run(ctx)
	deliverer = ref
	return deliverer
}

// startLoops starts every queue's delivery loop on workCtx and hands it
// its consumer's deliveries.
func (s *Sidecar) startLoops(workCtx context.Context, deliverer proxy.Deliverer, pub *broker.Publisher, group *broker.Group, tracer trace.Tracer) {
	log := s.log
	// With several queues, a queue whose messages keep failing is paced
	// while another queue's succeed, so its retries do not take the broker
	// and Hopper from the healthy queue beside it.
	var activity *app.Activity
	if len(s.subs) > 1 {
		activity = app.NewActivity()
	}
	for _, sub := range s.subs {
		d := deliverer
		if activity != nil {
			d = app.NewPacer(deliverer, app.PacerOptions{Queue: sub.name(), Activity: activity, Logger: log})
		}
		px := s.newLoop(sub, d, pub, log, tracer)
		sub.px.Store(px)
		px.Start(workCtx)
		cons := sub.cons.Load()
		group.Add(cons, func(d *broker.Delivery) { px.Handle(d) })
	}
}

// consume runs the consumers and the stream readers until ctx ends; a
// stream reader has handed its last message to the loop when it returns.
//
// A stream reader that cannot read on this broker at all (it returns an
// error, not nil) stops everything with its error: subscribing again
// would only repeat the refusal, and the process should exit saying why.
func (s *Sidecar) consume(ctx context.Context, group *broker.Group) error {
	s.group.Store(group)
	s.consuming.Store(true)
	s.phase.Store("waiting for the broker (starting the consumer)")
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	var readers sync.WaitGroup
	for _, sub := range s.subs {
		src := sub.src.Load()
		if src == nil {
			continue
		}
		px := sub.px.Load()
		readers.Go(func() {
			if err := src.Run(ctx, func(d *streamsrc.Delivery) { px.Handle(d) }); err != nil {
				fail(fmt.Errorf("stream subscription %s: %w", sub.name(), err))
			}
		})
	}
	runErr := group.Run(ctx)
	readers.Wait()
	s.consuming.Store(false)
	s.stopping.Store(true)
	if cause := context.Cause(ctx); runErr == nil && cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		runErr = cause
	}
	return runErr
}

// drain finishes the in-flight messages within the grace period, then
// ends the work (endWork) and closes the consuming connection, which
// hands every unsettled delivery back to the broker.
func (s *Sidecar) drain(group *broker.Group, endWork context.CancelFunc) {
	cfg, log := s.cfg, s.log
	grace := cfg.Shutdown.Grace.D()
	log.Info("shutting down: consumer cancelled, finishing in-flight messages", "event", "SHUTDOWN_STARTED",
		"grace", grace.String(), "in_flight", s.inFlight())
	graceCtx, cancel := context.WithTimeout(context.Background(), grace)
	finished := s.shutdownLoops(graceCtx)
	cancel()
	endWork()
	if !finished {
		// The grace period is over: the calls still running were cut off and
		// their workers give the messages back now (on a quorum queue by a
		// confirmed republish). Wait for that, bounded by one confirm, so
		// the channels are not closed under them.
		backCtx, cancel := context.WithTimeout(context.Background(), cfg.Broker.ConfirmTimeout.D()+5*time.Second)
		s.shutdownLoops(backCtx)
		cancel()
	}
	// The loops have settled what they could: each stream reader stores
	// its offset up to the first message still unsettled, which the next
	// reader of the same name reads again.
	for _, sub := range s.subs {
		if src := sub.src.Load(); src != nil {
			if err := src.Close(); err != nil {
				log.Warn("close stream reader", "queue", sub.name(), "error", err.Error())
			}
		}
	}
	// Closing the consumer connection hands every unsettled delivery back to
	// the broker, which requeues it.
	if err := group.Close(); err != nil {
		log.Warn("close consumer", "error", err.Error())
	}
	for _, sub := range s.subs {
		st := &sub.px.Load().Stats
		log.Info("shutdown complete", "event", "SHUTDOWN_COMPLETE", "queue", sub.name(), "finished_in_grace", finished,
			"received", st.Received.Load(), "acked", st.Acked.Load(), "retried", st.Retried.Load(),
			"requeued", st.Requeued.Load(), "dead_lettered", st.DeadLettered.Load(), "returned", st.Returned.Load(),
			"returned_on_shutdown", st.ReturnedOnShutdown.Load(), "move_failed", st.MoveFailed.Load())
	}
}

// newLoop builds the delivery loop of one queue.
func (s *Sidecar) newLoop(sub *subscription, deliverer proxy.Deliverer, pub proxy.Publisher, log *slog.Logger, tracer trace.Tracer) *proxy.Loop {
	cfg := &sub.cfg
	return proxy.New(proxy.Options{
		Plan:               &sub.plan,
		Selector:           cfg.Selector(),
		Routes:             sub.routes,
		App:                deliverer,
		Pub:                pub,
		Workers:            Workers(cfg),
		WorkerCap:          s.workerCap(cfg),
		Queue:              sub.handOff(),
		Quorum:             cfg.Queue.Type == "quorum",
		UnavailableBackoff: cfg.App.UnavailableBackoff.D(),
		MoveRetryMin:       cfg.Broker.MoveRetryMin.D(),
		MoveRetryMax:       cfg.Broker.MoveRetryMax.D(),
		MoveHoldMax:        cfg.Broker.MoveHoldMax.D(),
		InPlace:            cfg.Consumer.Ordered,
		OrderingKey:        orderingKey(cfg),
		// A single active consumer of an ordered queue stays registered
		// while paused, so what the breaker refuses comes back at once.
		PausedKeepsConsuming: sub.keepsActive(),
		Batch:                batch.Limits{MaxMessages: cfg.Consumer.Batch.Size(), MaxBytes: cfg.Consumer.Batch.MaxBytes},
		BatchWait:            cfg.Consumer.Batch.MaxWait.D(),
		// Taking more messages while moves fail would only pile up held
		// deliveries: pause this queue until every held move has gone
		// through. Other queues, whose moves go elsewhere, carry on.
		OnMovesFailing: func(failing bool) {
			cons := sub.cons.Load()
			if failing {
				attrs := []any{"event", "CONSUMER_PAUSED_MOVES", "queue", sub.name()}
				if missing := s.missingQueues(sub); len(missing) > 0 {
					attrs = append(attrs, "missing_queues", missing)
				}
				log.Warn("moves failing: consuming paused until they go through", attrs...)
				cons.PauseFor(broker.PauseMoves)
				if src := sub.src.Load(); src != nil {
					src.PauseFor(broker.PauseMoves)
				}
			} else {
				log.Info("moves going through again: consuming resumed", "event", "CONSUMER_RESUMED_MOVES", "queue", sub.name())
				cons.ResumeFor(broker.PauseMoves)
				if src := sub.src.Load(); src != nil {
					src.ResumeFor(broker.PauseMoves)
				}
			}
		},
		DeadlineHeader: cfg.Retry.DeadlineHeader,
		Schedule:       schedulePolicy(cfg),
		Refusals:       s.refusals(),
		Logger:         log,
		Tracer:         tracer,
		Observer:       s.metrics.ForQueue(sub.name()),
	})
}

// handOff is the size of a loop's hand-off queue: what its consumer can
// hold unacked, and as much again for a stream subscription, whose stream
// reader hands over up to its own prefetch beside the queue's consumer, so
// that neither ever blocks handing a delivery over.
func (sub *subscription) handOff() int {
	if sub.cfg.Queue.Stream.Name != "" {
		return 2 * sub.maxPrefetch()
	}
	return sub.maxPrefetch()
}

// workerCap is a loop's bound on workers: the concurrency limit, when
// there is one. Without it a queue whose prefetch follows the limit (about
// twice the limit) started a worker for every delivery it held, half of
// them parked on the limit, their stacks most of what the sidecar held
// beyond the Go runtime's own. Loops whose workers hold a delivery while
// no request of theirs is at the app (in place, behind an ordering key)
// or send batches keep their ceiling: capped at the limit, a few held
// deliveries would stop the rest while the app waits idle.
func (s *Sidecar) workerCap(cfg *config.Config) func() int {
	lim := s.limiter.Load()
	if lim == nil || cfg.Consumer.Ordered || cfg.Consumer.OrderingKey != "" || cfg.Consumer.Batch.On() {
		return nil
	}
	return lim.Limit
}

// refusals is what the delivery loops tell of the app refusing Hopper
// (nil before Run has made it).
func (s *Sidecar) refusals() proxy.Refusals {
	if r := s.refusal.Load(); r != nil {
		return r
	}
	return nil
}

// shutdownLoops stops every delivery loop at once and waits for all within
// ctx; it reports whether all finished.
func (s *Sidecar) shutdownLoops(ctx context.Context) bool {
	done := make(chan bool, len(s.subs))
	for _, sub := range s.subs {
		go func() { done <- sub.px.Load().Shutdown(ctx) }()
	}
	all := true
	for range s.subs {
		all = <-done && all
	}
	return all
}

func (s *Sidecar) inFlight() int64 {
	var n int64
	for _, sub := range s.subs {
		if px := sub.px.Load(); px != nil {
			n += px.Stats.InFlight.Load()
		}
	}
	return n
}

// ordered says which of the queue's messages must keep their place in
// line: all of an ordered queue, those with a key when it has an ordering
// key; nil when none must.
func (sub *subscription) ordered() func(*msg.Message) bool {
	if sub.cfg.Consumer.Ordered {
		return func(*msg.Message) bool { return true }
	}
	src := orderingKey(&sub.cfg)
	if !src.Set() {
		return nil
	}
	return func(m *msg.Message) bool { _, ok := src.Key(m); return ok }
}

// instanceName is what tells this replica from the others: the host name,
// which in Kubernetes is the pod's, and the process id, which tells apart
// two processes on one host.
func instanceName() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	return host + "/" + strconv.Itoa(os.Getpid())
}

// consumerPriority is the priority this replica subscribes a partition
// queue with: how much it prefers that partition, so that replicas share
// the partitions where the broker activates the consumer of highest
// priority. 0 (none) for a queue that is not a partition.
func (sub *subscription) consumerPriority(instance string) int {
	if sub.cfg.Topology.PartitionOf == "" {
		return 0
	}
	return order.Preference(instance, sub.name())
}

// keepsActive says whether the queue's consumer stays registered while
// paused: a single active consumer of an ordered queue, whose cancel would
// let a standby deliver the messages behind the ones this pod still holds.
func (sub *subscription) keepsActive() bool {
	return sub.cfg.Queue.SAC() && sub.ordered() != nil
}

// orderingKey is the key source of a validated config.
func orderingKey(cfg *config.Config) order.Source {
	src, err := order.Parse(cfg.Consumer.OrderingKey)
	if err != nil {
		// Validate refuses such a config before any loop is built.
		panic(fmt.Sprintf("consumer.orderingKey passed validation: %v", err))
	}
	return src
}

func allOrdered(subs []*subscription) bool {
	for _, sub := range subs {
		if !sub.cfg.Consumer.Ordered {
			return false
		}
	}
	return true
}

// consumers is the breaker's gate over every queue's consumer and every
// stream's reader: the app is one, so when it is down no queue takes
// deliveries.
type consumers []gate

// gate pauses and resumes what takes deliveries for one subscription: a
// queue's consumer or a stream's reader.
type gate interface {
	Pause()
	Resume(prefetch int)
	PauseFor(reason string)
	ResumeWith(reason string, prefetch int)
}

func (cs consumers) Pause() {
	for _, c := range cs {
		c.Pause()
	}
}

// Resume resumes each consumer with prefetch, or with its own configured
// one when prefetch is 0.
func (cs consumers) Resume(prefetch int) {
	for _, c := range cs {
		c.Resume(prefetch)
	}
}

// reasonGate pauses and resumes every queue's consumer for one reason of
// its own: the app refusing Hopper's credentials holds consuming paused
// whatever the breaker does, and the breaker closing does not lift it.
type reasonGate struct {
	cs     consumers
	reason string
}

func (g reasonGate) Pause() {
	for _, c := range g.cs {
		c.PauseFor(g.reason)
	}
}

// Resume drops the reason and consumes with prefetch, or with each
// consumer's own configured one when prefetch is 0.
func (g reasonGate) Resume(prefetch int) {
	for _, c := range g.cs {
		c.ResumeWith(g.reason, prefetch)
	}
}

// noteDeliveryLimits logs, and keeps for /readyz, what the broker says of a
// quorum queue's delivery limit that Hopper did not set. A failure to ask
// is logged and does not stop the start: the topology was just checked.
func (s *Sidecar) noteDeliveryLimits(ctx context.Context, opts broker.Options, sub *subscription) {
	notes, err := broker.DeliveryLimitNotes(ctx, opts, &sub.plan)
	if err != nil {
		s.log.Warn("could not check the queue's type for its delivery limit", "event", "QUORUM_DELIVERY_LIMIT_UNKNOWN", "queue", sub.name(), "error", err.Error())
	}
	for _, n := range notes {
		s.log.Warn(n, "event", "QUORUM_DELIVERY_LIMIT", "queue", sub.name())
	}
	if len(notes) > 0 {
		old, _ := s.notes.Load().([]string)
		s.notes.Store(append(slices.Clone(old), notes...))
	}
}

// noteTiers logs what the topology's declare found of tiers of another
// type than planned (kept, replaced or succeeded), and shows the kept
// ones on /readyz.
func (s *Sidecar) noteTiers(sub *subscription) {
	notes := sub.plan.TierNotes()
	for _, n := range notes {
		s.log.Warn(n, "event", "TIER_TYPE_CHANGED", "queue", sub.name())
	}
	if len(notes) > 0 {
		old, _ := s.notes.Load().([]string)
		s.notes.Store(append(slices.Clone(old), notes...))
	}
}

// Workers is the number of concurrent deliveries the config asks for.
func Workers(cfg *config.Config) int {
	_, w, _ := cfg.Concurrency()
	return w
}

// prepareTopology declares or verifies every queue's topology once before
// consuming. An unreachable broker is retried with backoff; a topology
// mismatch ends the run with the broker's reason.
func (s *Sidecar) prepareTopology(ctx context.Context) error {
	cfg := s.cfg
	bo := backoff.Backoff{Min: cfg.Broker.ReconnectMin.D(), Max: cfg.Broker.ReconnectMax.D()}
	opts := broker.ConfigOptions(cfg.Broker, s.log, "hopper-topology "+s.label())
	for _, sub := range s.subs {
		for {
			err := broker.Apply(ctx, opts, &sub.plan, sub.plan.Declare)
			if err == nil {
				s.noteDeliveryLimits(ctx, opts, sub)
				s.noteTiers(sub)
				break
			}
			if errors.Is(err, broker.ErrTopology) {
				return fmt.Errorf("topology check failed for queue %s (run `hopper topology plan` to see what is expected):\n%w", sub.name(), err)
			}
			if ctx.Err() != nil {
				return nil
			}
			wait := bo.Next()
			s.log.Warn("broker not reachable; retrying", "event", "BROKER_CONNECT_FAILED", "error", err.Error(), "retry_in", wait.String())
			if backoff.Sleep(ctx, wait) != nil {
				return nil
			}
		}
	}
	return nil
}
