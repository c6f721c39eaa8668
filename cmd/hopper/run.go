package main

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/memlimit"
	"github.com/hopper-sidecar/hopper/sidecar"
	"github.com/hopper-sidecar/hopper/telemetry"
	"github.com/spf13/cobra"
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
			ctx, stop := signalContext(cmd.Context(), nil, func() {
				log.Warn("second signal: exiting now; unsettled messages return to the queue", "event", "SHUTDOWN_FORCED")
			})
			defer stop()
			tracing, err := telemetry.TracingFromEnv(ctx, os.Getenv, version)
			if err != nil {
				return err
			}
			if tracing.Enabled {
				log.Info("tracing on", "event", "TRACING_ENABLED", "exporter", tracing.Exporter)
			}
			setMemoryLimit(&cfg, log)
			sidecar.Version = version
			sc := sidecar.New(&cfg, log)
			sc.TracerProvider, sc.SpansDropped = tracing.Provider, tracing.Dropped.Load
			runErr := sc.Run(ctx)
			// Flush traces last, bounded: an unreachable collector must not
			// hold up the exit.
			flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tracing.Shutdown(flushCtx); err != nil {
				log.Warn("flush traces", "error", err.Error())
			}
			return runErr
		},
	}
	cf.register(cmd.Flags())
	return cmd
}

// setMemoryLimit gives the Go runtime a soft memory limit that follows the
// prefetch byte budgets, fitted under the container's own limit. A
// GOMEMLIMIT set by the operator stands.
func setMemoryLimit(cfg *config.Config, log *slog.Logger) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	want, ok := cfg.MemoryLimit()
	if !ok {
		return
	}
	container, _ := memlimit.Container("/")
	limit, capped := memlimit.Fit(want, container)
	debug.SetMemoryLimit(limit)
	if capped {
		log.Warn("the container's memory limit is below what consumer.prefetchBytes lets Hopper hold plus its headroom: "+
			"with large messages the collector will work hard near the limit; lower consumer.prefetchBytes or raise the limit",
			"event", "MEMORY_LIMIT", "bytes", limit, "wanted", want, "container_limit", container)
		return
	}
	log.Info("soft memory limit from consumer.prefetchBytes", "event", "MEMORY_LIMIT", "bytes", limit)
}
