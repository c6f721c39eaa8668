package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// signalContext ends on SIGINT or SIGTERM, calling first. A second signal
// calls second and exits at once with status forced: that loses nothing
// either, since nothing undelivered was acked and the broker takes back
// every unacked message. run exits exitForced; the DLQ tools exitTempFail,
// since such a run is one stopped part way, to be run again.
//
// The returned stop, called when the command is done, ends the context
// too, but is no signal: first is not called for it (a tool that ended
// normally would otherwise say it is stopping, if that goroutine ran
// before the process exited). stop returns once signals are no longer
// watched.
func signalContext(parent context.Context, forced int, first, second func()) (context.Context, context.CancelFunc) {
	ctx, unwatch := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	stopped, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		<-ctx.Done()
		// A signal leaves its own cause (which still counts as
		// context.Canceled for errors.Is); stop leaves context.Canceled
		// itself.
		if parent.Err() != nil || context.Cause(ctx) == context.Canceled { //nolint:errorlint // the value itself, not what it wraps
			return
		}
		unwatch() // the next signal reaches the channel below, not the context
		hard := make(chan os.Signal, 1)
		signal.Notify(hard, syscall.SIGTERM, syscall.SIGINT)
		defer signal.Stop(hard)
		if first != nil {
			first()
		}
		select {
		case <-hard:
		case <-stopped:
			return
		}
		if second != nil {
			second()
		}
		os.Exit(forced)
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			close(stopped)
			unwatch()
			<-ended
		})
	}
}

// toolStopping is what the DLQ tools say on the first signal.
func toolStopping(stderr io.Writer) func() {
	return func() {
		fmt.Fprintln(stderr, "hopper: stopping: finishing the messages in flight (signal again to exit now; nothing is lost either way)")
	}
}
