package app

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// More requests than the client has connections, through the breaker, to
// an app that is healthy but slow: the requests past the connections wait
// for one, as any request does, and are answered. Hopper having no free
// connection is its own limit, never a sign of the app being down: the
// breaker stays closed and consuming is never paused.
func TestRequestsPastTheConnectionsWaitForOne(t *testing.T) {
	const conns, requests = 2, 8
	arrived := make(chan struct{}, requests)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	client := NewClient(ClientOptions{URL: srv.URL, Timeout: 10 * time.Second, MaxConns: conns})
	gate := &fakeGate{}
	b := NewBreaker(client, BreakerOptions{Failures: 3, OpenTimeout: time.Hour, Health: &fakeHealth{}, Gate: gate})

	var (
		wg       sync.WaitGroup
		returned atomic.Int64
		mu       sync.Mutex
		outs     []retry.Outcome
	)
	for i := range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := b.Deliver(context.Background(), &msg.Message{MessageID: string(rune('a' + i)), Body: []byte("b")}, msg.Info{Queue: "q", Attempt: 1})
			returned.Add(1)
			mu.Lock()
			outs = append(outs, o)
			mu.Unlock()
		}()
	}
	for range conns {
		<-arrived
	}
	// Every request past the connections has either come back or is
	// waiting for a connection.
	waitfor.Until(t, 10*time.Second, "the requests past the connections settled in", func() bool {
		return returned.Load()+client.WaitingForConn() == requests-conns
	})
	close(release)
	wg.Wait()

	for _, o := range outs {
		if o.Kind != retry.Response || o.Status != 200 {
			t.Errorf("outcome %+v, want every request answered 200", o)
		}
	}
	if s := b.State(); s != "closed" {
		t.Errorf("breaker %s, want closed: a healthy app was charged Hopper's own lack of connections", s)
	}
	if pauses, _ := gate.counts(); pauses != 0 {
		t.Errorf("consuming paused %d times on a healthy app", pauses)
	}
}
