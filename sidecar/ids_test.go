package sidecar_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// TestMessagesWithoutIDGetOneEach: two messages published without a
// message id, alike in routing key and body, reach the app with ids of
// their own, and each keeps its id on its retry: an app that skips an id
// it has already processed processes both, each once.
func TestMessagesWithoutIDGetOneEach(t *testing.T) {
	// Every message fails its first attempt, then succeeds.
	var mu sync.Mutex
	byID := map[string][]int{}
	calls := 0
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		attempt, _ := strconv.Atoi(req.Header.Get("Hopper-Attempt"))
		mu.Lock()
		id := req.Header.Get("Hopper-Message-Id")
		byID[id] = append(byID[id], attempt)
		calls++
		mu.Unlock()
		if attempt == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer app.Close()
	r := start(t, testConfig(t, app.URL))
	for range 2 {
		m := &msg.Message{Headers: map[string]any{}, Body: []byte(`{"order":1}`), ContentType: "application/json"}
		if err := r.pub.PublishTo(context.Background(), "", r.cfg.Queue.Name, m); err != nil {
			t.Fatal(err)
		}
	}
	r.settled(0)
	waitfor.Until(t, 10*time.Second, "four requests", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return calls >= 4
	})
	mu.Lock()
	defer mu.Unlock()
	if len(byID) != 2 {
		t.Fatalf("requests by Hopper-Message-Id: %v, want two ids with attempts [1 2] each", byID)
	}
	for id, attempts := range byID {
		slices.Sort(attempts)
		if id == "" || !slices.Equal(attempts, []int{1, 2}) {
			t.Errorf("id %q: attempts %v, want [1 2]", id, attempts)
		}
	}
}
