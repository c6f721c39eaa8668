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
