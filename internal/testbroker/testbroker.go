// Package testbroker starts a private RabbitMQ node for tests.
//
// Every Broker is a separate RabbitMQ node with its own node name, its own
// AMQP and Erlang distribution ports (picked at random on 127.0.0.1), its own
// Erlang cookie and its own data and log directories inside a fresh temporary
// directory. Tests therefore never touch a system-wide broker (the one the
// Debian package installs as a service, with its data in /var/lib/rabbitmq),
// never depend on one being up, and never see queues or messages left behind
// by another test run or by another package whose tests run in parallel.
//
// Two release series can run the node. RabbitMQ 4 is the default, since it
// is what Hopper's users run; HOPPER_TEST_RABBITMQ=3 (or Options.Series)
// picks the 3.x that the host's own package manager installs. Debian's
// package of RabbitMQ 4 needs a newer C library than a stable host has, so
// scripts/install-rabbitmq.sh puts it in a root of its own
// (/opt/hopper/rabbitmq-4, or HOPPER_RABBITMQ4_ROOT) and the node runs there
// under chroot: it shares the host's network, so it listens on 127.0.0.1
// like a local one, and its directory lives below that root's /tmp where
// both the host and the node can see it. HOPPER_RABBITMQ4_ROOT=/ runs a
// RabbitMQ 4 installed on the host itself.
//
// The node is started from the real RabbitMQ scripts in
// /usr/lib/rabbitmq/bin (override with Options.BinDir or the environment
// variable HOPPER_RABBITMQ_BIN). The Debian wrapper /usr/sbin/rabbitmq-server
// is deliberately not used: it switches to the rabbitmq user and forces the
// system data directory, which is exactly what a private node must avoid.
//
// A missing RabbitMQ installation is a test failure, never a skip: the
// integration tests that use this package are the ones that prove hopper
// works against a real broker, and silently skipping them would hide that
// they did not run. Install RabbitMQ with `make deps`,
// scripts/install-rabbitmq.sh or `apt-get install -y rabbitmq-server`.
//
// Typical use, one node per test package:
//
//	var broker *testbroker.Broker
//
//	func TestMain(m *testing.M) { os.Exit(testbroker.RunMain(m, &broker)) }
//
// or one node per test (a first boot takes a few seconds):
//
//	b := testbroker.MustStart(t)
//	conn, err := amqp.Dial(b.URL())
//
// Set HOPPER_KEEP_BROKER=1 to keep the node's directory (logs, data) after
// Stop for debugging.
package testbroker

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// DefaultBinDir is where the Debian/Ubuntu rabbitmq-server package puts the
// real RabbitMQ scripts (rabbitmq-server, rabbitmqctl).
const DefaultBinDir = "/usr/lib/rabbitmq/bin"

// Environment variables understood by this package.
const (
	// EnvKeepBroker, when set to "1", keeps the node's directory after Stop.
	EnvKeepBroker = "HOPPER_KEEP_BROKER"
	// EnvBinDir overrides DefaultBinDir.
	EnvBinDir = "HOPPER_RABBITMQ_BIN"
	// EnvSeries picks the release series of every node a test starts:
	// "4" (the default) or "3".
	EnvSeries = "HOPPER_TEST_RABBITMQ"
	// EnvRoot4 overrides DefaultRoot4; "/" means RabbitMQ 4 is installed
	// on the host itself and runs without chroot.
	EnvRoot4 = "HOPPER_RABBITMQ4_ROOT"
)

// DefaultRoot4 is where scripts/install-rabbitmq.sh installs RabbitMQ 4 with
// the libraries of the release it was built for.
const DefaultRoot4 = "/opt/hopper/rabbitmq-4"

// epmdPort4 is the Erlang port mapper port of RabbitMQ 4 nodes. A node
// registers with the epmd of its own Erlang release, never with one a 3.x
// node started on the default port 4369, so the two series run side by side.
const epmdPort4 = 4370

// InstallHint tells a developer how to get RabbitMQ onto the machine. It is
// part of every "cannot start" failure printed by MustStart and RunMain.
const InstallHint = "RabbitMQ is required for these tests and is never skipped. " +
	"Install it with `make deps` or `scripts/install-rabbitmq.sh` (RabbitMQ 4 in " + DefaultRoot4 +
	" and Debian's own 3.x); " + EnvSeries + "=3 runs the tests on 3.x; " +
	"set " + EnvBinDir + " if the 3.x scripts are not in " + DefaultBinDir +
	", " + EnvRoot4 + " if RabbitMQ 4 is elsewhere."

const (
	// defaultStartTimeout bounds a node boot. A first boot takes about
	// 4 s to 10 s depending on the machine; the margin is for loaded CI.
	defaultStartTimeout = 2 * time.Minute
	// stopTimeout bounds `rabbitmqctl stop` (normally about 3 s).
	stopTimeout = 1 * time.Minute
	// exitGrace is how long to wait for the server process to exit after
	// a successful stop, and again after SIGTERM, before using SIGKILL.
	exitGrace = 15 * time.Second
	// ctlTimeout bounds any other rabbitmqctl call.
	ctlTimeout = 2 * time.Minute
	// dialTimeout bounds the final "AMQP port accepts TCP" check.
	dialTimeout = 10 * time.Second
	// logTailLines is how many log lines a start failure includes.
	logTailLines = 40
	// portRetries is how many times Start picks new ports when the
	// ones it picked were taken by someone else before the node bound them.
	portRetries = 3
)

var (
	// ErrNotInstalled is returned (wrapped) by Start when the RabbitMQ
	// scripts cannot be found.
	ErrNotInstalled = errors.New("testbroker: RabbitMQ is not installed")
	// ErrNoQueue is returned (wrapped) by QueueDepth and QueueCounts when
	// the queue does not exist. It wraps os.ErrNotExist, so
	// errors.Is(err, os.ErrNotExist) also holds.
	ErrNoQueue = fmt.Errorf("testbroker: no such queue: %w", os.ErrNotExist)
	// ErrStopped is returned by methods that need a node after Stop.
	ErrStopped = errors.New("testbroker: broker has been stopped")
)

// Options configures Start. The zero value is valid.
type Options struct {
	// Dir is the parent directory for the node's private directory
	// (created with os.MkdirTemp). Empty means os.TempDir().
	Dir string
	// Quiet suppresses progress messages on standard error.
	Quiet bool
	// BinDir holds rabbitmq-server and rabbitmqctl. Empty means the
	// HOPPER_RABBITMQ_BIN environment variable, then DefaultBinDir.
	BinDir string
	// StartTimeout bounds each node boot. Zero means 2 minutes.
	StartTimeout time.Duration
	// ExtraConfig is appended to the node's rabbitmq.conf (for example a
	// TLS listener).
	ExtraConfig string
	// Cookie is the Erlang cookie; nodes that are to form a cluster share
	// one. Empty means a random cookie of the node's own.
	Cookie string
	// Plugins are enabled when the node boots (written to its
	// enabled_plugins file), for example
	// "rabbitmq_consistent_hash_exchange". Default none.
	Plugins []string
	// Streams enables the rabbitmq_stream plugin and gives its listener a
	// free port of its own on 127.0.0.1 (StreamPort), advertised as
	// 127.0.0.1 so that a stream client that asks where a stream's leader
	// is comes back to the same listener. Default false.
	Streams bool
	// Series is the RabbitMQ release series, 3 or 4. Zero means the
	// HOPPER_TEST_RABBITMQ environment variable, then 4.
	Series int
	// Files are written into the node's directory before it boots (name
	// relative to that directory → content), for configuration that
	// names files such as TLS certificates: the node under chroot cannot
	// see the host's temporary directories. ExtraConfig refers to the
	// directory as the node sees it with the placeholder {{dir}}.
	Files map[string][]byte
}

// Broker is a private RabbitMQ node. Its methods are safe for concurrent
// use; StopNode, StartNode, Restart and Stop are serialized.
type Broker struct {
	// Immutable after Start.
	dir          string // as this process sees it
	root         string // the chroot the node runs in; "" for none
	series       int    // 3 or 4
	nodeName     string
	binDir       string // as the node sees it
	pidFile      string
	serverLog    string
	nodeLog      string
	quiet        bool
	extraConfig  string
	cookie       string
	plugins      []string
	streams      bool
	startTimeout time.Duration
	files        map[string][]byte

	versionOnce sync.Once
	version     string

	mu         sync.Mutex
	port       int // AMQP port
	distPort   int // Erlang distribution port
	streamPort int // stream protocol port; 0 without Options.Streams
	env        []string
	proc       *serverProc // nil while the node is down
	stopped    bool        // Stop has been called
}

// serverProc is one run of rabbitmq-server.
type serverProc struct {
	cmd     *exec.Cmd
	beamPID int           // the Erlang VM, read from the pid file
	done    chan struct{} // closed when cmd has exited and been reaped
	err     error         // cmd.Wait's result, valid after done
}

// Start creates a fresh directory, starts a private RabbitMQ node in it and
// waits until the node accepts AMQP connections. If the RabbitMQ scripts are
// missing the error wraps ErrNotInstalled. On any other failure the error
// includes the tail of the node's logs.
func Start(opts Options) (*Broker, error) {
	inst, err := resolveInstall(opts)
	if err != nil {
		return nil, err
	}
	parent := opts.Dir
	if parent == "" && inst.root != "" {
		parent = filepath.Join(inst.root, "tmp")
	}
	dir, err := os.MkdirTemp(parent, "hopper-testbroker-")
	if err != nil {
		return nil, fmt.Errorf("testbroker: create node dir: %w", err)
	}
	if inst.root != "" && !strings.HasPrefix(dir, inst.root+string(filepath.Separator)) {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("testbroker: node dir %s is outside %s, where RabbitMQ %d runs and could not see it", dir, inst.root, inst.series)
	}
	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = defaultStartTimeout
	}
	// The node name must be unique among all nodes registered with the
	// shared epmd on this host: pid plus a random suffix.
	nodeName := fmt.Sprintf("hopper-test-%d-%s@localhost", os.Getpid(), randomHex(4))
	b := &Broker{
		dir:          dir,
		root:         inst.root,
		series:       inst.series,
		nodeName:     nodeName,
		binDir:       inst.binDir,
		pidFile:      filepath.Join(dir, "rabbitmq.pid"),
		serverLog:    filepath.Join(dir, "server.log"),
		nodeLog:      filepath.Join(dir, "log", nodeName+".log"),
		quiet:        opts.Quiet,
		extraConfig:  opts.ExtraConfig,
		cookie:       opts.Cookie,
		plugins:      opts.Plugins,
		streams:      opts.Streams,
		startTimeout: timeout,
		files:        opts.Files,
	}
	if b.cookie == "" {
		b.cookie = randomCookie()
	}
	if b.streams && !slices.Contains(b.plugins, streamPlugin) {
		b.plugins = append(slices.Clone(b.plugins), streamPlugin)
	}
	if err := b.prepareDir(); err != nil {
		b.removeDir()
		return nil, err
	}

	began := time.Now()
	for attempt := 1; ; attempt++ {
		if err = b.pickPorts(); err != nil {
			break
		}
		b.mu.Lock()
		err = b.startNodeLocked()
		b.mu.Unlock()
		if err == nil || attempt >= portRetries || !strings.Contains(err.Error(), "eaddrinuse") {
			break
		}
		b.logf("ports %d/%d were taken, retrying with new ones", b.port, b.distPort)
	}
	if err != nil {
		b.mu.Lock()
		b.stopped = true
		b.mu.Unlock()
		b.removeDir()
		return nil, err
	}
	b.logf("node %s listening on %s (dir %s), started in %v",
		b.nodeName, b.addr(), b.dir, time.Since(began).Round(time.Millisecond))
	return b, nil
}

// install is where the scripts of one release series are, and how to run them.
type install struct {
	series int
	root   string // chroot; "" to run on the host
	binDir string // as seen inside root
}

// resolveInstall picks the release series and checks that its scripts are
// there, and for a chroot that it can run a node: the kernel's file
// systems mounted in it and the host's names copied in (without them
// Erlang cannot resolve localhost and the node never registers).
func resolveInstall(opts Options) (install, error) {
	series := opts.Series
	if series == 0 {
		switch v := os.Getenv(EnvSeries); v {
		case "", "4":
			series = 4
		case "3":
			series = 3
		default:
			return install{}, fmt.Errorf("testbroker: %s=%q: want 3 or 4", EnvSeries, v)
		}
	}
	if series != 3 && series != 4 {
		return install{}, fmt.Errorf("testbroker: RabbitMQ series %d: want 3 or 4", series)
	}
	in := install{series: series}
	in.binDir = opts.BinDir
	if series == 4 {
		in.root = os.Getenv(EnvRoot4)
		if in.root == "" {
			in.root = DefaultRoot4
		}
		if in.root == "/" {
			in.root = ""
		} else if in.binDir == "" {
			// The 3.x override names a host folder, not one in the root.
			in.binDir = DefaultBinDir
		}
	}
	if in.binDir == "" {
		in.binDir = os.Getenv(EnvBinDir)
	}
	if in.binDir == "" {
		in.binDir = DefaultBinDir
	}
	for _, name := range []string{"rabbitmq-server", "rabbitmqctl"} {
		p := filepath.Join(in.root, in.binDir, name)
		if fi, err := os.Stat(p); err != nil || fi.IsDir() {
			return install{}, fmt.Errorf("%w: RabbitMQ %d: %s not found", ErrNotInstalled, series, p)
		}
	}
	if in.root != "" {
		for _, p := range []string{"proc/self", "dev/null", "etc/hosts"} {
			if _, err := os.Stat(filepath.Join(in.root, p)); err != nil {
				return install{}, fmt.Errorf("%w: RabbitMQ %d in %s cannot run: %s is missing (scripts/install-rabbitmq.sh mounts and copies what it needs)",
					ErrNotInstalled, series, in.root, p)
			}
		}
	}
	return in, nil
}

// pluginsFile is the Erlang term list of an enabled_plugins file.
func pluginsFile(plugins []string) string {
	return "[" + strings.Join(plugins, ",") + "].\n"
}

// MustStartWith starts a broker with opts for one test, like MustStart.
func MustStartWith(tb testing.TB, opts Options) *Broker {
	tb.Helper()
	b, err := Start(opts)
	if err != nil {
		tb.Fatalf("testbroker: cannot start RabbitMQ: %v\n%s", err, InstallHint)
		return nil
	}
	tb.Cleanup(func() {
		if err := b.Stop(); err != nil {
			tb.Errorf("testbroker: stop: %v", err)
		}
	})
	return b
}

// MustStart starts a broker for one test and registers its Stop with
// tb.Cleanup. If the broker cannot be started the test fails (it is never
// skipped) with a hint on how to install RabbitMQ.
func MustStart(tb testing.TB) *Broker {
	tb.Helper()
	began := time.Now()
	b, err := Start(Options{Quiet: true})
	if err != nil {
		tb.Fatalf("testbroker: cannot start RabbitMQ: %v\n%s", err, InstallHint)
		return nil
	}
	tb.Cleanup(func() {
		if err := b.Stop(); err != nil {
			tb.Errorf("testbroker: stop: %v", err)
		}
	})
	tb.Logf("testbroker: node %s on %s started in %v (dir %s)",
		b.NodeName(), b.addr(), time.Since(began).Round(time.Millisecond), b.Dir())
	return b
}

// Runner runs a package's tests: *testing.M, or a wrapper that does some
// setup once the broker is up.
type Runner interface{ Run() int }

// RunMain is for TestMain: it starts one broker for the whole package,
// stores it in *dst, runs the tests, stops the broker and returns the exit
// code for os.Exit. If the broker cannot be started it prints the reason
// and an install hint and returns 1 without running any test.
//
//	var broker *testbroker.Broker
//
//	func TestMain(m *testing.M) { os.Exit(testbroker.RunMain(m, &broker)) }
func RunMain(m Runner, dst **Broker) int {
	b, err := Start(Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: testbroker: cannot start RabbitMQ: %v\n%s\n", err, InstallHint)
		return 1
	}
	*dst = b
	code := m.Run()
	if err := b.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: testbroker: stop: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Lazy is one node for a test package, started by the first test that asks
// for it: the pure tests of a package that also has integration tests then
// run (`make unit`) with no RabbitMQ installed, while a test that needs the
// broker and cannot start it fails, never skips.
type Lazy struct {
	// Options are those the node starts with.
	Options Options

	once sync.Once
	b    *Broker
	err  error
}

// Get returns the package's node, starting it on first use. It fails t
// with the install hint when the node cannot start.
func (l *Lazy) Get(t testing.TB) *Broker {
	t.Helper()
	l.once.Do(func() { l.b, l.err = Start(l.Options) })
	if l.err != nil {
		t.Fatalf("testbroker: cannot start RabbitMQ: %v\n%s", l.err, InstallHint)
	}
	return l.b
}

// RunLazy runs the package's tests and stops the node if one was started.
//
//	var node testbroker.Lazy
//	func TestMain(m *testing.M) { os.Exit(testbroker.RunLazy(m, &node)) }
func RunLazy(m Runner, l *Lazy) int {
	code := m.Run()
	if l.b != nil {
		if err := l.b.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: testbroker: stop: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// URL returns the AMQP URL of the node, using the default guest account
// (allowed over loopback only by default; the node's config lifts that
// restriction, but the node only listens on 127.0.0.1 anyway).
func (b *Broker) URL() string {
	return "amqp://guest:guest@" + b.addr() + "/"
}

// Port returns the AMQP port. It does not change across restarts.
func (b *Broker) Port() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.port
}

// StreamPort returns the stream protocol port, 0 unless the node was
// started with Options.Streams. It does not change across restarts.
func (b *Broker) StreamPort() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.streamPort
}

// streamPlugin serves the stream protocol.
const streamPlugin = "rabbitmq_stream"

// Series is the node's RabbitMQ release series, 3 or 4.
func (b *Broker) Series() int { return b.series }

// Version is the RabbitMQ version the node runs, as rabbitmqctl prints it
// (for example 4.3.6); "" when it cannot be asked.
func (b *Broker) Version() string {
	b.versionOnce.Do(func() {
		if out, err := b.Ctl("version"); err == nil {
			b.version = strings.TrimSpace(out)
		}
	})
	return b.version
}

// NodeName returns the Erlang node name, e.g. hopper-test-123-ab12cd34@localhost.
func (b *Broker) NodeName() string { return b.nodeName }

// Dir returns the node's private directory (config, cookie, data, logs).
// It is removed by Stop unless HOPPER_KEEP_BROKER=1.
func (b *Broker) Dir() string { return b.dir }

// Running reports whether the node is up (started and not stopped).
func (b *Broker) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.proc != nil
}

// Ctl runs rabbitmqctl against this node (with -n and the node's
// environment) and returns its combined output. On failure the error
// includes the output.
func (b *Broker) Ctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout)
	defer cancel()
	b.mu.Lock()
	env, stopped := b.env, b.stopped
	b.mu.Unlock()
	if stopped {
		return "", ErrStopped
	}
	return b.ctl(ctx, env, args...)
}

// CloseAllConnections force-closes every client connection, as an operator
// or a failing broker would. Clients see a connection.close with reason "test".
func (b *Broker) CloseAllConnections() error {
	_, err := b.Ctl("close_all_connections", "test")
	return err
}

// QueueDepth returns the number of messages in a queue of vhost "/".
// Like RabbitMQ's own "messages" column it counts ready plus unacknowledged
// messages; see QueueCounts to tell them apart. If the queue does not exist
// the error wraps ErrNoQueue.
func (b *Broker) QueueDepth(name string) (int, error) {
	n, err := b.queueColumns(name, "messages")
	if err != nil {
		return 0, err
	}
	return n[0], nil
}

// QueueCounts returns the ready and unacknowledged (delivered, not yet
// acked) message counts of a queue of vhost "/". If the queue does not
// exist the error wraps ErrNoQueue.
func (b *Broker) QueueCounts(name string) (ready, unacked int, err error) {
	n, err := b.queueColumns(name, "messages_ready", "messages_unacknowledged")
	if err != nil {
		return 0, 0, err
	}
	return n[0], n[1], nil
}

func (b *Broker) queueColumns(name string, cols ...string) ([]int, error) {
	args := append([]string{"list_queues", "-q", "--no-table-headers", "-p", "/", "name"}, cols...)
	out, err := b.Ctl(args...)
	if err != nil {
		return nil, err
	}
	nums, err := parseQueueColumns(out, name, cols)
	if err != nil {
		return nil, fmt.Errorf("testbroker: queue %q: %w", name, err)
	}
	return nums, nil
}

// parseQueueColumns finds queue name in the output of
// `rabbitmqctl list_queues -q --no-table-headers name <cols...>`: one line
// per queue, tab-separated, the numbers last.
func parseQueueColumns(out, name string, cols []string) ([]int, error) {
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimRight(line, "\r")
		// The numbers are the last len(cols) fields; the name is
		// everything before them (it may itself contain a tab).
		f := strings.Split(line, "\t")
		if len(f) < len(cols)+1 || strings.Join(f[:len(f)-len(cols)], "\t") != name {
			continue
		}
		nums := make([]int, len(cols))
		for i, s := range f[len(f)-len(cols):] {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				return nil, fmt.Errorf("cannot parse %s %q in line %q", cols[i], s, line)
			}
			nums[i] = n
		}
		return nums, nil
	}
	return nil, ErrNoQueue
}

// Restart stops the node and starts it again on the same port with the same
// data directory, so durable queues and persistent messages survive, as in a
// real broker restart. Clients see their connections dropped.
func (b *Broker) Restart() error {
	if err := b.StopNode(); err != nil {
		return err
	}
	return b.StartNode()
}

// StopNode stops the node gracefully (as an operator would) but keeps its
// data, port and directory, so StartNode can bring it back. Use it to keep
// the broker down for a while; use Restart to bounce it. Stopping a node
// that is already down is a no-op.
func (b *Broker) StopNode() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return ErrStopped
	}
	if b.proc == nil {
		return nil
	}
	began := time.Now()
	if err := b.stopNodeLocked(); err != nil {
		return err
	}
	b.logf("node %s stopped in %v", b.nodeName, time.Since(began).Round(time.Millisecond))
	return nil
}

// KillNode kills the node with SIGKILL, the hard fault: no graceful
// shutdown, every connection cut at once, whatever the machine's speed. Its
// data, port and directory stay, so StartNode can bring it back. Killing a
// node that is already down is a no-op.
func (b *Broker) KillNode() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return ErrStopped
	}
	p := b.proc
	if p == nil {
		return nil
	}
	b.proc = nil
	b.sigkill(p)
	b.logf("node %s killed (SIGKILL)", b.nodeName)
	return nil
}

// StartNode starts a node stopped by StopNode again, on the same port and
// with the same data, and waits until it accepts AMQP connections. Starting
// a node that is already up is a no-op.
func (b *Broker) StartNode() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return ErrStopped
	}
	if b.proc != nil {
		return nil
	}
	began := time.Now()
	if err := b.startNodeLocked(); err != nil {
		return err
	}
	b.logf("node %s started again on %s in %v", b.nodeName, b.addrLocked(), time.Since(began).Round(time.Millisecond))
	return nil
}

// Stop stops the node and removes its directory (unless
// HOPPER_KEEP_BROKER=1). It is idempotent; calls after the first return nil.
// If the node does not stop gracefully it is killed.
func (b *Broker) Stop() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return nil
	}
	b.stopped = true
	err := b.stopNodeLocked()
	b.removeDir()
	return err
}

// prepareDir writes the plugins file, an empty env file and the
// Erlang cookie.
func (b *Broker) prepareDir() error {
	for _, d := range []string{"home", "mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(b.dir, d), 0o755); err != nil {
			return fmt.Errorf("testbroker: %w", err)
		}
	}
	files := []struct {
		name string
		data string
		mode os.FileMode
	}{
		// loopback_users = none: let guest log in however 127.0.0.1 is
		// reached. log.console = false: the node logs to its own file
		// under log/, server.log only gets the banner and crashes.
		{"enabled_plugins", pluginsFile(b.plugins), 0o644},
		// Used instead of /etc/rabbitmq/rabbitmq-env.conf, so a system
		// setting (NODENAME, NODE_PORT, ...) cannot leak into the node.
		{"rabbitmq-env.conf", "", 0o644},
		// The server and every rabbitmqctl call find the cookie through
		// HOME. Erlang refuses a cookie readable by others.
		{filepath.Join("home", ".erlang.cookie"), b.cookie, 0o400},
	}
	for name, data := range b.files {
		files = append(files, struct {
			name string
			data string
			mode os.FileMode
		}{name, string(data), 0o600})
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(b.dir, f.name), []byte(f.data), f.mode); err != nil {
			return fmt.Errorf("testbroker: %w", err)
		}
	}
	return nil
}

// writeConfigLocked writes rabbitmq.conf, which names the ports picked
// for the node's listeners beyond AMQP's (given by the environment).
func (b *Broker) writeConfigLocked() error {
	// loopback_users = none: let guest log in however 127.0.0.1 is
	// reached. log.console = false: the node logs to its own file under
	// log/, server.log only gets the banner and crashes.
	conf := "loopback_users = none\nlog.console = false\n"
	if b.streamPort != 0 {
		conf += fmt.Sprintf("stream.listeners.tcp.1 = 127.0.0.1:%d\nstream.advertised_host = 127.0.0.1\nstream.advertised_port = %d\n",
			b.streamPort, b.streamPort)
	}
	conf += strings.ReplaceAll(b.extraConfig, "{{dir}}", b.nodePath(b.dir))
	if err := os.WriteFile(filepath.Join(b.dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
		return fmt.Errorf("testbroker: %w", err)
	}
	return nil
}

// nodePath is a path of this process as the node sees it: inside a chroot,
// without the root's prefix.
func (b *Broker) nodePath(p string) string {
	if b.root == "" {
		return p
	}
	return strings.TrimPrefix(p, b.root)
}

// command runs one of the release's scripts, under chroot when the release
// has a root of its own (chroot replaces itself with the script, so the
// parent-death signal and the process ID stay the script's).
func (b *Broker) command(ctx context.Context, script string, args ...string) *exec.Cmd {
	path := filepath.Join(b.binDir, script)
	if b.root == "" {
		return exec.CommandContext(ctx, path, args...)
	}
	return exec.CommandContext(ctx, "chroot", append([]string{b.root, path}, args...)...)
}

// pickPorts picks free AMQP and distribution ports by listening on
// 127.0.0.1:0. Both listeners are held open together so the ports differ.
func (b *Broker) pickPorts() error {
	var ports [3]int
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("testbroker: pick a free port: %w", err)
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.port, b.distPort = ports[0], ports[1]
	if b.streams {
		b.streamPort = ports[2]
	}
	b.env = b.buildEnv()
	return b.writeConfigLocked()
}

// buildEnv returns the environment shared by the server and every
// rabbitmqctl call. Inherited RABBITMQ_* variables are dropped so the
// developer's own settings cannot redirect the node.
func (b *Broker) buildEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "RABBITMQ_") || strings.HasPrefix(kv, "HOME=") ||
			strings.HasPrefix(kv, "CONF_ENV_FILE=") || strings.HasPrefix(kv, "ERL_EPMD_PORT=") {
			continue
		}
		env = append(env, kv)
	}
	d := b.nodePath(b.dir)
	env = append(env,
		"HOME="+filepath.Join(d, "home"),
		"RABBITMQ_NODENAME="+b.nodeName,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(b.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(b.distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(d, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(d, "log"),
		"RABBITMQ_PID_FILE="+b.nodePath(b.pidFile),
		// Without the .conf suffix; RabbitMQ adds it (both forms work
		// with 3.10).
		"RABBITMQ_CONFIG_FILE="+filepath.Join(d, "rabbitmq"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(d, "advanced.config"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(d, "enabled_plugins"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(d, "rabbitmq-env.conf"),
		// The distribution port would otherwise listen on all interfaces.
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
	)
	if b.series == 4 {
		env = append(env, "ERL_EPMD_PORT="+strconv.Itoa(epmdPort4))
	}
	return env
}

// startNodeLocked launches rabbitmq-server in the background and waits for
// it with `rabbitmqctl wait <pidfile>`, which polls until the pid file
// appears and the rabbit application runs. (`rabbitmqctl await_startup`
// right after launch fails with exit code 69 because the node is not
// registered yet.) If the server exits first, the wait is cancelled at once
// instead of running into its timeout.
func (b *Broker) startNodeLocked() error {
	_ = os.Remove(b.pidFile)
	logFile, err := os.OpenFile(b.serverLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("testbroker: %w", err)
	}
	defer logFile.Close() // the child has its own copy
	fmt.Fprintf(logFile, "==== testbroker: starting %s on 127.0.0.1:%d at %s\n",
		b.nodeName, b.port, time.Now().Format(time.RFC3339))

	cmd := b.command(context.Background(), "rabbitmq-server")
	cmd.Env = b.env
	cmd.Dir = b.dir
	// An *os.File, not a pipe: Wait then returns as soon as the server
	// exits, even if a grandchild (epmd) still holds the descriptor.
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	setParentDeathSignal(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testbroker: start %s: %w", cmd.Path, err)
	}
	p := &serverProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), b.startTimeout+10*time.Second)
	defer cancel()
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	secs := strconv.Itoa(int((b.startTimeout + time.Second - 1) / time.Second))
	err = waitForPidFile(ctx, b.pidFile, p.done)
	if err == nil {
		_, err = b.ctl(ctx, b.env, "wait", b.nodePath(b.pidFile), "--timeout", secs)
	}
	if err == nil {
		err = waitForPort(b.addrLocked(), dialTimeout, p.done)
	}
	if err != nil {
		select {
		case <-p.done:
			err = fmt.Errorf("rabbitmq-server exited during startup (%v): %w", p.err, err)
		default:
			b.killLocked(p)
		}
		return fmt.Errorf("testbroker: start node %s on port %d: %w\n%s", b.nodeName, b.port, err, b.logTail())
	}
	if data, err := os.ReadFile(b.pidFile); err == nil {
		p.beamPID, _ = strconv.Atoi(strings.TrimSpace(string(data)))
	}
	b.proc = p
	return nil
}

// stopNodeLocked stops the node with `rabbitmqctl stop <pidfile>`, which
// returns once the Erlang VM has exited, then makes sure the server process
// is gone, escalating to SIGTERM and SIGKILL. The epmd daemon the node
// started is left running: other nodes on the host may share it.
func (b *Broker) stopNodeLocked() error {
	p := b.proc
	if p == nil {
		return nil
	}
	b.proc = nil
	select {
	case <-p.done:
		b.logf("node %s had already exited (%v); see %s", b.nodeName, p.err, b.nodeLog)
		return nil
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	_, stopErr := b.ctl(ctx, b.env, "stop", b.nodePath(b.pidFile))
	select {
	case <-p.done:
		if stopErr != nil {
			b.logf("rabbitmqctl stop failed but the node exited: %v", stopErr)
		}
		return nil
	case <-time.After(exitGrace):
	}
	b.killLocked(p)
	if stopErr == nil {
		stopErr = errors.New("server did not exit")
	}
	return fmt.Errorf("testbroker: node %s did not stop gracefully and was killed: %w", b.nodeName, stopErr)
}

// killLocked terminates a server process: SIGTERM first (the wrapper script
// traps it and stops the VM cleanly), then SIGKILL for the wrapper and the
// VM.
func (b *Broker) killLocked(p *serverProc) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(exitGrace):
	}
	b.sigkill(p)
}

// sigkill kills the Erlang VM and its wrapper script with SIGKILL and reaps
// them.
func (b *Broker) sigkill(p *serverProc) {
	beam := p.beamPID
	if beam == 0 {
		if data, err := os.ReadFile(b.pidFile); err == nil {
			beam, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		}
	}
	if beam > 0 {
		if proc, err := os.FindProcess(beam); err == nil {
			_ = proc.Kill()
		}
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// ctl runs rabbitmqctl -n <node> args... with env.
func (b *Broker) ctl(ctx context.Context, env []string, args ...string) (string, error) {
	cmd := b.command(ctx, "rabbitmqctl", append([]string{"-n", b.nodeName}, args...)...)
	cmd.Env = env
	cmd.Dir = b.dir
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = fmt.Errorf("%w (%w)", err, ctxErr)
		}
		return string(out), fmt.Errorf("rabbitmqctl %s: %w\n%s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// waitForPort waits until addr accepts TCP connections. It normally
// succeeds at once: `rabbitmqctl wait` returns after the listeners are up.
// waitForPidFile waits until the node's pid file holds a whole number.
// The node creates the file before it writes the pid into it (a few
// digits, one write), and `rabbitmqctl wait` that reads it in between
// gives up at once ("garbage_in_pid_file"), as it did on a loaded machine.
func waitForPidFile(ctx context.Context, file string, exited <-chan struct{}) error {
	for {
		data, err := os.ReadFile(file)
		if err == nil {
			if _, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("server exited before writing its pid file")
		case <-ctx.Done():
			return fmt.Errorf("pid file %s not written: %w", file, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func waitForPort(addr string, timeout time.Duration, exited <-chan struct{}) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("AMQP port not accepting connections after %v: %w", timeout, err)
		}
		select {
		case <-exited:
			return fmt.Errorf("server exited: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logTail returns the last lines of the server's stdout/stderr and of the
// node's own log, for start failure messages.
func (b *Broker) logTail() string {
	var sb strings.Builder
	for _, f := range []string{b.serverLog, b.nodeLog} {
		lines, err := tailLines(f, logTailLines)
		if err != nil || len(lines) == 0 {
			continue
		}
		fmt.Fprintf(&sb, "--- last %d lines of %s ---\n", len(lines), f)
		for _, l := range lines {
			sb.WriteString(l)
			sb.WriteByte('\n')
		}
	}
	if sb.Len() == 0 {
		return "(no log output)"
	}
	return strings.TrimRight(sb.String(), "\n")
}

func tailLines(path string, n int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// Only the end of the file matters; 64 KiB is plenty for 40 lines.
	const maxTail = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > maxTail {
		if _, err := f.Seek(-maxTail, io.SeekEnd); err != nil {
			return nil, err
		}
	}
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), maxTail)
	for sc.Scan() {
		lines = append(lines, string(bytes.TrimRight(sc.Bytes(), "\r")))
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return lines, sc.Err()
}

func (b *Broker) removeDir() {
	if os.Getenv(EnvKeepBroker) == "1" {
		fmt.Fprintf(os.Stderr, "testbroker: %s=1, keeping %s\n", EnvKeepBroker, b.dir)
		return
	}
	if err := os.RemoveAll(b.dir); err != nil {
		fmt.Fprintf(os.Stderr, "testbroker: remove %s: %v\n", b.dir, err)
	}
}

func (b *Broker) addr() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.addrLocked()
}

func (b *Broker) addrLocked() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))
}

func (b *Broker) logf(format string, args ...any) {
	if !b.quiet {
		fmt.Fprintf(os.Stderr, "testbroker: "+format+"\n", args...)
	}
}

// setParentDeathSignal asks the kernel to send SIGTERM to the server's
// wrapper script if the test binary dies without calling Stop (panic, go
// test -timeout, ^C); the wrapper traps SIGTERM and stops the node, so no
// orphaned brokers pile up. SysProcAttr.Pdeathsig exists only on Linux (and
// FreeBSD), hence reflection: the package still compiles elsewhere, where
// the field is simply not set.
func setParentDeathSignal(attr *syscall.SysProcAttr) {
	f := reflect.ValueOf(attr).Elem().FieldByName("Pdeathsig")
	if f.IsValid() && f.CanSet() && f.Type() == reflect.TypeOf(syscall.SIGTERM) {
		f.Set(reflect.ValueOf(syscall.SIGTERM))
	}
}

func randomHex(n int) string {
	buf := make([]byte, n)
	_, _ = rand.Read(buf)
	return hex.EncodeToString(buf)
}

// randomCookie returns a 32-letter Erlang cookie.
func randomCookie() string {
	const letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	buf := make([]byte, 32)
	_, _ = rand.Read(buf)
	for i, c := range buf {
		buf[i] = letters[int(c)%len(letters)]
	}
	return string(buf)
}
