package sidecar_test

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// pillApp is an app process that dies the moment one message (the pill)
// arrives: its listener and every connection close at once, cutting every
// request in flight, and a supervisor starts it again restartAfter later.
// Every other message takes work of its own before a 200.
type pillApp struct {
	t            *testing.T
	addr         string
	work         time.Duration
	restartAfter time.Duration

	mu     sync.Mutex
	srv    *http.Server
	deaths int
	ok     map[string]int
	got    map[string]int
}

func newPillApp(t *testing.T, work, restartAfter time.Duration) *pillApp {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &pillApp{t: t, addr: ln.Addr().String(), work: work, restartAfter: restartAfter, ok: map[string]int{}, got: map[string]int{}}
	a.serve(ln)
	t.Cleanup(func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.srv.Close()
		a.restartAfter = -1
	})
	return a
}

func (a *pillApp) serve(ln net.Listener) {
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(a.handle)}
	a.mu.Lock()
	a.srv = srv
	a.mu.Unlock()
	go srv.Serve(ln) //nolint:errcheck // ends with Close
}

func (a *pillApp) handle(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("Hopper-Message-Id")
	a.mu.Lock()
	a.got[id]++
	srv := a.srv
	a.mu.Unlock()
	if id == "pill" {
		a.mu.Lock()
		a.deaths++
		a.mu.Unlock()
		srv.Close() // the process dies: every request in flight is cut
		time.AfterFunc(a.restartAfter, a.restart)
		return
	}
	time.Sleep(a.work) // the app's own work for this message
	w.WriteHeader(200)
	a.mu.Lock()
	a.ok[id]++
	a.mu.Unlock()
}

// restart is the supervisor bringing the app back on its port.
func (a *pillApp) restart() {
	for range 100 {
		a.mu.Lock()
		stopped := a.restartAfter < 0
		a.mu.Unlock()
		if stopped {
			return
		}
		if ln, err := net.Listen("tcp", a.addr); err == nil {
			a.serve(ln)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCrashPillAmongSlowMessages: one message kills the app each time it
// arrives while many slow messages are in flight with it. Only the pill may
// reach the DLQ: a crash with company charges nobody, the messages cut
// with it are delivered again one at a time, and only the one that kills
// the app on its own is charged, until it reaches retry.maxCrashes.
func TestCrashPillAmongSlowMessages(t *testing.T) {
	app := newPillApp(t, 50*time.Millisecond, 500*time.Millisecond)
	cfg := testConfig(t, "http://"+app.addr+"/msg")
	cfg.Consumer.Prefetch = 40
	cfg.Consumer.Workers = 20
	cfg.Retry.MaxCrashes = 3
	cfg.Retry.MaxAttempts = 10
	r := start(t, cfg)
	var ids []string
	for i := range 120 {
		id := fmt.Sprintf("slow-%03d", i)
		if i == 15 {
			id = "pill"
		}
		ids = append(ids, id)
		r.publish(id)
	}
	r.settled(1)

	dlq := r.drain(r.sc.Plan().DLQ.Name)
	if _, ok := dlq["pill"]; !ok || len(dlq) != 1 {
		names := make([]string, 0, len(dlq))
		for id := range dlq {
			names = append(names, id)
		}
		t.Fatalf("DLQ holds %v, want the pill alone", names)
	}
	if reason := dlq["pill"].String(msg.HeaderDeadLetterReason); reason != "app-crash" {
		t.Errorf("pill dead-lettered as %q, want app-crash", reason)
	}
	app.mu.Lock()
	defer app.mu.Unlock()
	for _, id := range ids {
		if id != "pill" && app.ok[id] == 0 {
			t.Errorf("%s never answered 200", id)
		}
	}
	if app.deaths < cfg.Retry.MaxCrashes {
		t.Errorf("the app died %d times, want at least %d", app.deaths, cfg.Retry.MaxCrashes)
	}
	t.Logf("the app died %d times; the pill was delivered %d times", app.deaths, app.got["pill"])
}
