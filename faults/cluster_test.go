package faults

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/testbroker"
)

// clusterCount is the number of messages of the cluster scenario: smaller
// than the others in a plain `go test` run (three nodes boot first), the
// same as the others under `make faults`.
func clusterCount(t *testing.T) int {
	if os.Getenv("HOPPER_FAULTS_N") != "" {
		return messageCount(t)
	}
	return envInt(t, "HOPPER_FAULTS_CLUSTER_N", 500)
}

// TestFaultCluster: a quorum work queue on a three-node cluster, Hopper
// given all three addresses. Mid-run the node hosting the queue's leader is
// killed with SIGKILL (a new leader is elected on another node) and brought
// back; later another node is stopped gracefully and brought back. Every
// 10th message is answered 503 once, so it goes through the 1 s delay tier
// and back while the nodes fail, and every 50th 400: every id must end as
// scripted (acked, or in the DLQ as non-retriable), none lost, and
// duplicates only from deliveries in flight at a fault. (On RabbitMQ 3.x
// the app answers 2xx to all: see below.)
func TestFaultCluster(t *testing.T) {
	c := testbroker.MustStartCluster(t)
	useTarget(t, c)
	n := clusterCount(t)
	ids := makeIDs("cluster", n)
	admin := freeAddr(t)
	scripts := map[string]*script{}
	rejected := 0
	// RabbitMQ 3.10 can stop returning messages from a quorum tier whose
	// leader moved (TestFaultQuorumTierFailoverBrokerAlone): there the
	// messages do not go through a tier while the nodes fail.
	tiers := c.Running().Series() >= 4
	for i, id := range ids {
		switch {
		case !tiers:
			scripts[id] = &script{final: answer2xx, want: expectAck}
		case i%50 == 49:
			scripts[id] = &script{final: answer400, want: expectNonRetriable}
			rejected++
		case i%10 == 9:
			scripts[id] = &script{fails: []behavior{answer503}, final: answer2xx, want: expectAck}
		default:
			scripts[id] = &script{final: answer2xx, want: expectAck}
		}
	}
	r := beginApp(t, "cluster", startApp(t, scripts), hopperConfig{QueueType: "quorum", MaxAttempts: 10,
		Extra: "admin:\n  listen: " + admin + "\nretry:\n  tiers: [1s]\n"})
	if tiers {
		r.step("N=%d on a cluster of %d nodes, every 10th answered 503 once, every 50th 400", n, len(c.Nodes))
	} else {
		r.step("N=%d on a cluster of %d nodes of RabbitMQ %s, the app always answers 2xx", n, len(c.Nodes), c.Running().Version())
	}

	// Two halves: the second is published only once the first fault is
	// over, so the second fault too lands while messages still flow,
	// whatever the machine's speed and however long a node takes to rejoin.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	first, second := ids[:n/2], ids[n/2:]
	half := make(chan publishStats, 1)
	go func() { half <- publishPaced(ctx, t, r.q.work, first, 5*time.Second) }()

	r.waitDelivered(n / 4)
	leader := waitLeader(t, c, r.q.work, -1)
	r.step("killing node %d (%s), the leader of %s", leader, c.Nodes[leader].NodeName(), r.q.work)
	if err := c.KillNode(leader); err != nil {
		t.Fatal(err)
	}
	now := waitLeader(t, c, r.q.work, leader)
	r.step("leader moved to node %d", now)
	r.waitDelivered(n / 2)
	if err := c.StartNode(leader); err != nil {
		t.Fatal(err)
	}
	r.step("node %d back in the cluster", leader)

	pubDone := make(chan publishStats, 1)
	go func() {
		a, b := <-half, publishPaced(ctx, t, r.q.work, second, 5*time.Second)
		for id := range b.confirmed {
			a.confirmed[id] = true
		}
		a.failures += b.failures
		a.took += b.took
		pubDone <- a
	}()
	r.waitDelivered(5 * n / 8)
	other := (now + 1) % len(c.Nodes)
	r.step("stopping node %d (%s) gracefully", other, c.Nodes[other].NodeName())
	if err := c.StopNode(other); err != nil {
		t.Fatal(err)
	}
	r.waitDelivered(3 * n / 4)
	if err := c.StartNode(other); err != nil {
		t.Fatal(err)
	}
	r.step("node %d back in the cluster", other)

	// The consumer came back after the node faults, and the metric says so.
	if n := scrapeCounter(t, admin, "hopper_broker_reconnects_total"); n < 1 {
		t.Errorf("hopper_broker_reconnects_total = %v after the node faults, want at least 1", n)
	}
	a := r.finish(pubDone)
	a.report(t)
	// Every DLQ message is one of those ids, non-retriable; a second copy
	// of one (its move confirmed, the ack lost with a node) is a duplicate,
	// counted in dlqCopies, not a message dead-lettered by a fault.
	if a.dlq != rejected || a.byReason["non-retriable"] != a.dlq+a.dlqCopies {
		t.Errorf("%d message(s) in the DLQ (by reason %v, %d extra copies), want the %d answered 400: node faults must not dead-letter anything", a.dlq, a.byReason, a.dlqCopies, rejected)
	}
	// Each fault can redeliver what was prefetched on the connections it
	// cut: a handful of prefetch windows at most.
	if bound := 4 * 50; a.duplicates() > bound {
		t.Errorf("%d duplicates, more than the in-flight window allows (%d)", a.duplicates(), bound)
	}
	ev := r.hopper.eventCounts("CONSUMER_STARTED", "CONSUMER_CANCELLED", "BROKER_RECONNECT")
	t.Logf("hopper events %v", ev)
	if ev["CONSUMER_STARTED"] < 2 {
		t.Errorf("the consumer never consumed again after the node faults (events %v)", ev)
	}
}

// waitLeader waits until the queue has a leader other than not (-1: any)
// and returns its node.
func waitLeader(t *testing.T, c *testbroker.Cluster, queue string, not int) int {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		i, err := c.Leader(queue)
		if err == nil && i != not && c.Nodes[i].Running() {
			return i
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader for %s other than node %d: %v", queue, not, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// freeAddr is a loopback address with a port nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// scrapeCounter reads one unlabelled counter from hopper's /metrics.
func scrapeCounter(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}
