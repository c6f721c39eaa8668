// Command demoapp is a scriptable HTTP app for trying Hopper out: each
// message says, in its AMQP header "demo-script", how the app should answer
// each attempt, so one run can show every row of Hopper's outcome table
// without writing an app.
//
// Hopper forwards the AMQP header demo-script as the request header
// Hopper-Header-Demo-Script. Its value is a comma-separated list of entries,
// one per delivery, for example "503,503,200":
//
//	<status>          answer that status (200-599); 425 also sets Retry-After: 1
//	sleep:<duration>  hang that long (e.g. sleep:40s) then answer 200, to show
//	                  Hopper's request timeout
//
// The entry used is number Hopper-Attempt - 1 + Hopper-Requeue-Count (both
// counters start where Hopper leaves them: attempt 1, 0 requeues), and the
// last entry repeats, so "503" fails for ever and "425,200" succeeds after
// one requeue. Without a script every request gets 200. A script that does
// not parse gets 400, which Hopper dead-letters at once: a typo shows up in
// the DLQ instead of looping.
//
// Each request is logged as one line on standard output:
//
//	demoapp: id=<Hopper-Message-Id> attempt=<n> requeues=<n> routing_key=<key> -> <status>
//
// Everything else (start, stop, errors) goes to standard error, so that
// tests can read standard output as the request log.
//
// GET /stats returns the answers given so far as JSON (see stats); DELETE
// /stats resets them. GET on the health path answers 200.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Request headers set by Hopper (see proxy/headers.go). They are repeated
// here rather than imported so that the demo app stays what a real app is:
// an HTTP server that knows nothing of Hopper's code.
const (
	hdrMessageID  = "Hopper-Message-Id"
	hdrAttempt    = "Hopper-Attempt"
	hdrRequeues   = "Hopper-Requeue-Count"
	hdrRoutingKey = "Hopper-Routing-Key"
	hdrScript     = "Hopper-Header-Demo-Script"
)

// maxHistory bounds the per-message history kept for /stats, so a long
// test that retries one message for ever does not grow the app without end.
const maxHistory = 100

// maxSleep bounds a sleep: entry; a script is test input, and a typo like
// sleep:10000h must not pin a goroutine for a year.
const maxSleep = 10 * time.Minute

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to listen on")
	path := flag.String("path", "/", "path that receives Hopper's POSTs")
	health := flag.String("health", "/healthz", "health check path (GET answers 200)")
	flag.Parse()

	errLog := log.New(os.Stderr, "demoapp: ", 0)
	if err := serve(*listen, *path, *health, errLog); err != nil {
		errLog.Print(err)
		os.Exit(1)
	}
}

// serve runs the app until SIGTERM or SIGINT, then lets requests in flight
// finish for a few seconds, as an app behind Hopper should.
func serve(listen, path, health string, errLog *log.Logger) error {
	// http.ServeMux panics on these; say which flag is wrong instead.
	for _, p := range []struct{ flag, path string }{{"--path", path}, {"--health", health}} {
		if !strings.HasPrefix(p.path, "/") || strings.ContainsAny(p.path, " {}") {
			return fmt.Errorf("%s %q: want a path starting with /, without spaces or braces", p.flag, p.path)
		}
	}
	if path == health || path == "/stats" || health == "/stats" {
		return fmt.Errorf("--path %q, --health %q and /stats must differ", path, health)
	}
	a := &app{reqLog: log.New(os.Stdout, "demoapp: ", 0), stats: newStats()}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+health, func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /stats", a.getStats)
	mux.HandleFunc("DELETE /stats", a.resetStats)
	mux.HandleFunc(path, a.handle)

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	errLog.Printf("listening on http://%s%s (health %s, stats /stats)", ln.Addr(), path, health)

	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	errLog.Print("shutting down")
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

type app struct {
	reqLog *log.Logger
	stats  *stats
}

// handle answers one delivery as its script says.
func (a *app) handle(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(hdrMessageID)
	attempt := headerInt(r, hdrAttempt, 1)
	requeues := headerInt(r, hdrRequeues, 0)

	status, sleep, err := pick(r.Header.Get(hdrScript), attempt-1+requeues)
	var (
		note string
		gone bool
	)
	switch {
	case err != nil:
		status, note = http.StatusBadRequest, fmt.Sprintf(" (bad %s: %v)", hdrScript, err)
	case sleep > 0:
		t := time.NewTimer(sleep)
		select {
		case <-t.C:
			note = fmt.Sprintf(" (after sleeping %v)", sleep)
		case <-r.Context().Done():
			// Hopper gave up (its request timeout); the 200 below goes
			// nowhere, which is the point of the demo.
			t.Stop()
			gone = true
			note = " (client gone before the sleep ended)"
		}
	}

	if status == http.StatusTooEarly {
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	if err != nil {
		fmt.Fprintf(w, "demoapp: %v\n", err)
	} else {
		fmt.Fprintf(w, "demoapp: %d %s\n", status, http.StatusText(status))
	}
	a.stats.record(id, entry{Attempt: attempt, Requeues: requeues, Status: status, ClientGone: gone})
	a.reqLog.Printf("id=%s attempt=%d requeues=%d routing_key=%s -> %d%s",
		id, attempt, requeues, r.Header.Get(hdrRoutingKey), status, note)
}

// pick returns the answer for entry i of script: a status, or a sleep
// after which the answer is 200. An empty script answers 200.
func pick(script string, i int) (status int, sleep time.Duration, err error) {
	if strings.TrimSpace(script) == "" {
		return http.StatusOK, 0, nil
	}
	entries := strings.Split(script, ",")
	// Check every entry, not only the one used, so that a typo in a later
	// entry fails on the first attempt rather than minutes later.
	for _, e := range entries {
		if _, _, err := parseEntry(e); err != nil {
			return 0, 0, err
		}
	}
	i = min(max(i, 0), len(entries)-1)
	return parseEntry(entries[i])
}

func parseEntry(e string) (status int, sleep time.Duration, err error) {
	e = strings.TrimSpace(e)
	if d, ok := strings.CutPrefix(e, "sleep:"); ok {
		sleep, err = time.ParseDuration(d)
		if err != nil || sleep <= 0 || sleep > maxSleep {
			return 0, 0, fmt.Errorf("entry %q: want sleep:<duration> with a unit, up to %v", e, maxSleep)
		}
		return http.StatusOK, sleep, nil
	}
	status, err = strconv.Atoi(e)
	if err != nil || status < 200 || status > 599 {
		return 0, 0, fmt.Errorf("entry %q: want an HTTP status 200-599 or sleep:<duration>", e)
	}
	return status, 0, nil
}

// headerInt reads a counter header; a missing or garbled one means def, so
// the app also works when called by hand with curl.
func headerInt(r *http.Request, name string, def int) int {
	n, err := strconv.Atoi(strings.TrimSpace(r.Header.Get(name)))
	if err != nil || n < 0 {
		return def
	}
	return n
}

// entry is one answer given.
type entry struct {
	Attempt  int `json:"attempt"`
	Requeues int `json:"requeues"`
	Status   int `json:"status"`
	// ClientGone marks a sleep the client did not wait for: the status was
	// written but never read, so it is not counted under by_status.
	ClientGone bool `json:"client_gone,omitempty"`
}

// messageStats is what one message id received.
type messageStats struct {
	Requests   int            `json:"requests"`
	ByStatus   map[string]int `json:"by_status"`
	ClientGone int            `json:"client_gone"`
	// History lists the answers in order (at most maxHistory, the first
	// ones kept); Requests keeps counting past it.
	History []entry `json:"history"`
}

// stats counts answers by status and by message id (messages without an id
// are counted under ""): requests received, answers read by the client by
// status, and sleeps the client gave up on. It is the JSON served on GET
// /stats.
type stats struct {
	mu         sync.Mutex
	Requests   int                      `json:"requests"`
	ByStatus   map[string]int           `json:"by_status"`
	ClientGone int                      `json:"client_gone"`
	ByMessage  map[string]*messageStats `json:"by_message"`
}

func newStats() *stats {
	return &stats{ByStatus: map[string]int{}, ByMessage: map[string]*messageStats{}}
}

func (s *stats) record(id string, e entry) {
	code := strconv.Itoa(e.Status)
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.ByMessage[id]
	if m == nil {
		m = &messageStats{ByStatus: map[string]int{}}
		s.ByMessage[id] = m
	}
	s.Requests++
	m.Requests++
	if e.ClientGone {
		s.ClientGone++
		m.ClientGone++
	} else {
		s.ByStatus[code]++
		m.ByStatus[code]++
	}
	if len(m.History) < maxHistory {
		m.History = append(m.History, e)
	}
}

func (a *app) getStats(w http.ResponseWriter, _ *http.Request) {
	a.stats.mu.Lock()
	body, err := json.MarshalIndent(a.stats, "", "  ")
	a.stats.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(body, '\n')) // a failed write means the client left
}

func (a *app) resetStats(w http.ResponseWriter, _ *http.Request) {
	a.stats.mu.Lock()
	a.stats.Requests = 0
	a.stats.ClientGone = 0
	a.stats.ByStatus = map[string]int{}
	a.stats.ByMessage = map[string]*messageStats{}
	a.stats.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}
