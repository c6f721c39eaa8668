package testbroker

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// Cluster is three private RabbitMQ nodes on this machine joined into one
// cluster: each has its own node name, ports and directories, and they share
// an Erlang cookie. Quorum queues declared on it have a member on every node
// and survive one node down. Faults are per node: KillNode (SIGKILL, the
// hard fault), StopNode (graceful), StartNode (back, rejoining the cluster
// with its data).
type Cluster struct {
	Nodes []*Broker
}

// ClusterSize is the number of nodes StartCluster starts.
const ClusterSize = 3

// StartCluster starts three nodes, joins the second and third to the first,
// and waits until the cluster lists all three running.
func StartCluster(opts Options) (*Cluster, error) {
	if opts.Cookie == "" {
		opts.Cookie = randomCookie()
	}
	c := &Cluster{Nodes: make([]*Broker, ClusterSize)}
	// Boot the nodes side by side: a first boot is mostly waiting.
	errs := make([]error, ClusterSize)
	var wg sync.WaitGroup
	for i := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Nodes[i], errs[i] = Start(opts)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Stop()
		return nil, err
	}
	first := c.Nodes[0].NodeName()
	for _, b := range c.Nodes[1:] {
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", first}, {"start_app"}} {
			if out, err := b.Ctl(args...); err != nil {
				c.Stop()
				return nil, fmt.Errorf("testbroker: %s %s on %s: %w\n%s", args[0], strings.Join(args[1:], " "), b.NodeName(), err, out)
			}
		}
	}
	if err := c.waitRunning(ClusterSize, 2*time.Minute); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// MustStartCluster starts a cluster for one test and stops it with
// tb.Cleanup. A cluster that cannot start fails the test, never skips it.
func MustStartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	began := time.Now()
	c, err := StartCluster(Options{Quiet: true})
	if err != nil {
		tb.Fatalf("testbroker: cannot start a RabbitMQ cluster: %v\n%s", err, InstallHint)
		return nil
	}
	tb.Cleanup(func() {
		if err := c.Stop(); err != nil {
			tb.Errorf("testbroker: stop cluster: %v", err)
		}
	})
	names := make([]string, len(c.Nodes))
	for i, b := range c.Nodes {
		names[i] = fmt.Sprintf("%s on :%d", b.NodeName(), b.Port())
	}
	tb.Logf("testbroker: cluster of %s started in %v", strings.Join(names, ", "), time.Since(began).Round(time.Millisecond))
	return c
}

// URLs are the AMQP URLs of every node, in order.
func (c *Cluster) URLs() []string {
	out := make([]string, len(c.Nodes))
	for i, b := range c.Nodes {
		out[i] = b.URL()
	}
	return out
}

// Running is a node that is up, for rabbitmqctl calls that any node can
// answer; nil when none is.
func (c *Cluster) Running() *Broker {
	for _, b := range c.Nodes {
		if b.Running() {
			return b
		}
	}
	return nil
}

// Ctl runs rabbitmqctl against a node that is up.
func (c *Cluster) Ctl(args ...string) (string, error) {
	b := c.Running()
	if b == nil {
		return "", errors.New("testbroker: no node of the cluster is running")
	}
	return b.Ctl(args...)
}

// Leader is the index of the node that hosts the leader of a quorum queue.
func (c *Cluster) Leader(queue string) (int, error) {
	out, err := c.Ctl("list_queues", "-q", "--no-table-headers", "name", "leader")
	if err != nil {
		return -1, err
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || f[0] != queue {
			continue
		}
		for i, b := range c.Nodes {
			if b.NodeName() == f[1] {
				return i, nil
			}
		}
		return -1, fmt.Errorf("testbroker: leader of %s is %s, not a node of this cluster", queue, f[1])
	}
	return -1, fmt.Errorf("%w: %s (or it has no leader)", ErrNoQueue, queue)
}

// RunningNodes lists the running members as the cluster itself sees them.
func (c *Cluster) RunningNodes() ([]string, error) {
	out, err := c.Ctl("cluster_status", "--formatter", "json")
	if err != nil {
		return nil, err
	}
	var st struct {
		Running []string `json:"running_nodes"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return nil, fmt.Errorf("testbroker: cluster_status: %w\n%s", err, out)
	}
	return st.Running, nil
}

// waitRunning waits until the cluster lists n running nodes.
func (c *Cluster) waitRunning(n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		names, err := c.RunningNodes()
		if err == nil && len(names) == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testbroker: cluster lists %v running (err %v), want %d nodes", names, err, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// KillNode kills node i with SIGKILL.
func (c *Cluster) KillNode(i int) error { return c.Nodes[i].KillNode() }

// StopNode stops node i gracefully.
func (c *Cluster) StopNode(i int) error { return c.Nodes[i].StopNode() }

// StartNode starts node i again and waits until the cluster lists every
// node that is up as running, so the node has rejoined.
func (c *Cluster) StartNode(i int) error {
	if err := c.Nodes[i].StartNode(); err != nil {
		return err
	}
	up := 0
	for _, b := range c.Nodes {
		if b.Running() {
			up++
		}
	}
	return c.waitRunning(up, 2*time.Minute)
}

// Stop stops every node and removes their directories.
func (c *Cluster) Stop() error {
	var errs []error
	for i := len(c.Nodes) - 1; i >= 0; i-- {
		if b := c.Nodes[i]; b != nil {
			errs = append(errs, b.Stop())
		}
	}
	return errors.Join(errs...)
}
