package app

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// TestStaleKeepAliveAfterAppRestart: after the app restarts, the pooled
// connections are dead; the next delivery must reach the new app instead
// of failing once per dead connection.
func TestStaleKeepAliveAfterAppRestart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	serve := func(ln net.Listener) *http.Server {
		srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(200)
		})}
		go srv.Serve(ln) //nolint:errcheck // ends with Close
		return srv
	}
	srv := serve(ln)
	app := NewClient(ClientOptions{URL: "http://" + addr + "/", Timeout: 2 * time.Second, MaxConns: 4})
	m := &msg.Message{MessageID: "x", Headers: map[string]any{}, Body: []byte("b")}
	if o := app.Deliver(context.Background(), m, msg.Info{Attempt: 1}); o.Status != 200 {
		t.Fatalf("first delivery: %+v", o)
	}
	srv.Close() // closes the pooled connection from the server side
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv2 := serve(ln2)
	defer srv2.Close()
	// Whether the server's FIN has reached the idle pooled connection yet
	// or not, the first request on it fails before any answer (EOF, or a
	// reset for a write to a closed socket) and must be retried on a fresh
	// connection.
	for i := range 3 {
		if o := app.Deliver(context.Background(), m, msg.Info{Attempt: 1}); o.Kind != retry.Response || o.Status != 200 {
			t.Fatalf("delivery %d after the app restarted: %+v", i+1, o)
		}
	}
}

// TestAppDyingMidRequestIsACut: the app takes the request on a connection
// it has served before and dies with it (every connection closed, the port
// refusing). The client's retry on a fresh connection is refused, and the
// outcome still says the request was cut, so the health check can tell a
// crash from an app that was already down.
func TestAppDyingMidRequestIsACut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var srv *http.Server
	die := make(chan struct{})
	srv = &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Hopper-Message-Id") == "killer" {
			close(die)
			srv.Close() // the process dies: listener and connections gone
			return
		}
		w.WriteHeader(200)
	})}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	defer srv.Close()
	c := NewClient(ClientOptions{URL: "http://" + ln.Addr().String() + "/", Timeout: 2 * time.Second, MaxConns: 1})
	if o := c.Deliver(context.Background(), &msg.Message{MessageID: "warm", Headers: map[string]any{}}, msg.Info{Attempt: 1}); o.Status != 200 {
		t.Fatalf("warm-up delivery: %+v", o)
	}
	o := c.Deliver(context.Background(), &msg.Message{MessageID: "killer", Headers: map[string]any{}}, msg.Info{Attempt: 1})
	<-die
	if o.Kind != retry.Unavailable || !o.Cut {
		t.Fatalf("outcome %+v, want unavailable and cut", o)
	}
	// Now the app is down: a request is refused, and that is no cut.
	if o := c.Deliver(context.Background(), &msg.Message{MessageID: "next", Headers: map[string]any{}}, msg.Info{Attempt: 1}); o.Kind != retry.Unavailable || o.Cut {
		t.Fatalf("outcome %+v while the app is down, want unavailable and not cut", o)
	}
}
