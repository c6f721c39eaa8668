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
			ctx, stop := signalContext(cmd.Context(), exitForced, nil, func() {
				log.Warn("second signal: exiting now; unsettled messages return to the queue", "event", "SHUTDOWN_FORCED")
			})
			defer stop()
			tracing, err := telemetry.TracingFromEnv(ctx, os.Getenv, version)
			if err != nil {
				return badData(err) // the OTEL_* variables are config too
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

// setMemoryLimit fits Hopper's memory to the container it runs in. The
// byte budgets of following prefetches are lowered to what the container's
// limit leaves room for (config.PrefetchBudget), so large messages cannot
// draw more into memory than the limit holds; without a container limit
// consumer.prefetchBytes stands. The Go runtime then gets a soft memory
// limit that follows those budgets, fitted under the container's own. A
// GOMEMLIMIT set by the operator stands.
func setMemoryLimit(cfg *config.Config, log *slog.Logger) {
	container, limited := memlimit.Container("/")
	if limited {
		if share, lowered := cfg.FitPrefetchBytes(container); lowered {
			log.Info("consumer.prefetchBytes lowered to fit the container's memory limit", "event", "PREFETCH_BYTES_FITTED",
				"bytes", share, "container_limit", container)
		}
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	want, ok := cfg.MemoryLimit()
	if !ok {
		if limited {
			limit, _ := memlimit.Fit(container, container)
			debug.SetMemoryLimit(limit)
			log.Info("soft memory limit from the container's", "event", "MEMORY_LIMIT", "bytes", limit, "container_limit", container)
		}
		return
	}
	limit, capped := memlimit.Fit(want, container)
	debug.SetMemoryLimit(limit)
	if capped {
		log.Info("soft memory limit from the container's: below consumer.prefetchBytes plus headroom",
			"event", "MEMORY_LIMIT", "bytes", limit, "wanted", want, "container_limit", container)
		return
	}
	log.Info("soft memory limit from consumer.prefetchBytes", "event", "MEMORY_LIMIT", "bytes", limit, "container_limit", container)
}
