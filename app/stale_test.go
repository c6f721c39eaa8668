package app

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// The app dies while Hopper's keep-alive connection to it sits idle. The
// next message finds that connection dead before it was written and the
// port refusing: the app never received it, so the outcome is a refusal
// (the breaker's business), never a cut that could count a crash for a
// message the app never saw.
func TestAppDownBeforeRequestIsNoCut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(200)
	})}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	c := NewClient(ClientOptions{URL: "http://" + ln.Addr().String() + "/", Timeout: 2 * time.Second, MaxConns: 1})
	if o := c.Deliver(context.Background(), &msg.Message{MessageID: "warm", Headers: map[string]any{}}, msg.Info{Attempt: 1}); o.Status != 200 {
		t.Fatalf("warm-up delivery: %+v", o)
	}
	srv.Close() // the app dies while the pooled connection is idle
	for i := range 3 {
		o := c.Deliver(context.Background(), &msg.Message{MessageID: "healthy", Headers: map[string]any{}}, msg.Info{Attempt: 1})
		if o.Kind != retry.Unavailable || o.Cut {
			t.Fatalf("delivery %d to an app that is down: %+v, want unavailable and not cut", i+1, o)
		}
	}
}

// A live app that resets the connection for one message (its handler
// dies on that input) must receive that message once per delivery: the
// cut is the message's outcome, not a stale connection to try again.
func TestCutByLiveAppIsNotResent(t *testing.T) {
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Hopper-Message-Id")
		mu.Lock()
		seen[id]++
		mu.Unlock()
		if id == "poison" {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				if tc, ok := conn.(*net.TCPConn); ok {
					tc.SetLinger(0) //nolint:errcheck // close sends a reset
				}
				conn.Close()
			}
			return
		}
		w.WriteHeader(200)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	defer srv.Close()
	c := NewClient(ClientOptions{URL: "http://" + ln.Addr().String() + "/", Timeout: 2 * time.Second, MaxConns: 1})
	if o := c.Deliver(context.Background(), &msg.Message{MessageID: "warm", Headers: map[string]any{}}, msg.Info{Attempt: 1}); o.Status != 200 {
		t.Fatalf("warm-up delivery: %+v", o)
	}
	o := c.Deliver(context.Background(), &msg.Message{MessageID: "poison", Headers: map[string]any{}}, msg.Info{Attempt: 1})
	if o.Kind != retry.Unavailable || !o.Cut {
		t.Fatalf("outcome %+v, want unavailable and cut", o)
	}
	mu.Lock()
	n := seen["poison"]
	mu.Unlock()
	if n != 1 {
		t.Fatalf("the app received the message %d times for one delivery, want 1", n)
	}
	// The app is still up: the next message is delivered normally.
	if o := c.Deliver(context.Background(), &msg.Message{MessageID: "next", Headers: map[string]any{}}, msg.Info{Attempt: 1}); o.Status != 200 {
		t.Fatalf("delivery after the cut: %+v", o)
	}
}

// A dying app closes every connection it has, idle ones included; a
// handler that breaks on one message closes only its own. Restarted tells
// the two apart from the client's idle connections.
func TestClientRestartedSeesIdleConnectionsClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Hopper-Message-Id") == "slow" {
			<-hold
		}
		w.WriteHeader(200)
	})}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	c := NewClient(ClientOptions{URL: "http://" + ln.Addr().String() + "/", Timeout: 5 * time.Second, MaxConns: 4})
	// Two connections: one held busy while a second request opens another.
	done := make(chan retry.Outcome, 1)
	go func() {
		done <- c.Deliver(context.Background(), &msg.Message{MessageID: "slow", Headers: map[string]any{}}, msg.Info{Attempt: 1})
	}()
	waitfor.Until(t, 10*time.Second, "the slow request's connection open", func() bool { return c.conns.count() >= 1 })
	if o := c.Deliver(context.Background(), &msg.Message{MessageID: "quick", Headers: map[string]any{}}, msg.Info{Attempt: 1}); o.Status != 200 {
		t.Fatalf("quick delivery: %+v", o)
	}
	close(hold)
	if o := <-done; o.Status != 200 {
		t.Fatalf("slow delivery: %+v", o)
	}
	if c.Restarted() {
		t.Fatal("Restarted with the app up and its connections open")
	}
	srv.Close() // the process ends: every connection closed
	if !c.Restarted() {
		t.Fatal("not Restarted after the app closed every connection")
	}
}
