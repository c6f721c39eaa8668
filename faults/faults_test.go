package faults

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// maxAttempts is hopper's retry.maxAttempts in every scenario.
const maxAttempts = 4

var queueSeq atomic.Int64

// run is one scenario in progress: the app, hopper, the queues and a clock
// for the step log.
type run struct {
	t      *testing.T
	name   string
	q      queues
	app    *faultApp
	hopper *hopperProc
	began  time.Time
	killed int // SIGKILLs that hit a delivery in flight at the app
	// queueType is the type of the scenario's queues.
	queueType string
	// settleExtra is how much longer than usual the queues may take to
	// settle. After a SIGKILL of the node, a quorum tier's dead-letter
	// worker may have had a forward refused by a work queue that was not
	// running yet; it sends it again only after its confirm timeout, and
	// the messages behind it wait as long in the tier.
	settleExtra time.Duration
}

// begin starts the app and hopper for a scenario and waits until hopper
// consumes.
func begin(t *testing.T, name string, scripts map[string]*script) *run {
	t.Helper()
	return beginWith(t, name, scripts, "classic")
}

// beginWith is begin with the work queue (and Hopper's other queues)
// declared as queueType.
func beginWith(t *testing.T, name string, scripts map[string]*script, queueType string) *run {
	t.Helper()
	return beginApp(t, name, startApp(t, scripts), hopperConfig{QueueType: queueType})
}

// beginApp starts hopper with cfg (broker, queue, app and attempts filled
// in here) in front of an app the scenario built.
func beginApp(t *testing.T, name string, app *faultApp, cfg hopperConfig) *run {
	t.Helper()
	return beginPrefilled(t, name, app, cfg, nil)
}

// beginPrefilled is beginApp that, when prefill is set, declares the
// topology and calls prefill(queue) before hopper starts: the messages it
// publishes are at the head of the queue when hopper begins.
func beginPrefilled(t *testing.T, name string, app *faultApp, cfg hopperConfig, prefill func(queue string)) *run {
	t.Helper()
	bin := hopperBinary(t) // the clock starts once the build is done
	r := &run{t: t, name: name, q: queues{work: fmt.Sprintf("faults.%s.%d", name, queueSeq.Add(1))}, began: time.Now(), queueType: cfg.QueueType}
	r.app = app
	cfg.BrokerURLs, cfg.Queue, cfg.AppURL, cfg.MaxAttempts = target.URLs(), r.q.work, app.URL(), maxAttempts
	if prefill != nil {
		path := filepath.Join(workDir, r.q.work+".topology.yaml")
		cfg.write(t, path)
		if out, err := exec.Command(bin, "topology", "apply", "--config", path).CombinedOutput(); err != nil {
			t.Fatalf("hopper topology apply: %v\n%s", err, out)
		}
		prefill(r.q.work)
		r.step("queue prefilled before hopper starts")
		r.began = time.Now() // the run's clock starts with hopper
	}
	r.hopper = startHopper(t, r.q.work, cfg)
	if err := r.hopper.waitEvent("CONSUMER_STARTED", time.Minute); err != nil {
		t.Fatal(err)
	}
	r.step("hopper consuming %s (log %s)", r.q.work, r.hopper.logPath)
	return r
}

func (r *run) step(format string, args ...any) {
	r.t.Helper()
	r.t.Logf("+%5.1fs "+format, append([]any{time.Since(r.began).Seconds()}, args...)...)
}

// killHopper SIGKILLs hopper while the app holds a delivery (so that one
// is in flight, unacked, at the moment of death), then starts it again
// after down.
func (r *run) killHopper(down time.Duration) {
	r.t.Helper()
	inFlight := r.app.waitInFlight(3 * time.Second)
	r.hopper.kill()
	if inFlight {
		r.killed++
	}
	r.step("hopper SIGKILLed (a delivery in flight at the app: %t)", inFlight)
	time.Sleep(down)
	r.hopper.start()
	r.step("hopper started again")
}

// restartBroker restarts the shared broker gracefully, as an operator
// would.
func (r *run) restartBroker() {
	r.t.Helper()
	r.step("broker restarting")
	if err := rabbit.Restart(); err != nil {
		r.t.Fatalf("broker restart: %v", err)
	}
	r.step("broker back")
}

func (r *run) crashApp(down time.Duration) {
	r.t.Helper()
	r.app.crash()
	r.step("app crashed (listener and connections closed)")
	time.Sleep(down)
	r.app.restart()
	r.step("app back after %s", down)
}

// finish waits for the published ids, then for hopper to settle every
// message, stops hopper with SIGTERM, drains the queues and accounts for
// every id.
func (r *run) finish(pubDone <-chan publishStats) *accounting {
	r.t.Helper()
	ps := <-pubDone
	r.step("published: %d ids confirmed in %s (%d failed publishes retried)", len(ps.confirmed), ps.took.Round(time.Millisecond), ps.failures)
	// Bounded, and in proportion to N: in the mixed scenario the breaker
	// opens often (a 5xx streak is an unhealthy app), which paces delivery.
	bound := 2*time.Minute + time.Duration(len(ps.confirmed))*30*time.Millisecond
	d, ok := settle(r.q, bound)
	if !ok && r.settleExtra > 0 {
		r.step("not settled after %s: %s; waiting up to %s more, the broker's dead-letter confirm timeout", bound, formatDepths(d, r.q), r.settleExtra)
		bound += r.settleExtra
		d, ok = settle(r.q, r.settleExtra)
	}
	if ok {
		r.step("settled: %s", formatDepths(d, r.q))
	} else {
		r.t.Errorf("work and tier queues not empty after %s: %s", bound, formatDepths(d, r.q))
	}
	if err := r.hopper.stop(); err != nil {
		r.t.Errorf("hopper shutdown: %v\n%s", err, r.hopper.logTail(20))
	}
	for _, s := range r.hopper.unexpectedExits() {
		r.t.Errorf("%s\n%s", s, r.hopper.logTail(30))
	}
	for _, p := range r.hopper.logProblems() {
		r.t.Errorf("hopper log: %s", p)
	}
	left := drain(r.t, r.q)
	a := account(ps.confirmed, r.app.snapshot(), left, r.q)
	a.scenario = r.name
	r.step("accounted for %d ids", a.published)
	return a
}

// refusedMoves counts the moves to the DLQ the broker refused (a
// publisher nack), which hopper logs as MOVE_FAILED.
func (r *run) refusedMoves() int {
	return r.hopper.countLines("event=MOVE_FAILED", "to="+r.q.dlq(), "publisher nack")
}

// split cuts ids into n chunks of nearly equal size, in order.
func split(ids []string, n int) [][]string {
	out := make([][]string, n)
	for i := range out {
		out[i] = ids[i*len(ids)/n : (i+1)*len(ids)/n]
	}
	return out
}

// waitSeen waits until the app has had requests for at least k of ids.
func (r *run) waitSeen(ids []string, k int) {
	r.t.Helper()
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		seen := map[string]bool{}
		for _, rec := range r.app.snapshot() {
			if want[rec.ID] {
				seen[rec.ID] = true
			}
		}
		if len(seen) >= k {
			r.step("the app has seen %d of the %d ids of this chunk", len(seen), len(ids))
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the app saw %d of %d ids after 3m, waiting for %d", len(seen), len(ids), k)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitDelivered waits until the app has had at least k requests: faults
// are injected at points of progress, not at times, so they land mid-run
// whatever the machine's speed.
func (r *run) waitDelivered(k int) {
	r.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for r.app.received() < k {
		if time.Now().After(deadline) {
			r.t.Fatalf("the app had %d requests after 3m, waiting for %d", r.app.received(), k)
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.step("the app has had %d requests", r.app.received())
}

func makeIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%06d", prefix, i)
	}
	return ids
}

// TestFaultMixed: the app answers a seeded mix of every class (2xx, 425,
// 429, 409, 500, 503, 400, hangs past the timeout, connection resets)
// while the suite restarts the broker, SIGKILLs hopper three times, crashes
// the app, makes it flap, and has the broker refuse publishes to the DLQ for
// a few seconds. Every id must end answered 2xx or in the DLQ, and exactly
// where its script says: the scripts are keyed on the attempt and requeue
// counts hopper sends, so a redelivery or a duplicate copy gets the same
// answers, and each script leaves one attempt of slack for an unscripted
// timeout (see newScripts). The expectations are therefore exact, not
// merely "lost=0 and the reasons look legitimate".
func TestFaultMixed(t *testing.T) { mixed(t, "mixed", "classic", 1) }

// TestFaultMixedQuorum is the mixed scenario on quorum queues: every
// give-back is a republish, so the work queue's delivery limit is never
// spent on a message the app did not see, and the accounting is exact as
// on classic queues.
func TestFaultMixedQuorum(t *testing.T) { mixed(t, "mixed-quorum", "quorum", 1) }

// TestFaultBatch is the mixed scenario, faults and scripts alike, with
// batch delivery on (consumer.batch.maxMessages batchSize, maxWait
// batchWait so that batches form while the ids trickle in): each entry of
// a batch is answered by its own script in a results body, and an entry
// scripted to hang or reset takes its whole batch down with it, which
// Hopper must split until that entry is alone. Every id must end exactly as
// its script says, as in the mixed scenario: a batch changes the transport,
// never a message's fate, and an entry is not charged for a neighbour.
func TestFaultBatch(t *testing.T) { mixed(t, "batch", "classic", batchSize) }

// The batch scenario's consumer.batch.
const (
	batchSize = 16
	batchWait = "100ms"
)

// mixed runs the mixed scenario on queueType queues; with batch above 1,
// hopper delivers batches of up to that many messages to the app's batch
// path.
func mixed(t *testing.T, name, queueType string, batch int) {
	n := messageCount(t)
	seed := uint64(envInt(t, "HOPPER_FAULTS_SEED", 1))
	ids := makeIDs(name, n)
	scripts := newScripts(ids, seed, maxAttempts)
	app := startApp(t, scripts)
	cfg := hopperConfig{QueueType: queueType}
	if batch > 1 {
		cfg.Extra = fmt.Sprintf("app:\n  url: %q\nconsumer:\n  batch: {maxMessages: %d, maxWait: %s}\n", app.BatchURL(), batch, batchWait)
	}
	r := beginApp(t, name, app, cfg)
	r.step("N=%d, scripts seeded with %d, batches of up to %d", n, seed, batch)

	// The ids go out in six chunks, one per fault, and each fault is
	// injected while its chunk is flowing: once the app has seen half of
	// the chunk, or, for the faults that need traffic to show (a refused
	// DLQ move, the app down), with the chunk published into the fault. So
	// every fault meets work in progress, whatever the machine's speed.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	chunks := split(ids, 6)
	var pubs []chan publishStats
	publish := func(i int) {
		done := make(chan publishStats, 1)
		pubs = append(pubs, done)
		go func() { done <- publishPaced(ctx, t, r.q.work, chunks[i], 3*time.Second) }()
	}

	publish(0)
	r.waitSeen(chunks[0], len(chunks[0])/2)
	r.killHopper(300 * time.Millisecond)

	// The broker refuses every move to the DLQ (publisher nacks); the next
	// chunk's permanent 400s meet it. Cleared once hopper has had one
	// refused.
	clearPolicy := refuseDLQ(t, r.q)
	r.step("DLQ refuses publishes (policy max-length 0, reject-publish)")
	publish(1)
	for end := time.Now().Add(2 * time.Minute); r.refusedMoves() == 0 && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	clearPolicy()
	r.step("DLQ policy cleared after %d refused move(s)", r.refusedMoves())

	publish(2)
	r.waitSeen(chunks[2], len(chunks[2])/2)
	r.restartBroker()

	// The app goes down with a chunk arriving, and stays down until hopper
	// has seen it down (its breaker opened), as a restarting pod would.
	opens := r.hopper.eventCounts("BREAKER_OPEN")["BREAKER_OPEN"]
	r.app.crash()
	r.step("app crashed (listener and connections closed)")
	publish(3)
	for end := time.Now().Add(2 * time.Minute); r.hopper.eventCounts("BREAKER_OPEN")["BREAKER_OPEN"] == opens && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	r.app.restart()
	r.step("app back once hopper's breaker opened")

	publish(4)
	r.waitSeen(chunks[4], len(chunks[4])/2)
	r.killHopper(300 * time.Millisecond)

	// The app flaps (down/up every second for 6s) with the last chunk
	// arriving; hopper is SIGKILLed in the middle of it, once the app has
	// gone away twice, and comes back to an app that keeps going away.
	var flapping sync.WaitGroup
	flapping.Add(1)
	crashes := r.app.crashCount()
	r.step("app flapping: down/up every 1s for 6s")
	go func() { defer flapping.Done(); r.app.flap(6*time.Second, time.Second) }()
	publish(5)
	for r.app.crashCount() < crashes+2 {
		time.Sleep(10 * time.Millisecond)
	}
	r.killHopper(300 * time.Millisecond)
	flapping.Wait()
	r.step("app flapping over, app up")

	pubDone := mergePublished(pubs)
	a := r.finish(pubDone)
	a.report(t)
	checkScripts(t, a, scripts)
	if batch > 1 {
		// A duplicate is a message answered and then not acked: in flight
		// when Hopper was killed, the app went away or the broker
		// restarted. Each such fault finds at most the prefetch in flight,
		// however those messages were batched.
		faults := r.hopper.kills + r.app.crashCount() + 1
		if d := a.duplicates(); d > faults*faultsPrefetch {
			t.Errorf("%d duplicates after %d faults: more than the %d deliveries each could find in flight", d, faults, faultsPrefetch)
		}
	}

	ev := r.hopper.eventCounts("MOVE_FAILED", "BROKER_RECONNECT", "BREAKER_OPEN", "BREAKER_CLOSED", "SETTLE_FAILED", "CONSUMER_STARTED")
	t.Logf("hopper: %d starts, %d SIGKILLs (%d with a delivery in flight), app crashed %d times; events %v",
		r.hopper.starts, r.hopper.kills, r.killed, r.app.crashCount(), ev)
	// The faults must have happened, or this scenario proved nothing.
	refused := r.refusedMoves()
	t.Logf("moves to the DLQ refused by the broker: %d", refused)
	if refused == 0 {
		t.Error("no MOVE_FAILED with a publisher nack from the DLQ: the refused move was not exercised")
	}
	if ev["BROKER_RECONNECT"] == 0 {
		t.Error("no BROKER_RECONNECT logged: the broker restart was not exercised")
	}
	if ev["BREAKER_OPEN"] == 0 {
		t.Error("no BREAKER_OPEN logged: the app outages never opened the breaker")
	}
	if r.killed == 0 {
		t.Error("no SIGKILL hit a delivery in flight")
	}
	if batch > 1 {
		checkBatches(t, r, batch)
	}
}

// checkBatches checks that the batch scenario delivered batches: requests
// of several entries, none above the limit, some hung or reset as a whole
// (so that splitting was needed), and that hopper could read every answer.
func checkBatches(t *testing.T, r *run, limit int) {
	t.Helper()
	seen := r.app.batchesSeen()
	sizes := map[int]int{}
	several, failedWhole := 0, 0
	for _, b := range seen {
		sizes[b.Entries]++
		if b.Entries > 1 {
			several++
			if b.Status != http.StatusOK {
				failedWhole++
			}
		}
		if b.Entries > limit || b.Entries < 1 {
			t.Errorf("a batch request of %d entries, want 1 to %d", b.Entries, limit)
		}
	}
	t.Logf("batch requests: %d, %d of several entries (%d of those hung or reset as a whole); by entries: %v",
		len(seen), several, failedWhole, sizes)
	if several == 0 {
		t.Error("no batch request carried more than one entry: batching was not exercised")
	}
	if failedWhole == 0 {
		t.Error("no batch of several entries hung or was reset: splitting was not exercised")
	}
	if n := r.hopper.eventCounts("BATCH_RESULTS_MALFORMED")["BATCH_RESULTS_MALFORMED"]; n != 0 {
		t.Errorf("hopper logged BATCH_RESULTS_MALFORMED %d time(s) for answers the app wrote well-formed", n)
	}
}

// checkScripts compares every id's end with what its script says: scripts
// that succeed must not be dead-lettered, a permanent 400 must be in the
// DLQ as non-retriable, a message failing every attempt as max-attempts
// and only after the app saw its last attempt.
func checkScripts(t *testing.T, a *accounting, scripts map[string]*script) {
	t.Helper()
	var bad []string
	for id, s := range scripts {
		reasons := a.inDLQ[id]
		switch s.want {
		case expectAck:
			if len(reasons) > 0 {
				bad = append(bad, fmt.Sprintf("%s: scripted to succeed at attempt %d, dead-lettered: %s", id, len(s.fails)+1, a.history(id)))
			}
		case expectNonRetriable, expectMaxAttempts:
			want := "non-retriable"
			if s.want == expectMaxAttempts {
				want = "max-attempts"
			}
			if a.okCount[id] > 0 {
				bad = append(bad, fmt.Sprintf("%s: never scripted to answer 2xx, yet did: %s", id, a.history(id)))
			}
			for _, got := range reasons {
				if got != want {
					bad = append(bad, fmt.Sprintf("%s: dead-lettered as %q, want %q: %s", id, got, want, a.history(id)))
				}
			}
			if len(reasons) > 0 && s.want == expectMaxAttempts && a.maxTried[id] < maxAttempts {
				bad = append(bad, fmt.Sprintf("%s: dead-lettered for max-attempts but the app never saw attempt %d: %s", id, maxAttempts, a.history(id)))
			}
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("%d id(s) did not end as scripted:\n  %s", len(bad), strings.Join(bad[:min(len(bad), 20)], "\n  "))
	}
}

// TestFaultOutage: an app that always answers 2xx goes down for several
// seconds, comes up, goes down again, flaps, then stays up. An outage is
// not the message failing: nothing may reach the DLQ, no attempt may be
// spent (the app sees attempt 1 only), nothing may be lost.
func TestFaultOutage(t *testing.T) {
	n := messageCount(t)
	ids := makeIDs("outage", n)
	r := begin(t, "outage", nil)
	r.step("N=%d, the app always answers 2xx", n)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pubDone := make(chan publishStats, 1)
	go func() { pubDone <- publishPaced(ctx, t, r.q.work, ids, 10*time.Second) }()

	// Each outage starts at a point of progress, so it lands mid-run
	// whatever the machine's speed; its length is the fault itself.
	r.waitDelivered(n / 5)
	r.crashApp(3 * time.Second)
	r.waitDelivered(2 * n / 5)
	r.crashApp(2 * time.Second)
	r.waitDelivered(3 * n / 5)
	r.step("app flapping: down/up every 1s for 5s")
	r.app.flap(5*time.Second, time.Second)
	r.step("app flapping over, app up")

	a := r.finish(pubDone)
	a.report(t)
	if a.dlq != 0 {
		t.Errorf("an app outage dead-lettered %d message(s) (by reason %v)", a.dlq, a.byReason)
	}
	var spent []string
	for id, at := range a.maxTried {
		if at > 1 {
			spent = append(spent, id+": "+a.history(id))
		}
	}
	sort.Strings(spent)
	if len(spent) > 0 {
		t.Errorf("an app outage spent attempts on %d message(s) (the app saw attempt > 1):\n  %s",
			len(spent), strings.Join(spent[:min(len(spent), 10)], "\n  "))
	}
	ev := r.hopper.eventCounts("BREAKER_OPEN", "BREAKER_CLOSED", "MOVE_FAILED", "SETTLE_FAILED")
	t.Logf("app crashed %d times; hopper events %v", r.app.crashCount(), ev)
	if ev["BREAKER_OPEN"] == 0 {
		t.Error("no BREAKER_OPEN logged: the outage was not exercised")
	}
}

// TestFaultSubscriptions: one hopper consumes two queues. Queue a gets
// the seeded mix of every answer class; queue b's app path fails every
// message, and b allows 2 attempts where a allows maxAttempts. Hopper is
// SIGKILLed with deliveries in flight and the broker restarts while both
// queues flow. Each queue is accounted for on its own: every id of a ends
// as its script says, in a's DLQ or answered 2xx; every id of b in b's
// DLQ as max-attempts after exactly 2 attempts; no id in the other
// queue's DLQ, nothing lost.
func TestFaultSubscriptions(t *testing.T) {
	n := messageCount(t)
	seed := uint64(envInt(t, "HOPPER_FAULTS_SEED", 1))
	idsA, idsB := makeIDs("subs-a", n/2), makeIDs("subs-b", n/2)
	scripts := newScripts(idsA, seed, maxAttempts)
	for _, id := range idsB {
		scripts[id] = &script{final: answer503, want: expectMaxAttempts}
	}
	app := startApp(t, scripts)
	hopperBinary(t) // built before the clock starts
	base := fmt.Sprintf("faults.subs.%d", queueSeq.Add(1))
	qa, qb := queues{work: base + ".a"}, queues{work: base + ".b"}
	cfg := hopperConfig{
		BrokerURLs: target.URLs(), AppURL: app.URL(), MaxAttempts: maxAttempts,
		Extra: fmt.Sprintf("subscriptions:\n  [{queue: {name: %q}}, {queue: {name: %q}, retry: {maxAttempts: 2}}]\n",
			qa.work, qb.work),
	}
	r := &run{t: t, name: "subscriptions", q: qa, app: app, began: time.Now()}
	r.hopper = startHopper(t, base, cfg)
	if err := r.hopper.waitEvent("CONSUMER_STARTED", time.Minute); err != nil {
		t.Fatal(err)
	}
	r.step("hopper consuming %s and %s (log %s)", qa.work, qb.work, r.hopper.logPath)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	chunksA, chunksB := split(idsA, 2), split(idsB, 2)
	var pubA, pubB []chan publishStats
	publish := func(i int) {
		for _, p := range []struct {
			q    string
			ids  []string
			into *[]chan publishStats
		}{{qa.work, chunksA[i], &pubA}, {qb.work, chunksB[i], &pubB}} {
			done := make(chan publishStats, 1)
			*p.into = append(*p.into, done)
			go func() { done <- publishPaced(ctx, t, p.q, p.ids, 3*time.Second) }()
		}
	}

	publish(0)
	r.waitSeen(chunksA[0], len(chunksA[0])/2)
	r.waitSeen(chunksB[0], len(chunksB[0])/2)
	r.killHopper(300 * time.Millisecond)

	publish(1)
	r.waitSeen(chunksB[1], len(chunksB[1])/2)
	r.restartBroker()

	collect := func(pubs []chan publishStats) map[string]bool {
		all := map[string]bool{}
		for _, p := range pubs {
			for id := range (<-p).confirmed {
				all[id] = true
			}
		}
		return all
	}
	publishedA, publishedB := collect(pubA), collect(pubB)
	r.step("published: %d ids to %s, %d to %s", len(publishedA), qa.work, len(publishedB), qb.work)
	bound := 2*time.Minute + time.Duration(n)*30*time.Millisecond
	for _, q := range []queues{qa, qb} {
		if d, ok := settle(q, bound); !ok {
			t.Errorf("%s not settled after %s: %s", q.work, bound, formatDepths(d, q))
		}
	}
	if err := r.hopper.stop(); err != nil {
		t.Errorf("hopper shutdown: %v\n%s", err, r.hopper.logTail(20))
	}
	for _, s := range r.hopper.unexpectedExits() {
		t.Errorf("%s\n%s", s, r.hopper.logTail(30))
	}
	for _, p := range r.hopper.logProblems() {
		t.Errorf("hopper log: %s", p)
	}

	// Each queue's requests, told apart by their ids.
	recs := app.snapshot()
	var recsA, recsB []record
	for _, rec := range recs {
		if strings.HasPrefix(rec.ID, "subs-a") {
			recsA = append(recsA, rec)
		} else {
			recsB = append(recsB, rec)
		}
	}
	a := account(publishedA, recsA, drain(t, qa), qa)
	a.scenario = "subscriptions-a"
	a.report(t)
	checkScripts(t, a, scripts)
	b := account(publishedB, recsB, drain(t, qb), qb)
	b.scenario = "subscriptions-b"
	b.report(t)
	if b.acked != 0 || b.dlq != len(publishedB) {
		t.Errorf("queue b: %d acked, %d in its DLQ, want all %d in its DLQ", b.acked, b.dlq, len(publishedB))
	}
	for id, reasons := range b.inDLQ {
		for _, reason := range reasons {
			if reason != "max-attempts" {
				t.Errorf("%s dead-lettered as %q, want max-attempts", id, reason)
			}
		}
		if got := b.maxTried[id]; got != 2 {
			t.Errorf("%s: the app saw attempt %d at most, want 2 (queue b's own limit): %s", id, got, b.history(id))
		}
	}
	if r.killed == 0 {
		t.Error("no SIGKILL hit a delivery in flight")
	}
	if ev := r.hopper.eventCounts("BROKER_RECONNECT"); ev["BROKER_RECONNECT"] == 0 {
		t.Error("no BROKER_RECONNECT logged: the broker restart was not exercised")
	}
}

// mergePublished sums what the publishers of pubs published, once each has
// finished.
func mergePublished(pubs []chan publishStats) chan publishStats {
	out := make(chan publishStats, 1)
	go func() {
		all := publishStats{confirmed: map[string]bool{}}
		for _, p := range pubs {
			ps := <-p
			for id := range ps.confirmed {
				all.confirmed[id] = true
			}
			all.failures += ps.failures
			all.took += ps.took
		}
		out <- all
	}()
	return out
}
