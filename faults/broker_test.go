package faults

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/msg"
)

// queues are the names hopper uses around one work queue, with its default
// templates ({queue}.retry.{delay}, {queue}.dlq).
type queues struct{ work string }

func (q queues) dlq() string { return q.work + ".dlq" }

// isWorkOrTier says whether name is the work queue, one of its tiers or
// one of its parking queues: the queues that must be empty once
// everything has settled.
func (q queues) isWorkOrTier(name string) bool {
	return name == q.work || strings.HasPrefix(name, q.work+".retry.") || q.isParking(name)
}

// isParking says whether name is one of the work queue's parking queues.
func (q queues) isParking(name string) bool { return strings.HasPrefix(name, q.work+".park.") }

func brokerOptions(name string) broker.Options {
	return broker.Options{
		URLs:           target.URLs(),
		Heartbeat:      5 * time.Second,
		ConnectTimeout: 5 * time.Second,
		ReconnectMin:   100 * time.Millisecond,
		ReconnectMax:   time.Second,
		Name:           name,
	}
}

// depths returns the messages every queue holds: ready and unacked, and on
// a quorum queue those on their way to its dead-letter target too
// (messages_dlx: dropped from the queue, held until the target confirms
// them). A quorum tier hands a message back that way, so for seconds after
// a broker restart a retry can be in neither queue's ready count; a
// settled count must include it. list_queues does not offer that count,
// so it is asked of each quorum queue by an eval.
func depths() (map[string]int, error) {
	m, err := listed()
	if err != nil {
		return nil, err
	}
	dlx, err := dlxByQueue()
	if err != nil {
		return nil, err
	}
	for name, n := range dlx {
		m[name] += n
	}
	return m, nil
}

// listed returns the messages every queue holds as the broker lists them:
// ready and unacked.
func listed() (map[string]int, error) {
	out, err := target.Ctl("list_queues", "-q", "--no-table-headers", "-p", "/", "name", "messages")
	if err != nil {
		return nil, err
	}
	m := map[string]int{}
	addCounts(m, out)
	return m, nil
}

// dlxByQueue returns each quorum queue's dead letters under way.
func dlxByQueue() (map[string]int, error) {
	out, err := target.Ctl("-q", "eval", dlxCounts)
	if err != nil {
		return nil, fmt.Errorf("dead letters under way: %w", err)
	}
	m := map[string]int{}
	addCounts(m, out)
	return m, nil
}

// dlxCounts prints "name<TAB>messages_dlx" for every quorum queue.
const dlxCounts = `[io:format("~s\t~p~n", [element(4, amqqueue:get_name(Q)),
	proplists:get_value(messages_dlx, rabbit_amqqueue:info(Q, [messages_dlx]), 0)])
	|| Q <- rabbit_amqqueue:list(), amqqueue:get_type(Q) =:= rabbit_quorum_queue], ok.`

// addCounts adds each "name<TAB>count" line of out to m; other lines are
// skipped.
func addCounts(m map[string]int, out string) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(strings.TrimRight(line, "\r"), "\t")
		if len(f) != 2 {
			continue
		}
		if n, err := strconv.Atoi(strings.TrimSpace(f[1])); err == nil {
			m[f[0]] += n
		}
	}
}

// publishStats describe one publishing run.
type publishStats struct {
	confirmed map[string]bool // ids the broker confirmed at least once
	failures  int             // publishes that failed and were retried
	took      time.Duration
}

// publishPaced publishes every id once, persistent, with a publisher
// confirm, spread evenly over window so that faults injected meanwhile hit
// a stream of work. A publish that fails (the broker restarting) is
// retried until it is confirmed or ctx ends. Only confirmed ids count as
// published.
func publishPaced(ctx context.Context, t *testing.T, queue string, ids []string, window time.Duration) publishStats {
	return publishPacedWith(ctx, t, queue, ids, window, func(id string) *msg.Message {
		return &msg.Message{MessageID: id, ContentType: "text/plain", DeliveryMode: 2,
			Headers: map[string]any{}, Body: []byte("fault-suite " + id)}
	})
}

// publishPacedWith is publishPaced with the message for each id made by
// build.
func publishPacedWith(ctx context.Context, t *testing.T, queue string, ids []string, window time.Duration,
	build func(id string) *msg.Message) publishStats {
	const workers = 8
	pub := broker.NewPublisher(broker.PublisherOptions{
		Options:        brokerOptions("faults-publisher"),
		Channels:       workers,
		ConfirmTimeout: 5 * time.Second,
	})
	defer pub.Close()

	began := time.Now()
	todo := make(chan string)
	go func() {
		defer close(todo)
		for i, id := range ids {
			at := began.Add(window * time.Duration(i) / time.Duration(len(ids)))
			if d := time.Until(at); d > 0 {
				time.Sleep(d)
			}
			select {
			case todo <- id:
			case <-ctx.Done():
				return
			}
		}
	}()

	var (
		mu        sync.Mutex
		confirmed = make(map[string]bool, len(ids))
		failures  atomic.Int64
		wg        sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range todo {
				m := build(id)
				for ctx.Err() == nil {
					// A message that names an exchange goes there by its
					// routing key (a super stream routes by it).
					ex, key := m.Exchange, m.RoutingKey
					if ex == "" {
						key = queue
					}
					if err := pub.PublishTo(ctx, ex, key, m); err == nil {
						mu.Lock()
						confirmed[id] = true
						mu.Unlock()
						break
					}
					failures.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		t.Errorf("publishing ended early (%v): %d of %d ids confirmed", err, len(confirmed), len(ids))
	}
	return publishStats{confirmed: confirmed, failures: int(failures.Load()), took: time.Since(began)}
}

// refuseDLQ makes the broker refuse every publish to the DLQ (a policy
// max-length 0, overflow reject-publish: publisher nacks) until the
// returned function clears it.
func refuseDLQ(t *testing.T, q queues) (clear func()) {
	t.Helper()
	name := "faults-refuse-" + q.work
	pattern := "^" + regexp.QuoteMeta(q.dlq()) + "$"
	// Two steps: RabbitMQ 3.10 applies a policy's max-length before its
	// overflow, so {"max-length":0,"overflow":"reject-publish"} set at once
	// on a queue still in drop-head mode first drops every message the DLQ
	// holds (measured: 5 messages in, 0 left). With overflow already
	// reject-publish, max-length 0 drops nothing and refuses new publishes.
	for _, def := range []string{`{"overflow":"reject-publish"}`, `{"max-length":0,"overflow":"reject-publish"}`} {
		if _, err := target.Ctl("set_policy", "--apply-to", "queues", name, pattern, def); err != nil {
			t.Errorf("set DLQ policy: %v", err)
			return func() {}
		}
	}
	return func() {
		if _, err := target.Ctl("clear_policy", name); err != nil {
			t.Errorf("clear DLQ policy: %v", err)
		}
	}
}

// settle waits until the work queue and every tier queue have been empty
// (ready and unacked) on two polls in a row, at most timeout. It returns
// the last depths seen and whether they settled.
func settle(q queues, timeout time.Duration) (map[string]int, bool) {
	zeroes := 0
	var last map[string]int
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		d, err := depths()
		if err != nil { // the broker is being restarted; poll again
			continue
		}
		last = d
		busy := false
		for name, n := range d {
			if q.isWorkOrTier(name) && n > 0 {
				busy = true
			}
		}
		if busy {
			zeroes = 0
			continue
		}
		if zeroes++; zeroes == 2 {
			if held := heldNow(q, d); held != 0 {
				// The listed count of a quorum queue lags: it read 0 while
				// the queue held messages.
				zeroes = 0
				continue
			}
			return d, true
		}
	}
	return last, false
}

// heldNow is what the work queue and its tiers among the names of d hold
// by a passive declare of each, which a quorum queue's leader answers with
// its current count (ready messages: nothing consumes a tier, and a work
// queue's unacked messages are in the listed count, which is exact for
// it). It is -1 when the broker cannot be asked.
func heldNow(q queues, d map[string]int) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in, err := broker.OpenInspector(ctx, brokerOptions("faults-held"))
	if err != nil {
		return -1
	}
	defer in.Close()
	held := 0
	for name := range d {
		if !q.isWorkOrTier(name) {
			continue
		}
		n, err := in.Depth(name)
		if err != nil {
			return -1
		}
		held += n
	}
	return held
}

// drained is one message taken off a queue at the end of a run.
type drained struct {
	queue   string
	id      string
	reason  string // x-dead-letter-reason
	retries int64  // x-retry-count
	status  int64  // x-final-status-code
}

// drain takes every message off the DLQ, the work queue and the tier
// queues (which should be empty by then) and acks them.
func drain(t *testing.T, q queues) []drained {
	t.Helper()
	d, err := depths()
	if err != nil {
		t.Fatalf("list queues: %v", err)
	}
	names := []string{q.dlq()}
	for name := range d {
		if q.isWorkOrTier(name) {
			names = append(names, name)
		}
	}
	sort.Strings(names[1:])
	insp, err := broker.OpenInspector(context.Background(), brokerOptions("faults-inspector"))
	if err != nil {
		t.Fatalf("open inspector: %v", err)
	}
	defer insp.Close()
	var out []drained
	for _, name := range names {
		for {
			dl, ok, err := insp.Get(name)
			if err != nil {
				t.Fatalf("drain %s: %v", name, err)
			}
			if !ok {
				break
			}
			m := dl.Message()
			retries, _ := m.Int(msg.HeaderRetryCount)
			status, _ := m.Int(msg.HeaderFinalStatusCode)
			out = append(out, drained{queue: name, id: m.MessageID, reason: m.String(msg.HeaderDeadLetterReason),
				retries: retries, status: status})
			if err := dl.Ack(); err != nil {
				t.Fatalf("ack while draining %s: %v", name, err)
			}
		}
	}
	return out
}

func formatDepths(d map[string]int, q queues) string {
	var parts []string
	for name, n := range d {
		if q.isWorkOrTier(name) || name == q.dlq() {
			parts = append(parts, fmt.Sprintf("%s=%d", name, n))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}
