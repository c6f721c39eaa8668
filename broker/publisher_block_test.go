package broker

import (
	"context"
	"runtime"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A connection replaced while the broker blocks publishing: the watcher of
// the old connection ends (its notify channel closes) after the new one has
// been blocked too. The old watcher must not release the new block, the new
// watcher's unblock must release every waiter exactly once (no double
// close), and a waiter from before the reconnect must not hang.
func TestPublisherBlockedAcrossReconnect(t *testing.T) {
	p := NewPublisher(PublisherOptions{})
	waitDone := func() chan error {
		done := make(chan error, 1)
		go func() { done <- p.waitUnblocked(context.Background()) }()
		return done
	}
	// released reads the state a waiter waits on, so a negative answer
	// does not depend on how long one looks.
	released := func(chan error) bool {
		p.blockedMu.Lock()
		defer p.blockedMu.Unlock()
		select {
		case <-p.blocked:
			return true
		default:
			return false
		}
	}
	// waitBlocked waits until a block notice handed to a watcher has been
	// applied.
	waitBlocked := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for released(nil) {
			if time.Now().After(deadline) {
				t.Fatal("block notice never applied")
			}
			runtime.Gosched()
		}
	}
	mustWait := func(done chan error) {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("waitUnblocked: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("waiter never released")
		}
	}

	// Connection 1 is blocked; a publisher waits.
	p.setBlocked(1, false)
	ch1 := make(chan amqp.Blocking)
	w1done := make(chan struct{})
	go func() { p.watchBlocked(1, ch1); close(w1done) }()
	ch1 <- amqp.Blocking{Active: true, Reason: "low on memory"}
	waitBlocked()
	early := waitDone()
	if released(early) {
		t.Fatal("a waiter went through while the connection was blocked")
	}

	// Connection 2 replaces it: it starts unblocked, which releases the
	// early waiter, and is then blocked in its turn.
	p.setBlocked(2, false)
	mustWait(early)
	ch2 := make(chan amqp.Blocking)
	w2done := make(chan struct{})
	go func() { p.watchBlocked(2, ch2); close(w2done) }()
	ch2 <- amqp.Blocking{Active: true, Reason: "low on memory"}
	waitBlocked()
	// A second block notice while blocked must not strand earlier waiters.
	late := waitDone()
	ch2 <- amqp.Blocking{Active: true, Reason: "low on disk"}

	// The old connection's watcher ends now: connection 2 is still blocked.
	close(ch1)
	<-w1done
	if released(late) {
		t.Fatal("the old connection's watcher released a block of the new connection")
	}

	// Connection 2 unblocks: the waiter goes through, and its watcher ending
	// afterwards closes nothing twice.
	ch2 <- amqp.Blocking{Active: false}
	mustWait(late)
	close(ch2)
	<-w2done
	mustWait(waitDone())
}
