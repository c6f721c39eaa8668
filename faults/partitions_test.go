package faults

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
)

// orderApp records every request it answers with 200, in the order it
// answers them: the message id (key-seq) and the queue it came from.
type orderApp struct {
	addr string
	mu   sync.Mutex
	seen []orderSeen
}

type orderSeen struct{ id, queue string }

func startOrderApp(t *testing.T) *orderApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &orderApp{addr: ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("/msg", func(w http.ResponseWriter, r *http.Request) {
		// Each message takes the app a little work, so a backlog builds
		// and consumers that were not alone on a partition would overlap.
		time.Sleep(2 * time.Millisecond)
		a.mu.Lock()
		a.seen = append(a.seen, orderSeen{id: r.Header.Get("Hopper-Message-Id"), queue: r.Header.Get("Hopper-Queue")})
		a.mu.Unlock()
	})
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
