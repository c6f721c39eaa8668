package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// signalContext ends on SIGINT or SIGTERM, calling first. A second signal
// calls second and exits at once with status forced: that loses nothing
// either, since nothing undelivered was acked and the broker takes back
// every unacked message. run exits exitForced; the DLQ tools exitTempFail,
// since such a run is one stopped part way, to be run again.
func signalContext(parent context.Context, forced int, first, second func()) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-ctx.Done()
		if parent.Err() != nil {
			return
		}
		stop() // the next signal reaches the channel below, not the context
		hard := make(chan os.Signal, 1)
		signal.Notify(hard, syscall.SIGTERM, syscall.SIGINT)
		if first != nil {
			first()
		}
		<-hard
		if second != nil {
			second()
		}
		os.Exit(forced)
	}()
	return ctx, stop
}

// toolStopping is what the DLQ tools say on the first signal.
func toolStopping(stderr io.Writer) func() {
	return func() {
		fmt.Fprintln(stderr, "hopper: stopping: finishing the messages in flight (signal again to exit now; nothing is lost either way)")
	}
}
