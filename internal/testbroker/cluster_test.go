package testbroker

import (
	"strings"
	"testing"
	"time"
)

// The cluster helper itself: three running members, a quorum queue declared
// on one node seen from another, the leader's node killed and a new leader
// elected, the node back and rejoined.
func TestCluster(t *testing.T) {
	c := MustStartCluster(t)
	names, err := c.RunningNodes()
	if err != nil || len(names) != ClusterSize {
		t.Fatalf("running members %v (err %v), want %d", names, err, ClusterSize)
	}
	const q = "cluster-check"
	if out, err := c.Nodes[0].Ctl("eval",
		`rabbit_amqqueue:declare(rabbit_misc:r(<<"/">>, queue, <<"`+q+`">>), true, false, [{<<"x-queue-type">>, longstr, <<"quorum">>}], none, <<"test">>).`); err != nil {
		t.Fatalf("declare a quorum queue: %v\n%s", err, out)
	}
	if out, err := c.Nodes[2].Ctl("list_queues", "-q", "--no-table-headers", "name", "type"); err != nil || !strings.Contains(out, q) {
		t.Fatalf("the queue is not seen from another node (err %v):\n%s", err, out)
	}
	var leader int
	deadline := time.Now().Add(time.Minute)
	for leader, err = c.Leader(q); err != nil; leader, err = c.Leader(q) {
		if time.Now().After(deadline) {
			t.Fatalf("no leader: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := c.KillNode(leader); err != nil {
		t.Fatal(err)
	}
	if c.Nodes[leader].Running() {
		t.Fatal("killed node still running")
	}
	deadline = time.Now().Add(time.Minute)
	for {
		now, err := c.Leader(q)
		if err == nil && now != leader {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader after the leader's node was killed (leader %d, err %v)", now, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := c.StartNode(leader); err != nil {
		t.Fatal(err)
	}
	if names, err := c.RunningNodes(); err != nil || len(names) != ClusterSize {
		t.Fatalf("after the restart: running %v (err %v)", names, err)
	}
}
