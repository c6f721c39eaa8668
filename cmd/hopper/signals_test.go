package main

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestSignalContextStopIsNoSignal: a command that ends and calls stop has
// not been signalled, so it must not say it is stopping.
func TestSignalContextStopIsNoSignal(t *testing.T) {
	var called atomic.Bool
	ctx, stop := signalContext(context.Background(), exitTempFail, func() { called.Store(true) }, nil)
	stop()
	if ctx.Err() == nil {
		t.Error("the context did not end with stop")
	}
	if called.Load() {
		t.Error("stop was taken for a signal: first was called")
	}
	stop() // a second stop (deferred after an explicit one) does nothing
}

// TestSignalContextSignal: SIGINT ends the context and calls first; stop
// afterwards ends the watch without exiting.
func TestSignalContextSignal(t *testing.T) {
	firstCalled := make(chan struct{})
	ctx, stop := signalContext(context.Background(), exitTempFail, func() { close(firstCalled) }, nil)
	defer stop()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-firstCalled:
	case <-time.After(time.Minute):
		t.Fatal("first not called a minute after SIGINT")
	}
	if ctx.Err() == nil {
		t.Error("the context did not end on SIGINT")
	}
}
