package testbroker

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestBrokerLifecycle boots a real private node and walks it through
// everything the integration tests rely on: TCP reachability, rabbitmqctl,
// queue counts, a restart that keeps durable data on the same port, a
// longer outage (StopNode/StartNode) and the final Stop.
func TestBrokerLifecycle(t *testing.T) {
	began := time.Now()
	b, err := Start(Options{Quiet: !testing.Verbose()})
	if err != nil {
		t.Fatalf("Start: %v\n%s", err, InstallHint)
	}
	t.Cleanup(func() { _ = b.Stop() })
	t.Logf("start: %v (node %s, port %d, dir %s)", time.Since(began).Round(time.Millisecond), b.NodeName(), b.Port(), b.Dir())

	port := b.Port()
	if want := "amqp://guest:guest@127.0.0.1:" + strconv.Itoa(port) + "/"; b.URL() != want {
		t.Errorf("URL() = %q, want %q", b.URL(), want)
	}
	if !strings.HasPrefix(b.NodeName(), "hopper-test-") || !strings.HasSuffix(b.NodeName(), "@localhost") {
		t.Errorf("NodeName() = %q", b.NodeName())
	}
	if fi, err := os.Stat(b.Dir()); err != nil || !fi.IsDir() {
		t.Fatalf("Dir() %q: %v", b.Dir(), err)
	}
	mustDial(t, port)

	if out, err := b.Ctl("status"); err != nil {
		t.Fatalf("Ctl(status): %v", err)
	} else if !strings.Contains(out, b.NodeName()) {
		t.Errorf("status output does not mention %s:\n%s", b.NodeName(), out)
	}
	if _, err := b.Ctl("list_queues"); err != nil {
		t.Fatalf("Ctl(list_queues): %v", err)
	}
	if _, err := b.Ctl("no_such_command"); err == nil {
		t.Errorf("Ctl(no_such_command) succeeded")
	}
	if err := b.CloseAllConnections(); err != nil {
		t.Fatalf("CloseAllConnections: %v", err)
	}

	_, err = b.QueueDepth("no-such-queue")
	if !errors.Is(err, ErrNoQueue) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("QueueDepth(missing) error = %v, want ErrNoQueue", err)
	}

	// A durable queue with one persistent message, to see both survive
	// the restart.
	const q = "testbroker-durable"
	publishDurable(t, b.URL(), q, "hello")
	checkQueue(t, b, q, 1)

	began = time.Now()
	if err := b.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	t.Logf("restart: %v", time.Since(began).Round(time.Millisecond))
	if b.Port() != port {
		t.Fatalf("port changed across restart: %d -> %d", port, b.Port())
	}
	mustDial(t, port)
	checkQueue(t, b, q, 1) // durable queue and persistent message survived

	began = time.Now()
	if err := b.StopNode(); err != nil {
		t.Fatalf("StopNode: %v", err)
	}
	t.Logf("StopNode: %v", time.Since(began).Round(time.Millisecond))
	if b.Running() {
		t.Errorf("Running() = true after StopNode")
	}
	mustNotDial(t, port)
	if err := b.StopNode(); err != nil {
		t.Errorf("second StopNode: %v", err)
	}
	began = time.Now()
	if err := b.StartNode(); err != nil {
		t.Fatalf("StartNode: %v", err)
	}
	t.Logf("StartNode: %v", time.Since(began).Round(time.Millisecond))
	mustDial(t, port)
	checkQueue(t, b, q, 1)

	dir := b.Dir()
	began = time.Now()
	if err := b.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	t.Logf("stop: %v", time.Since(began).Round(time.Millisecond))
	mustNotDial(t, port)
	if os.Getenv(EnvKeepBroker) != "1" {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("dir %s still exists after Stop (err %v)", dir, err)
		}
	}
	if err := b.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if _, err := b.Ctl("status"); !errors.Is(err, ErrStopped) {
		t.Errorf("Ctl after Stop: err = %v, want ErrStopped", err)
	}
	if err := b.StartNode(); !errors.Is(err, ErrStopped) {
		t.Errorf("StartNode after Stop: err = %v, want ErrStopped", err)
	}
}

func TestStartNotInstalled(t *testing.T) {
	for _, series := range []int{3, 4} {
		_, err := Start(Options{Series: series, BinDir: t.TempDir(), Quiet: true})
		if !errors.Is(err, ErrNotInstalled) {
			t.Errorf("RabbitMQ %d: Start with empty BinDir: err = %v, want ErrNotInstalled", series, err)
		}
	}
	// A RabbitMQ 4 root that lacks what a node under chroot needs is
	// refused before anything is started, with the script that fixes it.
	root := t.TempDir()
	bin := filepath.Join(root, DefaultBinDir)
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"rabbitmq-server", "rabbitmqctl"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(EnvRoot4, root)
	_, err := Start(Options{Series: 4, Quiet: true})
	if !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "install-rabbitmq.sh") {
		t.Errorf("RabbitMQ 4 root without /proc: err = %v, want ErrNotInstalled naming the install script", err)
	}
}

// TestSeriesFromEnvironment: the release series comes from the
// environment unless the options name one, and a bad value is an error,
// never a silent default.
func TestSeriesFromEnvironment(t *testing.T) {
	t.Setenv(EnvSeries, "2")
	if _, err := resolveInstall(Options{}); err == nil || !strings.Contains(err.Error(), EnvSeries) {
		t.Errorf("%s=2: err = %v, want an error naming the variable", EnvSeries, err)
	}
	t.Setenv(EnvSeries, "3")
	t.Setenv(EnvBinDir, t.TempDir())
	if _, err := resolveInstall(Options{}); !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "RabbitMQ 3") {
		t.Errorf("%s=3 with an empty bin dir: err = %v, want RabbitMQ 3 not installed", EnvSeries, err)
	}
	t.Setenv(EnvRoot4, t.TempDir())
	if _, err := resolveInstall(Options{Series: 4}); !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "RabbitMQ 4") {
		t.Errorf("Series 4 over %s=3: err = %v, want RabbitMQ 4 looked for", EnvSeries, err)
	}
}

func TestParseQueueColumns(t *testing.T) {
	out := "orders\t3\t1\norders.dlq\t0\t0\nwith\ttab\t7\t2\nwith space\t5\t0\n"
	cols := []string{"messages_ready", "messages_unacknowledged"}
	for name, want := range map[string][]int{
		"orders":     {3, 1},
		"orders.dlq": {0, 0},
		"with\ttab":  {7, 2},
		"with space": {5, 0},
	} {
		got, err := parseQueueColumns(out, name, cols)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("parseQueueColumns(%q) = %v, %v; want %v", name, got, err, want)
		}
	}
	for _, name := range []string{"order", "", "tab"} {
		if _, err := parseQueueColumns(out, name, cols); !errors.Is(err, ErrNoQueue) {
			t.Errorf("parseQueueColumns(%q) err = %v, want ErrNoQueue", name, err)
		}
	}
	if _, err := parseQueueColumns("", "orders", cols); !errors.Is(err, ErrNoQueue) {
		t.Errorf("empty output: err = %v, want ErrNoQueue", err)
	}
	if _, err := parseQueueColumns("orders\tx\t1\n", "orders", cols); err == nil || errors.Is(err, ErrNoQueue) {
		t.Errorf("bad number: err = %v, want a parse error", err)
	}
}

func checkQueue(t *testing.T, b *Broker, q string, want int) {
	t.Helper()
	n, err := b.QueueDepth(q)
	if err != nil || n != want {
		t.Fatalf("QueueDepth(%q) = %d, %v; want %d", q, n, err, want)
	}
	ready, unacked, err := b.QueueCounts(q)
	if err != nil || ready != want || unacked != 0 {
		t.Fatalf("QueueCounts(%q) = %d, %d, %v; want %d, 0", q, ready, unacked, err, want)
	}
}

func mustDial(t *testing.T, port int) {
	t.Helper()
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 5*time.Second)
	if err != nil {
		t.Fatalf("dial AMQP port %d: %v", port, err)
	}
	c.Close()
}

func mustNotDial(t *testing.T, port int) {
	t.Helper()
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 2*time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("AMQP port %d still accepts connections", port)
	}
}

// publishDurable declares a durable queue and publishes one persistent
// message to it with a confirm.
func publishDurable(t *testing.T, url, q, body string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatalf("declare %s: %v", q, err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm mode: %v", err)
	}
	dc, err := ch.PublishWithDeferredConfirm("", q, false, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if ok := dc.Wait(); !ok {
		t.Fatalf("publish to %s was nacked", q)
	}
}
