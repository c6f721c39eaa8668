package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/proxy"
	"github.com/hopper-sidecar/hopper/topology"
)

func newRunCmd() *cobra.Command {
	var cf configFlags
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Consume the work queue and deliver each message to the app",
		Long: `Consume the work queue and deliver each message to the app over HTTP.

At start Hopper declares its topology (topology.declare: true) or verifies it
and exits with a clear message on a mismatch, waits until the app answers its
health check, then consumes. SIGTERM stops consuming, lets in-flight messages
finish within shutdown.grace, returns the rest to the queue and exits 0. A
second signal exits at once; nothing undelivered is acked.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := cf.load(cmd)
			if err != nil {
				return err
			}
			log := newLogger(cfg.Log, cmd.ErrOrStderr())
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			go func() {
				<-ctx.Done()
				stop() // the next signal reaches the handler below, not the context
				hard := make(chan os.Signal, 1)
				signal.Notify(hard, syscall.SIGTERM, syscall.SIGINT)
				<-hard
				log.Warn("second signal: exiting now; unsettled messages return to the queue", "event", "SHUTDOWN_FORCED")
				os.Exit(2)
			}()
			return run(ctx, &cfg, log)
		},
	}
	cf.register(cmd.Flags())
	return cmd
}

// run is the sidecar's lifetime: prepare, wait for the app, consume, drain.
func run(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	plan := topology.FromConfig(cfg)
	for _, w := range plan.Warnings() {
		log.Warn(w, "event", "TOPOLOGY_WARNING")
	}
	var ready, consuming atomic.Bool
	if cfg.Admin.Listen != "" {
		srv, err := serveAdmin(cfg.Admin.Listen, &ready, &consuming, log)
		if err != nil {
			return err
		}
		defer srv.Close()
	}

	if err := prepareTopology(ctx, cfg, &plan, log); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}

	app := proxy.NewHTTPApp(proxy.HTTPAppOptions{
		URL:          cfg.App.URL,
		Timeout:      cfg.App.Timeout.D(),
		MaxConns:     workers(cfg) + 4,
		MaxBodyBytes: cfg.App.MaxBodyBytes,
	})
	gate, err := proxy.NewReady(cfg.App.URL, cfg.App.HealthPath, 2*time.Second)
	if err != nil {
		return err
	}
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
	ready.Store(true)

	pub := broker.NewPublisher(broker.PublisherOptions{
		Options:        brokerOptions(cfg, log, "hopper-publisher "+cfg.Queue.Name),
		Channels:       cfg.Broker.PublishChannels,
		ConfirmTimeout: cfg.Broker.ConfirmTimeout.D(),
	})
	defer pub.Close()

	prefetch := cfg.Consumer.Prefetch
	if cfg.Consumer.Ordered {
		prefetch = 1
	}
	px := proxy.New(proxy.Options{
		Plan:               &plan,
		Selector:           cfg.Selector(),
		App:                app,
		Pub:                pub,
		Workers:            workers(cfg),
		Queue:              prefetch,
		Quorum:             cfg.Queue.Type == "quorum",
		UnavailableBackoff: cfg.App.UnavailableBackoff.D(),
		DeadlineHeader:     cfg.Retry.DeadlineHeader,
		Logger:             log,
	})
	// workCtx ends when the grace period does: in-flight HTTP calls are cut
	// off then and their messages go back to the queue unacked.
	workCtx, endWork := context.WithCancel(context.WithoutCancel(ctx))
	defer endWork()
	px.Start(workCtx)

	cons := broker.NewConsumer(broker.ConsumerOptions{
		Options:  brokerOptions(cfg, log, "hopper-consumer "+cfg.Queue.Name),
		Queue:    cfg.Queue.Name,
		Prefetch: prefetch,
		Topology: &plan,
	})
	consuming.Store(true)
	runErr := cons.Run(ctx, func(d *broker.Delivery) { px.Handle(d) })
	consuming.Store(false)

	grace := cfg.Shutdown.Grace.D()
	log.Info("shutting down: consumer cancelled, finishing in-flight messages", "event", "SHUTDOWN_STARTED",
		"grace", grace.String(), "in_flight", px.Stats.InFlight.Load())
	graceCtx, cancel := context.WithTimeout(context.Background(), grace)
	finished := px.Shutdown(graceCtx)
	cancel()
	endWork()
	if err := cons.Close(); err != nil {
		log.Warn("close consumer", "error", err.Error())
	}
	s := &px.Stats
	log.Info("shutdown complete", "event", "SHUTDOWN_COMPLETE", "finished_in_grace", finished,
		"received", s.Received.Load(), "acked", s.Acked.Load(), "retried", s.Retried.Load(),
		"requeued", s.Requeued.Load(), "dead_lettered", s.DeadLettered.Load(), "returned", s.Returned.Load(),
		"returned_on_shutdown", s.ReturnedOnShutdown.Load(), "move_failed", s.MoveFailed.Load())
	return runErr
}

func workers(cfg *config.Config) int {
	if cfg.Consumer.Ordered {
		return 1
	}
	if cfg.Consumer.Workers > 0 {
		return cfg.Consumer.Workers
	}
	return cfg.Consumer.Prefetch
}

// prepareTopology declares or verifies the topology once before consuming.
// An unreachable broker is retried with backoff (and logged once per
// attempt); a topology mismatch ends the run with the broker's reason.
func prepareTopology(ctx context.Context, cfg *config.Config, plan *topology.Plan, log *slog.Logger) error {
	bo := broker.Backoff{Min: cfg.Broker.ReconnectMin.D(), Max: cfg.Broker.ReconnectMax.D()}
	opts := brokerOptions(cfg, log, "hopper-topology "+cfg.Queue.Name)
	for {
		err := broker.Apply(ctx, opts, plan, plan.Declare)
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
		log.Warn("broker not reachable; retrying", "event", "BROKER_CONNECT_FAILED", "error", err.Error(), "retry_in", wait.String())
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// serveAdmin serves /healthz (alive) and /readyz (app ready and consuming).
func serveAdmin(addr string, ready, consuming *atomic.Bool, log *slog.Logger) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case !ready.Load():
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: waiting for the app")
		case !consuming.Load():
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: not consuming")
		default:
			fmt.Fprintln(w, "ready: consuming")
		}
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin server", "error", err.Error())
		}
	}()
	return srv, nil
}
