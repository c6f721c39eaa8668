package faults

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// behavior is what the app does with one request.
type behavior int

const (
	answer2xx   behavior = iota // 200, 201, 202 or 204
	answer425                   // Too Early: requeue, not an attempt
	answer429                   // retry
	answer409                   // retry
	answer500                   // retry
	answer503                   // retry
	answer400                   // non-retriable: the DLQ at once
	answerHang                  // no answer before hopper's timeout: retry
	answerReset                 // hijack and reset without answering, the app staying up: a failed attempt
)

// Statuses recorded for requests that got no HTTP answer.
const (
	statusHang  = -1
	statusReset = -2
	statusCrash = -3 // the request killed the app
)

// failures are the answers a script uses for a failed attempt. 425 is not
// an attempt; the reset is one, scripted separately in place of one of
// these.
var failures = []behavior{answer429, answer409, answer500, answer503, answerHang}

// expect is a script's final outcome.
type expect int

const (
	expectAck          expect = iota // answered 2xx, never dead-lettered
	expectNonRetriable               // DLQ, reason non-retriable
	expectMaxAttempts                // DLQ, reason max-attempts
)

// script decides, before anything is published, how the app treats one
// message. It is keyed on what hopper sends (Hopper-Attempt and
// Hopper-Requeue-Count), not on how often the app was called, so a
// redelivery after a hopper crash or a duplicate gets the same answers and
// the final outcome is exact.
type script struct {
	requeues int        // answer 425 while Hopper-Requeue-Count < requeues
	resetAt  int        // reset the first request at this attempt instead of its failure (0: never)
	fails    []behavior // answers for attempts 1..len(fails)
	final    behavior   // answer for every later attempt: 2xx, 400 or 503
	want     expect
}

// newScripts draws one script per id from seed. maxAttempts is hopper's
// retry.maxAttempts; a message meant to succeed fails at most
// maxAttempts-2 times so that one unscripted timeout (a slow machine) still
// leaves it an attempt to succeed in, and a permanent 400 comes at attempt
// 2 at the latest.
func newScripts(ids []string, seed uint64, maxAttempts int) map[string]*script {
	rnd := rand.New(rand.NewPCG(seed, seed^0x5eed))
	fail := func() behavior { return failures[rnd.IntN(len(failures))] }
	out := make(map[string]*script, len(ids))
	for _, id := range ids {
		s := &script{}
		switch r := rnd.Float64(); {
		case r < 0.55: // succeeds at once
			s.final, s.want = answer2xx, expectAck
		case r < 0.82: // succeeds after 1..maxAttempts-2 failures
			for range 1 + rnd.IntN(maxAttempts-2) {
				s.fails = append(s.fails, fail())
			}
			s.final, s.want = answer2xx, expectAck
		case r < 0.91: // permanent 400, maybe after one failure
			for range rnd.IntN(2) {
				s.fails = append(s.fails, fail())
			}
			s.final, s.want = answer400, expectNonRetriable
		default: // fails every attempt
			for range rnd.IntN(maxAttempts) {
				s.fails = append(s.fails, fail())
			}
			s.final, s.want = answer503, expectMaxAttempts
		}
		if rnd.Float64() < 0.2 {
			s.requeues = 1 + rnd.IntN(2)
		}
		if rnd.Float64() < 0.1 && len(s.fails) > 0 {
			// A reset from an app that stays up is the message failing:
			// it takes the place of one scripted failure, so the script
			// keeps its count of attempts.
			s.resetAt = 1 + rnd.IntN(len(s.fails))
		}
		out[id] = s
	}
	return out
}

// answer returns what to do for one request.
func (s *script) answer(attempt, requeues int, firstReset bool) behavior {
	switch {
	case s.resetAt == attempt && firstReset:
		return answerReset
	case requeues < s.requeues:
		return answer425
	case attempt >= 1 && attempt <= len(s.fails):
		return s.fails[attempt-1]
	}
	return s.final
}

// record is one request the app received and what it did with it.
type record struct {
	ID       string
	Attempt  int
	Requeues int
	Status   int // HTTP status, statusHang or statusReset
	At       time.Time
	// Redelivered is the broker's redelivered flag as Hopper forwarded it
	// (Hopper-Redelivered): a message the broker handed out before.
	Redelivered bool
}

// faultApp is the app hopper delivers to. It runs in-process so the test
// can crash it (every connection closed abruptly, the port refusing) and
// start it again on the same port; its records live outside the server so
// they survive crashes.
type faultApp struct {
	t       *testing.T
	addr    string
	scripts map[string]*script // read-only once serving; nil: always 2xx
	hang    time.Duration      // how long a hang lasts at most

	// capacity, when above 0, is how many requests the app serves at once,
	// each taking serveFor; beyond it it answers 503 at once (an overloaded
	// app). Set before serving.
	capacity int
	serveFor time.Duration
	// killers are ids whose delivery kills the app: the request is cut and
	// the app stays down until the test restarts it. Set before serving.
	killers map[string]bool
	// cutters are ids whose every request the app resets without an
	// answer while it stays up (a handler that dies on that input). Set
	// before serving.
	cutters map[string]bool

	mu      sync.Mutex
	srv     *http.Server
	records []record
	reset   map[string]bool // ids whose scripted reset happened
	crashes int
	batches []batchSeen // every batch request, in order

	inFlight atomic.Int64
	busy     atomic.Int64 // requests being served within capacity
	// injected counts requests that carried a header no request may
	// carry: one a message smuggled in through CR/LF in its values.
	injected atomic.Int64
	maxBusy  atomic.Int64
}

func startApp(t *testing.T, scripts map[string]*script) *faultApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &faultApp{t: t, addr: ln.Addr().String(), scripts: scripts, hang: 3 * time.Second, reset: map[string]bool{}}
	a.serve(ln)
	t.Cleanup(a.crash)
	return a
}

// URL is where hopper POSTs messages.
func (a *faultApp) URL() string { return "http://" + a.addr + "/msg" }

// BatchURL is where hopper POSTs batches (consumer.batch).
func (a *faultApp) BatchURL() string { return "http://" + a.addr + "/batch" }

// batchSeen is one batch request: how many entries it had and what the app
// did with the request as a whole (200 with a results body, statusHang or
// statusReset).
type batchSeen struct {
	Entries int
	Status  int
}

func (a *faultApp) serve(ln net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/msg", a.handle)
	mux.HandleFunc("/batch", a.handleBatch)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	a.mu.Lock()
	a.srv = srv
	a.mu.Unlock()
	go srv.Serve(ln) //nolint:errcheck // ends with Close
}

// crash closes the listener and every open connection at once, as a
// process dying would; requests in progress get no answer.
func (a *faultApp) crash() {
	a.mu.Lock()
	srv := a.srv
	a.srv = nil
	if srv != nil {
		a.crashes++
	}
	a.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// restart listens again on the same port.
func (a *faultApp) restart() {
	a.t.Helper()
	var ln net.Listener
	var err error
	for range 100 {
		if ln, err = net.Listen("tcp", a.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		a.t.Errorf("app restart on %s: %v", a.addr, err)
		return
	}
	a.serve(ln)
}

// flap takes the app down and up again every period for d.
func (a *faultApp) flap(d, period time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		a.crash()
		time.Sleep(period / 2)
		a.restart()
		time.Sleep(period / 2)
	}
}

// waitInFlight waits (at most timeout) until the app holds a request, so a
// fault injected next hits a delivery mid-flight. It reports whether one
// was in flight.
func (a *faultApp) waitInFlight(timeout time.Duration) bool {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if a.inFlight.Load() > 0 {
			return true
		}
	}
	return false
}

func (a *faultApp) handle(w http.ResponseWriter, r *http.Request) {
	a.inFlight.Add(1)
	defer a.inFlight.Add(-1)
	_, _ = io.Copy(io.Discard, r.Body)
	if r.Header.Get("X-Injected") != "" {
		a.injected.Add(1)
	}
	id := r.Header.Get("Hopper-Message-Id")
	attempt, _ := strconv.Atoi(r.Header.Get("Hopper-Attempt"))
	requeues, _ := strconv.Atoi(r.Header.Get("Hopper-Requeue-Count"))

	if a.cutters[id] {
		a.mu.Lock()
		a.records = append(a.records, record{ID: id, Attempt: attempt, Requeues: requeues, Status: statusReset, At: time.Now()})
		a.mu.Unlock()
		a.hangUp(w, true)
		return
	}
	if a.killers[id] {
		a.mu.Lock()
		a.records = append(a.records, record{ID: id, Attempt: attempt, Requeues: requeues, Status: statusCrash, At: time.Now()})
		a.mu.Unlock()
		a.crash() // cuts this request too, as a process dying would
		return
	}
	if a.capacity > 0 {
		n := a.busy.Add(1)
		defer a.busy.Add(-1)
		if n > int64(a.capacity) {
			a.mu.Lock()
			a.records = append(a.records, record{ID: id, Attempt: attempt, Requeues: requeues, Status: http.StatusServiceUnavailable, At: time.Now()})
			a.mu.Unlock()
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		for m := a.maxBusy.Load(); n > m && !a.maxBusy.CompareAndSwap(m, n); m = a.maxBusy.Load() {
		}
		time.Sleep(a.serveFor) // the app's own work, not a wait for anything
	}

	a.mu.Lock()
	rec := a.answerLocked(id, attempt, requeues)
	rec.Redelivered = r.Header.Get("Hopper-Redelivered") == "true"
	// Recorded before answering: a 2xx counts once the app decided it,
	// whether or not hopper got to read it (a crash may cut it off).
	a.records = append(a.records, rec)
	a.mu.Unlock()

	if !a.noAnswer(w, r, rec.Status) {
		w.WriteHeader(rec.Status)
	}
}

// answerLocked is what the app does with one message at attempt and
// requeues, as its script says: a status, statusHang or statusReset. The
// caller holds a.mu and records it.
func (a *faultApp) answerLocked(id string, attempt, requeues int) record {
	b := answer2xx
	if s := a.scripts[id]; s != nil {
		b = s.answer(attempt, requeues, !a.reset[id])
		if b == answerReset {
			a.reset[id] = true
		}
	}
	rec := record{ID: id, Attempt: attempt, Requeues: requeues, At: time.Now()}
	switch b {
	case answer2xx:
		rec.Status = []int{200, 201, 202, 204}[len(a.records)%4]
	case answer425:
		rec.Status = http.StatusTooEarly
	case answer429:
		rec.Status = http.StatusTooManyRequests
	case answer409:
		rec.Status = http.StatusConflict
	case answer500:
		rec.Status = http.StatusInternalServerError
	case answer503:
		rec.Status = http.StatusServiceUnavailable
	case answer400:
		rec.Status = http.StatusBadRequest
	case answerHang:
		rec.Status = statusHang
	case answerReset:
		rec.Status = statusReset
	}
	return rec
}

// noAnswer hangs or resets the request when status says so, and reports
// whether it did: then nothing may be written to w.
func (a *faultApp) noAnswer(w http.ResponseWriter, r *http.Request, status int) bool {
	switch status {
	case statusHang:
		select {
		case <-r.Context().Done(): // hopper gave up and closed the connection
		case <-time.After(a.hang):
		}
		// Returning would make net/http send an implicit 200: close instead.
		a.hangUp(w, false)
		return true
	case statusReset:
		a.hangUp(w, true)
		return true
	}
	return false
}

// handleBatch answers a batch (consumer.batch) entry by entry, each entry
// as handle would have answered it alone, by its script at the attempt and
// requeue count its own headers carry, in one results body. What an entry
// would do to its connection it does to the whole request: one entry
// scripted to reset resets the batch, else one scripted to hang hangs it,
// and every entry of that batch is recorded with that status, since none
// got an answer. The scripted answers of the app's single requests
// (capacity, killers, cutters) are not applied to batches.
func (a *faultApp) handleBatch(w http.ResponseWriter, r *http.Request) {
	a.inFlight.Add(1)
	defer a.inFlight.Add(-1)
	var req struct {
		Entries []struct {
			ID      string            `json:"id"`
			Headers map[string]string `json:"headers"`
		} `json:"entries"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		a.t.Errorf("app: a batch request that is not the entries envelope: %v", err)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	type result struct {
		ID     string `json:"id"`
		Status int    `json:"status"`
	}
	results := make([]result, len(req.Entries))
	whole := http.StatusOK
	a.mu.Lock()
	first := len(a.records)
	for i, e := range req.Entries {
		h := http.Header{}
		for k, v := range e.Headers {
			h.Set(k, v)
		}
		attempt, _ := strconv.Atoi(h.Get("Hopper-Attempt"))
		requeues, _ := strconv.Atoi(h.Get("Hopper-Requeue-Count"))
		rec := a.answerLocked(h.Get("Hopper-Message-Id"), attempt, requeues)
		rec.Redelivered = h.Get("Hopper-Redelivered") == "true"
		a.records = append(a.records, rec)
		results[i] = result{ID: e.ID, Status: rec.Status}
		if rec.Status == statusReset || rec.Status == statusHang && whole != statusReset {
			whole = rec.Status
		}
	}
	if whole != http.StatusOK {
		for i := first; i < len(a.records); i++ {
			a.records[i].Status = whole
		}
	}
	a.batches = append(a.batches, batchSeen{Entries: len(req.Entries), Status: whole})
	a.mu.Unlock()

	if a.noAnswer(w, r, whole) {
		return
	}
	body, err := json.Marshal(map[string][]result{"results": results})
	if err != nil {
		a.t.Errorf("app: encode the results: %v", err)
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body) // hopper may have hung up; it then delivers the batch again
}

// hangUp closes the request's connection without an answer; with reset,
// abortively (RST instead of FIN).
func (a *faultApp) hangUp(w http.ResponseWriter, reset bool) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		a.t.Errorf("app: hijack to close the connection: %v", err)
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok && reset {
		_ = tc.SetLinger(0)
	}
	conn.Close()
}

// received is the number of requests the app has had so far.
func (a *faultApp) received() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.records)
}

// batchesSeen returns a copy of every batch request so far.
func (a *faultApp) batchesSeen() []batchSeen {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]batchSeen(nil), a.batches...)
}

// snapshot returns a copy of every record so far.
func (a *faultApp) snapshot() []record {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]record(nil), a.records...)
}

// crashCount is how many times the app was crashed.
func (a *faultApp) crashCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.crashes
}
