package faults

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/streamsrc"
)

// TestFaultStream: hopper reads a stream, the app answers the seeded mix
// of every class, and hopper is SIGKILLed three times while the stream is
// flowing, each time with deliveries in flight and settled offsets not yet
// stored. A restarted hopper resumes after the offset the broker stored,
// which never passes an unsettled message, so every id must end answered
// 2xx or in the DLQ exactly as its script says; what was settled after the
// last store before a kill comes again, counted as duplicates.
func TestFaultStream(t *testing.T) {
	rb, r, ids, scripts, stream := startStreamScenario(t, "stream", "")
	if err := r.hopper.waitEvent("STREAM_SUBSCRIBED", time.Minute); err != nil {
		t.Fatal(err)
	}
	r.step("hopper reading stream %s as %s (log %s)", stream, streamConsumer, r.hopper.logPath)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pubDone := publishKilling(r, ids, func(chunk []string) publishStats { return publishPaced(ctx, t, stream, chunk, 3*time.Second) })
	// The work and tier queues are the subscription's own: empty while
	// hopper still reads the stream. Every id reaches the app at least
	// once first.
	r.waitSeen(ids, len(ids))
	a := r.finish(pubDone)
	a.report(t)
	checkScripts(t, a, scripts)

	o := streamsrc.Options{Port: rb.StreamPort(), Stream: stream, Consumer: streamConsumer}
	off, ok, err := streamsrc.StoredOffset(o)
	if err != nil || !ok {
		t.Fatalf("stored offset after the run: %d %t %v", off, ok, err)
	}
	ev := r.hopper.eventCounts("STREAM_SUBSCRIBED", "STREAM_RECONNECTING", "STREAM_CLOSED", "CONSUMER_STARTED")
	t.Logf("hopper: %d starts, %d SIGKILLs (%d with a delivery in flight); stored offset %s at the end; events %v",
		r.hopper.starts, r.hopper.kills, r.killed, strconv.FormatInt(off, 10), ev)
	if r.killed == 0 {
		t.Error("no SIGKILL hit a delivery in flight")
	}
}

// TestFaultSuperStream: hopper reads a super stream of three partitions
// as its single active consumer, the messages routed to the partitions by
// key, the app answering the seeded mix, and hopper is SIGKILLed three
// times while the partitions flow. Each partition's stored offset never
// passes an unsettled message of that partition, so every id of every
// partition ends answered 2xx or in the DLQ as its script says. RabbitMQ
// 3.10 has no super streams: there hopper exits with status 65 saying so.
func TestFaultSuperStream(t *testing.T) {
	rb, r, ids, scripts, superStream := startStreamScenario(t, "super-stream", ", superStream: true, partitions: 3, singleActiveConsumer: true")
	if rb.Series() < 4 {
		waitfor.Until(t, time.Minute, "hopper exits", func() bool { return !r.hopper.running() })
		r.hopper.mu.Lock()
		exitErr := r.hopper.exitErr
		r.hopper.mu.Unlock()
		var exit *exec.ExitError
		if !errors.As(exitErr, &exit) || exit.ExitCode() != 65 || !strings.Contains(r.hopper.logTail(30), "3.13") {
			t.Fatalf("hopper on RabbitMQ %s: %v, want exit status 65 refusing the super stream:\n%s", rb.Version(), exitErr, r.hopper.logTail(30))
		}
		t.Logf("RabbitMQ %s: hopper exits with status 65, refusing the super stream", rb.Version())
		return
	}
	if err := r.hopper.waitEvent("STREAM_SUBSCRIBED", time.Minute); err != nil {
		t.Fatal(err)
	}
	r.step("hopper reading super stream %s as %s (log %s)", superStream, streamConsumer, r.hopper.logPath)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	build := func(id string) *msg.Message {
		h := fnv.New32a()
		h.Write([]byte(id)) //nolint:errcheck // never fails
		return &msg.Message{MessageID: id, ContentType: "text/plain", DeliveryMode: 2, Headers: map[string]any{},
			Body: []byte("fault-suite " + id), Exchange: superStream, RoutingKey: strconv.Itoa(int(h.Sum32() % 3))}
	}
	pubDone := publishKilling(r, ids, func(chunk []string) publishStats {
		return publishPacedWith(ctx, t, superStream, chunk, 3*time.Second, build)
	})
	r.waitSeen(ids, len(ids))
	a := r.finish(pubDone)
	a.report(t)
	checkScripts(t, a, scripts)

	var stored []string
	for i := range 3 {
		o := streamsrc.Options{Port: rb.StreamPort(), Stream: fmt.Sprintf("%s-%d", superStream, i), Consumer: streamConsumer}
		off, ok, err := streamsrc.StoredOffset(o)
		if err != nil || !ok {
			t.Fatalf("stored offset of %s after the run: %d %t %v", o.Stream, off, ok, err)
		}
		stored = append(stored, fmt.Sprintf("%s %d", o.Stream, off))
	}
	ev := r.hopper.eventCounts("STREAM_SUBSCRIBED", "STREAM_ACTIVE", "STREAM_RECONNECTING", "STREAM_CLOSED", "CONSUMER_STARTED")
	t.Logf("hopper: %d starts, %d SIGKILLs (%d with a delivery in flight); stored offsets %v at the end; events %v",
		r.hopper.starts, r.hopper.kills, r.killed, stored, ev)
	if r.killed == 0 {
		t.Error("no SIGKILL hit a delivery in flight")
	}
}

// publishKilling publishes ids in four chunks, each over 3 s by publish,
// and SIGKILLs hopper once the app has seen half of each of the first
// three, waiting until the restarted hopper reads again; it returns what
// was published once all of it is.
func publishKilling(r *run, ids []string, publish func(chunk []string) publishStats) chan publishStats {
	r.t.Helper()
	chunks := split(ids, 4)
	var pubs []chan publishStats
	for i, chunk := range chunks {
		done := make(chan publishStats, 1)
		pubs = append(pubs, done)
		go func() { done <- publish(chunk) }()
		if i < len(chunks)-1 {
			r.waitSeen(chunk, len(chunk)/2)
			r.killHopper(300 * time.Millisecond)
			if err := r.hopper.waitEvent("STREAM_SUBSCRIBED", time.Minute); err != nil {
				r.t.Fatal(err)
			}
		}
	}
	return mergePublished(pubs)
}

// streamConsumer is the consumer name hopper reads the scenarios' streams
// as.
const streamConsumer = "hopper"

// startStreamScenario starts a broker with the stream plugin, the app with
// the seeded scripts and hopper reading a new stream named after the
// scenario, with streamKeys added to queue.stream.
func startStreamScenario(t *testing.T, name, streamKeys string) (*testbroker.Broker, *run, []string, map[string]*script, string) {
	t.Helper()
	rb := testbroker.MustStartWith(t, testbroker.Options{Quiet: true, Streams: true})
	useTarget(t, singleNode{rb})
	seed := uint64(envInt(t, "HOPPER_FAULTS_SEED", 1))
	ids := makeIDs(name, messageCount(t))
	scripts := newScripts(ids, seed, maxAttempts)
	app := startApp(t, scripts)
	stream := fmt.Sprintf("faults.%s.%d", name, queueSeq.Add(1))
	r := &run{t: t, name: name, q: queues{work: config.StreamQueue(stream, streamConsumer)}, began: time.Now(), queueType: "stream", app: app}
	cfg := hopperConfig{
		BrokerURLs: target.URLs(), Queue: stream, QueueType: config.QueueTypeStream, AppURL: app.URL(), MaxAttempts: maxAttempts,
		Extra: fmt.Sprintf("queue:\n  stream: {consumer: %s, port: %d, storeEvery: 200ms%s}\n", streamConsumer, rb.StreamPort(), streamKeys),
	}
	r.hopper = startHopper(t, stream, cfg)
	return rb, r, ids, scripts, stream
}
