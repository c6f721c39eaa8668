package faults

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/order"
)

// orderApp records every request it answers with 200, in the order it
// answers them: the message id (key-seq) and the queue it came from.
type orderApp struct {
	addr string
	mu   sync.Mutex
	seen []orderSeen
}

// orderSeen is one answered request; proc is what follows /msg/ in the
// request's path, which tells the Hopper processes of a test apart.
type orderSeen struct{ id, queue, proc string }

func startOrderApp(t *testing.T) *orderApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &orderApp{addr: ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {})
	record := func(w http.ResponseWriter, r *http.Request) {
		// Each message takes the app a little work, so a backlog builds
		// and consumers that were not alone on a partition would overlap.
		time.Sleep(2 * time.Millisecond)
		a.mu.Lock()
		a.seen = append(a.seen, orderSeen{id: r.Header.Get("Hopper-Message-Id"), queue: r.Header.Get("Hopper-Queue"),
			proc: strings.TrimPrefix(r.URL.Path, "/msg/")})
		a.mu.Unlock()
	}
	mux.HandleFunc("/msg", record)
	mux.HandleFunc("/msg/", record)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return a
}

func (a *orderApp) snapshot() []orderSeen {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]orderSeen(nil), a.seen...)
}

// Three Hopper processes consume the same four partitions, ordered per
// partition; one is SIGKILLed while keyed messages flow. Every message is
// delivered with a 200 at least once, nothing is left in any queue or the
// DLQ, and for every key the first successful deliveries come in the order
// the messages were published: the broker hands a partition, with what the
// killed process held, to one standby at a time.
func TestFaultPartitionsKillOneOfThree(t *testing.T) {
	rb := testbroker.MustStartWith(t, testbroker.Options{Quiet: true, Plugins: []string{"rabbitmq_consistent_hash_exchange"}})
	useTarget(t, singleNode{rb})
	app := startOrderApp(t)
	hopperBinary(t)
	const (
		parts   = 4
		keys    = 40
		perKey  = 25
		workers = 3
	)
	base := fmt.Sprintf("faults.parts.%d", queueSeq.Add(1))
	in := base + ".in"
	cfg := hopperConfig{
		BrokerURLs: []string{rb.URL()}, AppURL: "http://" + app.addr + "/msg", MaxAttempts: 10, Queue: base,
		Extra: fmt.Sprintf("topology:\n  partitions: {count: %d}\n  bindings: [{exchange: %q, type: topic, routingKeys: [\"#\"]}]\nconsumer:\n  ordered: true\n", parts, in),
	}
	procs := make([]*hopperProc, workers)
	for i := range procs {
		procs[i] = startHopper(t, fmt.Sprintf("%s.%d", base, i), cfg)
		if err := procs[i].waitEvent("CONSUMER_STARTED", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	// Every process has a consumer on every partition: one active, two
	// standing by.
	waitfor.Until(t, time.Minute, "3 consumers on each partition", func() bool {
		out, err := rb.Ctl("list_queues", "-q", "--no-table-headers", "name", "consumers")
		if err != nil {
			return false
		}
		n := 0
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && strings.HasPrefix(f[0], base+".p") && !strings.Contains(f[0], ".retry.") && f[1] == strconv.Itoa(workers) {
				n++
			}
		}
		return n == parts
	})

	conn, err := amqp.Dial(rb.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil { // noWait=false
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// publish sends seqs [from, to) of every key in one burst (one
	// channel keeps their order), then waits for every confirm.
	publish := func(from, to int) {
		var confirms []*amqp.DeferredConfirmation
		// A key's messages go out back to back, so they sit next to
		// each other in their partition.
		for k := range keys {
			for seq := from; seq < to; seq++ {
				id := fmt.Sprintf("k%d-%d", k, seq)
				c, err := ch.PublishWithDeferredConfirmWithContext(ctx, in, fmt.Sprintf("k%d", k), true, false, // mandatory, immediate
					amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(id)})
				if err != nil {
					t.Fatal(err)
				}
				confirms = append(confirms, c)
			}
		}
		for _, c := range confirms {
			if ok, err := c.WaitContext(ctx); !ok || err != nil {
				t.Fatalf("publish not confirmed: %v", err)
			}
		}
	}
	half := perKey / 2
	publish(0, half)
	// The first process subscribed first, so it is the active consumer of
	// (at least most) partitions: kill it while it delivers.
	waitfor.Until(t, time.Minute, "a quarter of the messages delivered", func() bool { return len(app.snapshot()) >= keys*perKey/4 })
	procs[0].kill()
	t.Logf("killed process 0 after %d deliveries", len(app.snapshot()))
	publish(half, perKey)
	waitfor.Until(t, 3*time.Minute, "every message delivered and every queue empty", func() bool {
		d, err := depths()
		if err != nil {
			return false
		}
		for q, n := range d {
			if strings.HasPrefix(q, base) && n > 0 {
				return false
			}
		}
		first := map[string]bool{}
		for _, s := range app.snapshot() {
			first[s.id] = true
		}
		return len(first) == keys*perKey
	})
	for _, p := range procs[1:] {
		if err := p.stop(); err != nil {
			t.Errorf("hopper shutdown: %v\n%s", err, p.logTail(20))
		}
	}
	for _, p := range procs {
		for _, s := range p.unexpectedExits() {
			t.Errorf("%s\n%s", s, p.logTail(30))
		}
		for _, l := range p.logProblems() {
			t.Errorf("hopper log: %s", l)
		}
	}

	seen := app.snapshot()
	firstSeen := map[string]bool{}
	next := map[int]int{} // key → the seq whose first delivery comes next
	queueOf := map[int]string{}
	dups := 0
	for _, s := range seen {
		if firstSeen[s.id] {
			dups++
			continue
		}
		firstSeen[s.id] = true
		var k, seq int
		if _, err := fmt.Sscanf(s.id, "k%d-%d", &k, &seq); err != nil {
			t.Fatalf("id %q: %v", s.id, err)
		}
		if seq != next[k] {
			t.Errorf("key k%d: first delivery of seq %d came when %d was due (out of publish order)", k, seq, next[k])
		}
		next[k] = seq + 1
		if q, ok := queueOf[k]; ok && q != s.queue {
			t.Errorf("key k%d delivered from %s and %s", k, q, s.queue)
		}
		queueOf[k] = s.queue
	}
	if len(firstSeen) != keys*perKey {
		t.Errorf("%d of %d messages delivered", len(firstSeen), keys*perKey)
	}
	used := map[string]bool{}
	for _, q := range queueOf {
		used[q] = true
	}
	if len(used) != parts {
		t.Errorf("keys spread over %d partitions, want %d", len(used), parts)
	}
	t.Logf("%d messages, %d keys over %d partitions, %d duplicate deliveries (redelivered after the kill)", len(firstSeen), keys, len(used), dups)
}

// Two Hopper processes consume eight quorum partitions. On RabbitMQ 4.x the
// broker makes the consumer of highest priority a partition's active one,
// and each process subscribes with a priority of its own per partition, so
// the two share the partitions: each partition is delivered by the process
// that ranks it higher, as computed here from the same hash. When that
// process is SIGKILLed, its partitions move to the other, and every message
// is still delivered in order per key. On 3.x, whose single active consumer
// ignores priorities, the process that subscribed first delivers them all.
func TestFaultPartitionsSharedByPriority(t *testing.T) {
	rb := testbroker.MustStartWith(t, testbroker.Options{Quiet: true, Plugins: []string{"rabbitmq_consistent_hash_exchange"}})
	useTarget(t, singleNode{rb})
	app := startOrderApp(t)
	hopperBinary(t)
	const (
		parts  = 8
		keys   = 32
		perKey = 10
	)
	four := rb.Series() >= 4
	base := fmt.Sprintf("faults.share.%d", queueSeq.Add(1))
	in := base + ".in"
	cfgFor := func(i int) hopperConfig {
		return hopperConfig{
			BrokerURLs: []string{rb.URL()}, AppURL: fmt.Sprintf("http://%s/msg/%d", app.addr, i), MaxAttempts: 10, Queue: base, QueueType: "quorum",
			Extra: fmt.Sprintf("topology:\n  partitions: {count: %d}\n  bindings: [{exchange: %q, type: topic, routingKeys: [\"#\"]}]\nconsumer:\n  ordered: true\n", parts, in),
		}
	}
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	procs := make([]*hopperProc, 2)
	for i := range procs {
		procs[i] = startHopper(t, fmt.Sprintf("%s.%d", base, i), cfgFor(i))
		if err := procs[i].waitEvent("CONSUMER_STARTED", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	// owner is the process whose priority for partition p is higher: the
	// one the broker activates on 4.x.
	owner := func(p int) string {
		q := config.PartitionQueue(base, p)
		a := order.Preference(host+"/"+strconv.Itoa(procs[0].pid()), q)
		b := order.Preference(host+"/"+strconv.Itoa(procs[1].pid()), q)
		if b > a {
			return "1"
		}
		return "0"
	}
	split := func() bool {
		n := 0
		for p := range parts {
			if owner(p) == "1" {
				n++
			}
		}
		return n > 0 && n < parts
	}
	// Two process ids may rank every partition alike (1 in 128); a new
	// process id ranks them anew.
	for try := 0; four && !split() && try < 5; try++ {
		procs[1].kill()
		procs[1].start()
		if err := procs[1].waitEvent("CONSUMER_STARTED", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Until(t, time.Minute, "2 consumers on each partition", func() bool {
		out, err := rb.Ctl("list_queues", "-q", "--no-table-headers", "name", "consumers")
		if err != nil {
			return false
		}
		n := 0
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && strings.HasPrefix(f[0], base+".p") && !strings.Contains(f[0], ".retry.") && f[1] == "2" {
				n++
			}
		}
		return n == parts
	})

	conn, err := amqp.Dial(rb.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil { // noWait=false
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	publish := func(from, to int) {
		var confirms []*amqp.DeferredConfirmation
		for k := range keys {
			for seq := from; seq < to; seq++ {
				id := fmt.Sprintf("k%d-%d", k, seq)
				c, err := ch.PublishWithDeferredConfirmWithContext(ctx, in, fmt.Sprintf("k%d", k), true, false, // mandatory, immediate
					amqp.Publishing{MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(id)})
				if err != nil {
					t.Fatal(err)
				}
				confirms = append(confirms, c)
			}
		}
		for _, c := range confirms {
			if ok, err := c.WaitContext(ctx); !ok || err != nil {
				t.Fatalf("publish not confirmed: %v", err)
			}
		}
	}
	delivered := func(n int) func() bool {
		return func() bool {
			first := map[string]bool{}
			for _, s := range app.snapshot() {
				first[s.id] = true
			}
			return len(first) >= n
		}
	}
	half := perKey / 2
	publish(0, half)
	waitfor.Until(t, 3*time.Minute, "the first half delivered", delivered(keys*half))
	before := len(app.snapshot())
	byProc := map[string]map[string]bool{} // process → partitions it delivered
	for _, s := range app.snapshot() {
		if byProc[s.proc] == nil {
			byProc[s.proc] = map[string]bool{}
		}
		byProc[s.proc][s.queue] = true
		if !four {
			continue
		}
		var p int
		if _, err := fmt.Sscanf(strings.TrimPrefix(s.queue, base+".p"), "%d", &p); err != nil {
			t.Fatalf("queue %q: %v", s.queue, err)
		}
		if want := owner(p); s.proc != want {
			t.Errorf("%s delivered by process %s, want %s, the one with the higher priority for it", s.queue, s.proc, want)
		}
	}
	t.Logf("before the kill: process 0 delivered %d partitions, process 1 %d", len(byProc["0"]), len(byProc["1"]))
	if four && (len(byProc["0"]) == 0 || len(byProc["1"]) == 0) {
		t.Errorf("RabbitMQ %s: the partitions were not shared: %v", rb.Version(), byProc)
	}
	if !four && len(byProc["1"]) > 0 {
		t.Errorf("RabbitMQ %s: the second process delivered %v although the first subscribed first", rb.Version(), byProc["1"])
	}
	// Kill the process that delivers partitions; the other takes them.
	victim, survivor := 0, "1"
	if len(byProc["0"]) == 0 {
		victim, survivor = 1, "0"
	}
	procs[victim].kill()
	publish(half, perKey)
	waitfor.Until(t, 3*time.Minute, "every message delivered and every queue empty", func() bool {
		d, err := depths()
		if err != nil {
			return false
		}
		for q, n := range d {
			if strings.HasPrefix(q, base) && n > 0 {
				return false
			}
		}
		return delivered(keys * perKey)()
	})
	for _, s := range app.snapshot()[before:] {
		var k, seq int
		if _, err := fmt.Sscanf(s.id, "k%d-%d", &k, &seq); err == nil && seq >= half && s.proc != survivor {
			t.Errorf("%s (published after the kill) delivered by process %s, want the survivor %s", s.id, s.proc, survivor)
		}
	}
	next := map[int]int{}
	firstSeen := map[string]bool{}
	for _, s := range app.snapshot() {
		if firstSeen[s.id] {
			continue
		}
		firstSeen[s.id] = true
		var k, seq int
		if _, err := fmt.Sscanf(s.id, "k%d-%d", &k, &seq); err != nil {
			t.Fatalf("id %q: %v", s.id, err)
		}
		if seq != next[k] {
			t.Errorf("key k%d: first delivery of seq %d came when %d was due", k, seq, next[k])
		}
		next[k] = seq + 1
	}
	if err := procs[1-victim].stop(); err != nil {
		t.Errorf("hopper shutdown: %v", err)
	}
	for _, p := range procs {
		for _, s := range p.unexpectedExits() {
			t.Errorf("%s\n%s", s, p.logTail(30))
		}
		for _, l := range p.logProblems() {
			t.Errorf("hopper log: %s", l)
		}
	}
}
