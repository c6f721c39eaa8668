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
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/hopper-sidecar/hopper/app"
	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/backoff"
	"github.com/hopper-sidecar/hopper/proxy"
	"github.com/hopper-sidecar/hopper/telemetry"
	"github.com/hopper-sidecar/hopper/topology"
)

// Sidecar is one running Hopper.
type Sidecar struct {
	cfg  *config.Config
	log  *slog.Logger
	plan topology.Plan

	// TracerProvider makes the spans (noop when nil); SpansDropped reports
	// spans the exporter lost. cmd/hopper sets both from OTEL_* variables.
	TracerProvider trace.TracerProvider
	SpansDropped   func() int64

	metrics *telemetry.Metrics

	ready, consuming atomic.Bool
	stopping         atomic.Bool
	// phase says what the sidecar waits for before it can consume.
	phase     atomic.Value // string
	px        atomic.Pointer[proxy.Loop]
	cons      atomic.Pointer[broker.Consumer]
	breaker   atomic.Pointer[app.Breaker]
	app       atomic.Pointer[app.Client]
	limiter   atomic.Pointer[app.Limiter]
	adminAddr atomic.Value // string
}

// Version is the binary's version, for the hopper_build_info metric;
// cmd/hopper sets it from its link-time version.
var Version = "dev"

// New returns a sidecar for a validated config.
func New(cfg *config.Config, log *slog.Logger) *Sidecar {
	if log == nil {
		log = slog.Default()
	}
	s := &Sidecar{cfg: cfg, log: log, plan: topology.FromConfig(cfg)}
	s.metrics = telemetry.NewMetrics(telemetry.Sources{
		Version:   Version,
		Tiers:     cfg.AllTiers(),
		Connected: func() bool { c := s.cons.Load(); return c != nil && c.Connected() },
		Paused:    s.Paused,
		HeadersSkipped: func() int64 {
			if a := s.app.Load(); a != nil {
				return a.HeadersSkipped.Load()
			}
			return 0
		},
		SpansDropped: func() int64 {
			if s.SpansDropped != nil {
				return s.SpansDropped()
			}
			return 0
		},
		ConcurrencyLimit: func() int64 { return int64(s.ConcurrencyLimit()) },
		MovesFailing: func() int64 {
			if px := s.px.Load(); px != nil {
				return px.Stats.MovesFailing.Load()
			}
			return 0
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

// Plan is the topology in use.
func (s *Sidecar) Plan() *topology.Plan { return &s.plan }

// Stats returns the delivery counters (nil before consuming starts).
func (s *Sidecar) Stats() *proxy.Stats {
	if px := s.px.Load(); px != nil {
		return &px.Stats
	}
	return nil
}

// Consuming reports whether a consumer is live on the broker.
func (s *Sidecar) Consuming() bool {
	c := s.cons.Load()
	return s.consuming.Load() && c != nil && c.Connected() && c.Active()
}

// Paused reports whether the breaker has paused consuming on purpose.
func (s *Sidecar) Paused() bool {
	c := s.cons.Load()
	return s.consuming.Load() && c != nil && c.Connected() && c.Paused()
}

// PauseReasons lists why consuming is paused (empty when it is not).
func (s *Sidecar) PauseReasons() []string {
	if c := s.cons.Load(); c != nil {
		return c.PauseReasons()
	}
	return nil
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

// Run is the sidecar's lifetime: prepare the topology, wait for the app,
// consume until ctx is done, then drain within the grace period. It returns
// nil after a clean shutdown, and an error when it cannot start (a topology
// mismatch, an admin port in use).
func (s *Sidecar) Run(ctx context.Context) error {
	cfg, log := s.cfg, s.log
	for _, w := range s.plan.Warnings() {
		log.Warn(w, "event", "TOPOLOGY_WARNING")
	}
	if cfg.Admin.Listen != "" {
		srv, err := s.serveAdmin(cfg.Admin.Listen)
		if err != nil {
			return err
		}
		defer srv.Close()
	}

	s.phase.Store("waiting for the broker (declaring or verifying the topology)")
	if err := s.prepareTopology(ctx); err != nil || ctx.Err() != nil {
		return err
	}

	tp := s.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	tracer := tp.Tracer("github.com/hopper-sidecar/hopper")
	client := app.NewClient(app.ClientOptions{
		URL:          cfg.App.URL,
		Timeout:      cfg.App.Timeout.D(),
		MaxConns:     Workers(cfg) + 4,
		MaxBodyBytes: cfg.App.MaxBodyBytes,
		Tracer:       tracer,
		CloudEvents:  cfg.App.CloudEvents,
	})
	s.app.Store(client)
	gate, err := app.NewReady(cfg.App.URL, cfg.App.HealthPath, 2*time.Second)
	if err != nil {
		return err
	}
	s.phase.Store("waiting for the app's health check")
	logged := false
	if err := gate.Wait(ctx, time.Second, func(err error) {
		if !logged {
			log.Info("waiting for the app before consuming", "event", "APP_NOT_READY", "error", err.Error())
			logged = true
		}
	}); err != nil {
		return nil // shut down while waiting: nothing was consumed
	}
	log.Info("app ready", "event", "APP_READY")
	s.ready.Store(true)

	pub := broker.NewPublisher(broker.PublisherOptions{
		Options:        broker.ConfigOptions(cfg.Broker, log, "hopper-publisher "+cfg.Queue.Name),
		Channels:       cfg.Broker.PublishChannels,
		ConfirmTimeout: cfg.Broker.ConfirmTimeout.D(),
	})
	defer func() {
		if err := pub.Close(); err != nil {
			log.Warn("close publisher", "error", err.Error())
		}
	}()

	prefetch := cfg.Consumer.Prefetch
	if cfg.Consumer.Ordered {
		prefetch = 1
	}
	cons := broker.NewConsumer(broker.ConsumerOptions{
		Options:  broker.ConfigOptions(cfg.Broker, log, "hopper-consumer "+cfg.Queue.Name),
		Queue:    cfg.Queue.Name,
		Prefetch: prefetch,
		Topology: &s.plan,
		OnReconnect: func(reason string) {
			s.metrics.Reconnected()
			s.event(tracer, "hopper.reconnect", attribute.String("hopper.reason", reason))
		},
	})
	// The app side, outermost first: breaker (is the app up?), limiter (how
	// much can it take?), client.
	var deliverer proxy.Deliverer = client
	var lim *app.Limiter
	if cfg.Limiter.Enabled && !cfg.Consumer.Ordered {
		lim = app.NewLimiter(client, app.LimiterOptions{
			Max:              Workers(cfg),
			LatencyTolerance: cfg.Limiter.LatencyTolerance,
		})
		s.limiter.Store(lim)
		deliverer = lim
	}
	if cfg.Breaker.Enabled {
		br := app.NewBreaker(deliverer, app.BreakerOptions{
			Failures:      cfg.Breaker.Failures,
			OpenTimeout:   cfg.Breaker.OpenTimeout.D(),
			ProbeInterval: cfg.Breaker.ProbeInterval.D(),
			Prefetch:      prefetch,
			Health:        gate,
			Gate:          cons,
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
	px := proxy.New(proxy.Options{
		Plan:               &s.plan,
		Selector:           cfg.Selector(),
		App:                deliverer,
		Pub:                pub,
		Workers:            Workers(cfg),
		Queue:              prefetch,
		Quorum:             cfg.Queue.Type == "quorum",
		UnavailableBackoff: cfg.App.UnavailableBackoff.D(),
		MoveRetryMin:       cfg.Broker.MoveRetryMin.D(),
		MoveRetryMax:       cfg.Broker.MoveRetryMax.D(),
		MoveHoldMax:        cfg.Broker.MoveHoldMax.D(),
		InPlace:            cfg.Consumer.Ordered,
		// Taking more messages while moves fail would only pile up held
		// deliveries: pause until every held move has gone through.
		OnMovesFailing: func(failing bool) {
			if failing {
				log.Warn("moves failing: consuming paused until they go through", "event", "CONSUMER_PAUSED_MOVES")
				cons.PauseFor(broker.PauseMoves)
			} else {
				log.Info("moves going through again: consuming resumed", "event", "CONSUMER_RESUMED_MOVES")
				cons.ResumeFor(broker.PauseMoves)
			}
		},
		DeadlineHeader: cfg.Retry.DeadlineHeader,
		Logger:         log,
		Tracer:         tracer,
		Observer:       s.metrics,
	})
	s.px.Store(px)
	// workCtx ends when the grace period does: in-flight HTTP calls are cut
	// off then and their messages go back to the queue unacked.
	workCtx, endWork := context.WithCancel(context.WithoutCancel(ctx))
	defer endWork()
	px.Start(workCtx)

	s.cons.Store(cons)
	s.consuming.Store(true)
	s.phase.Store("waiting for the broker (starting the consumer)")
	runErr := cons.Run(ctx, func(d *broker.Delivery) { px.Handle(d) })
	s.consuming.Store(false)
	s.stopping.Store(true)

	grace := cfg.Shutdown.Grace.D()
	log.Info("shutting down: consumer cancelled, finishing in-flight messages", "event", "SHUTDOWN_STARTED",
		"grace", grace.String(), "in_flight", px.Stats.InFlight.Load())
	graceCtx, cancel := context.WithTimeout(context.Background(), grace)
	finished := px.Shutdown(graceCtx)
	cancel()
	endWork()
	if !finished {
		// The grace period is over: the calls still running were cut off and
		// their workers give the messages back now (on a quorum queue by a
		// confirmed republish). Wait for that, bounded by one confirm, so
		// the channel is not closed under them.
		backCtx, cancel := context.WithTimeout(context.Background(), cfg.Broker.ConfirmTimeout.D()+5*time.Second)
		px.Shutdown(backCtx)
		cancel()
	}
	// Closing the consumer connection hands every unsettled delivery back to
	// the broker, which requeues it.
	if err := cons.Close(); err != nil {
		log.Warn("close consumer", "error", err.Error())
	}
	st := &px.Stats
	log.Info("shutdown complete", "event", "SHUTDOWN_COMPLETE", "finished_in_grace", finished,
		"received", st.Received.Load(), "acked", st.Acked.Load(), "retried", st.Retried.Load(),
		"requeued", st.Requeued.Load(), "dead_lettered", st.DeadLettered.Load(), "returned", st.Returned.Load(),
		"returned_on_shutdown", st.ReturnedOnShutdown.Load(), "move_failed", st.MoveFailed.Load())
	return runErr
}

// Workers is the number of concurrent deliveries the config asks for.
func Workers(cfg *config.Config) int {
	if cfg.Consumer.Ordered {
		return 1
	}
	if cfg.Consumer.Workers > 0 {
		return cfg.Consumer.Workers
	}
	return cfg.Consumer.Prefetch
}

// prepareTopology declares or verifies the topology once before consuming.
// An unreachable broker is retried with backoff; a topology mismatch ends
// the run with the broker's reason.
func (s *Sidecar) prepareTopology(ctx context.Context) error {
	cfg := s.cfg
	bo := backoff.Backoff{Min: cfg.Broker.ReconnectMin.D(), Max: cfg.Broker.ReconnectMax.D()}
	opts := broker.ConfigOptions(cfg.Broker, s.log, "hopper-topology "+cfg.Queue.Name)
	for {
		err := broker.Apply(ctx, opts, &s.plan, s.plan.Declare)
		if err == nil {
			return nil
		}
		if errors.Is(err, broker.ErrTopology) {
			return fmt.Errorf("topology check failed (run `hopper topology plan` to see what is expected):\n%w", err)
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

// readiness is the /readyz answer. A consumer sidecar takes no traffic, so
// readiness says whether this pod has started doing its job: not ready
// until it has consumed once (so a rollout waits for a pod that works), and
// not ready while shutting down; ready from then on, also while the broker
// connection is down or consuming is paused on purpose — taking every pod
// out of service during a broker outage would only block node drains.
func (s *Sidecar) readiness() (int, string) {
	cons := s.cons.Load()
	switch {
	case s.stopping.Load():
		return http.StatusServiceUnavailable, "not ready: shutting down"
	case cons == nil || !cons.Started():
		phase, _ := s.phase.Load().(string)
		if phase == "" {
			phase = "starting"
		}
		return http.StatusServiceUnavailable, "not ready: " + phase
	case s.Paused():
		return http.StatusOK, fmt.Sprintf("ready: paused on purpose: %s (breaker %s)", strings.Join(s.PauseReasons(), ", "), s.BreakerState())
	case !s.Consuming():
		return http.StatusOK, "ready: broker connection lost, reconnecting"
	}
	if l := s.ConcurrencyLimit(); l > 0 {
		return http.StatusOK, fmt.Sprintf("ready: consuming (concurrency limit %d)", l)
	}
	return http.StatusOK, "ready: consuming"
}

// serveAdmin serves /livez and /healthz (alive), /readyz and /metrics.
func (s *Sidecar) serveAdmin(addr string) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.metrics.Handler())
	// Liveness: the process answers. Nothing a restart would fix is
	// checked here: a broker or app outage is waited out, not restarted.
	alive := func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }
	mux.HandleFunc("/livez", alive)
	mux.HandleFunc("/healthz", alive)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		code, text := s.readiness()
		w.WriteHeader(code)
		fmt.Fprintln(w, text)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listen %s: %w", addr, err)
	}
	s.adminAddr.Store(ln.Addr().String())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin server", "error", err.Error())
		}
	}()
	return srv, nil
}
