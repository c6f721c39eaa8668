package faults

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// hopperConfig is the config file a scenario runs hopper with: short tiers
// and timeouts so that a whole retry cycle takes about a second, and the
// breaker on with a short open period so that app outages open and close it
// many times within a run.
type hopperConfig struct {
	BrokerURLs  []string
	Queue       string
	QueueType   string // classic (default) or quorum
	AppURL      string
	MaxAttempts int
	// Extra is YAML appended to the config: later keys override earlier
	// ones per section, so a scenario can turn the breaker off or pin the
	// workers (e.g. "breaker:\n  enabled: false\n").
	Extra string
}

// faultsPrefetch is the prefetch every scenario runs with: the most
// deliveries a fault can find in flight.
const faultsPrefetch = 50

const hopperConfigTemplate = `# Written by the faults suite.
broker:
  urls: [%s]
  heartbeat: 5s
  connectTimeout: 5s
  reconnectMin: 100ms
  reconnectMax: 1s
  confirmTimeout: 5s
  publishChannels: 8
queue:
  name: %q
  type: %s
topology:
  declare: true
app:
  url: %q
  timeout: 500ms
  healthPath: /healthz
  unavailableBackoff: 100ms
consumer:
  prefetch: %d
retry:
  maxAttempts: %d
  tiers: [200ms, 500ms]
requeue:
  minHold: 20ms
  maxHold: 200ms
breaker:
  enabled: true
  failures: 5
  openTimeout: 500ms
  probeInterval: 100ms
shutdown:
  grace: 5s
admin:
  listen: ""
log:
  level: info
  format: text
`

func (c hopperConfig) write(t *testing.T, path string) {
	t.Helper()
	urls := make([]string, len(c.BrokerURLs))
	for i, u := range c.BrokerURLs {
		urls[i] = strconv.Quote(u)
	}
	typ := c.QueueType
	if typ == "" {
		typ = "classic"
	}
	data := fmt.Sprintf(hopperConfigTemplate, strings.Join(urls, ", "), c.Queue, typ, c.AppURL, faultsPrefetch, c.MaxAttempts)
	if c.Extra != "" {
		data = mergeSections(data, c.Extra)
	}
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// hopperProc is hopper running as a subprocess, so that it can be
// SIGKILLed and started again as a crashing pod would be. Every run appends
// to one log file.
type hopperProc struct {
	t       *testing.T
	bin     string
	cfgPath string
	logPath string

	mu         sync.Mutex
	cmd        *exec.Cmd
	exited     chan struct{}
	exitErr    error
	meantToEnd bool  // the test killed or stopped the current run
	startAt    int64 // log offset where the current run begins
	starts     int
	kills      int
	surprises  []string // runs that ended without the test asking
}

// startHopper writes cfg and starts hopper with it.
func startHopper(t *testing.T, name string, cfg hopperConfig) *hopperProc {
	t.Helper()
	h := &hopperProc{
		t:       t,
		bin:     hopperBinary(t),
		cfgPath: filepath.Join(workDir, name+".yaml"),
		logPath: filepath.Join(workDir, name+".log"),
	}
	cfg.write(t, h.cfgPath)
	h.start()
	t.Cleanup(func() {
		if h.running() {
			h.kill()
		}
	})
	return h
}

// pid is the process id of the current run.
func (h *hopperProc) pid() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cmd.Process.Pid
}

func (h *hopperProc) running() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.exited == nil {
		return false
	}
	select {
	case <-h.exited:
		return false
	default:
		return true
	}
}

// start runs hopper once more with the same config and log file.
func (h *hopperProc) start() {
	h.t.Helper()
	f, err := os.OpenFile(h.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		h.t.Fatal(err)
	}
	defer f.Close() // the child has its own descriptor
	fi, err := f.Stat()
	if err != nil {
		h.t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.starts++
	fmt.Fprintf(f, "==== faults: hopper start #%d at %s\n", h.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(h.bin, "run", "--config", h.cfgPath)
	cmd.Env = hopperEnv()
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	setParentDeathSignal(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		h.t.Fatalf("start hopper: %v", err)
	}
	run, exited := h.starts, make(chan struct{})
	h.cmd, h.exited, h.meantToEnd, h.startAt = cmd, exited, false, fi.Size()
	go func() {
		err := cmd.Wait()
		h.mu.Lock()
		h.exitErr = err
		if !h.meantToEnd {
			h.surprises = append(h.surprises, fmt.Sprintf("hopper run #%d exited on its own: %v", run, err))
		}
		h.mu.Unlock()
		close(exited)
	}()
}

// hopperEnv is the test's environment without any HOPPER_* variable: the
// config file alone must decide (a developer's HOPPER_QUEUE_NAME would
// override it), and the suite's own HOPPER_FAULTS_* are no config keys.
func hopperEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOPPER_") {
			env = append(env, kv)
		}
	}
	return env
}

// kill SIGKILLs hopper and waits until it is gone: nothing gets settled,
// the broker requeues every delivery it held.
func (h *hopperProc) kill() {
	h.mu.Lock()
	cmd, exited := h.cmd, h.exited
	h.meantToEnd = true
	h.kills++
	h.mu.Unlock()
	_ = cmd.Process.Kill()
	<-exited
}

// stop sends SIGTERM and waits for hopper to exit; hopper must exit 0
// within its grace period (5s) and some margin.
func (h *hopperProc) stop() error {
	h.mu.Lock()
	cmd, exited := h.cmd, h.exited
	h.meantToEnd = true
	h.mu.Unlock()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		return errors.New("hopper did not exit within 20s of SIGTERM (grace 5s)")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.exitErr != nil {
		return fmt.Errorf("hopper exit after SIGTERM: %w", h.exitErr)
	}
	return nil
}

// waitEvent waits until the current run has logged event (for example
// CONSUMER_STARTED).
func (h *hopperProc) waitEvent(event string, timeout time.Duration) error {
	h.mu.Lock()
	from := h.startAt
	h.mu.Unlock()
	needle := []byte("event=" + event)
	for end := time.Now().Add(timeout); ; {
		data, err := os.ReadFile(h.logPath)
		if err == nil && int64(len(data)) >= from && bytes.Contains(data[from:], needle) {
			return nil
		}
		if !h.running() {
			return fmt.Errorf("hopper exited before logging %s:\n%s", event, h.logTail(30))
		}
		if time.Now().After(end) {
			return fmt.Errorf("hopper did not log %s within %s:\n%s", event, timeout, h.logTail(30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// eventCounts counts the events of every run so far.
func (h *hopperProc) eventCounts(events ...string) map[string]int {
	data, _ := os.ReadFile(h.logPath)
	out := map[string]int{}
	for _, e := range events {
		out[e] = bytes.Count(data, []byte("event="+e+" ")) + bytes.Count(data, []byte("event="+e+"\n"))
	}
	return out
}

// countLines counts log lines (of every run) that contain all of subs.
func (h *hopperProc) countLines(subs ...string) int {
	data, _ := os.ReadFile(h.logPath)
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

// logProblems returns log lines that must never appear: a panic, a data
// race report, a fatal Go runtime error, or an internal error Hopper
// recovered from (a panic caught at the worker is still a bug).
func (h *hopperProc) logProblems() []string {
	data, _ := os.ReadFile(h.logPath)
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:") ||
			strings.Contains(line, "WARNING: DATA RACE") || strings.Contains(line, "HOPPER_INTERNAL_ERROR") {
			out = append(out, line)
		}
	}
	return out
}

func (h *hopperProc) logTail(n int) string {
	data, _ := os.ReadFile(h.logPath)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// unexpectedExits lists runs that ended without the test asking.
func (h *hopperProc) unexpectedExits() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.surprises...)
}

// mergeSections overlays extra's top-level sections onto base: a key of a
// section in extra replaces the same key in base's section, or is added.
// Both are the flat two-level YAML this suite writes.
func mergeSections(base, extra string) string {
	type section struct {
		name string
		keys []string          // order of keys
		vals map[string]string // key -> whole line
	}
	parse := func(s string) []*section {
		var out []*section
		var cur *section
		for _, line := range strings.Split(s, "\n") {
			switch {
			case strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#"):
			case !strings.HasPrefix(line, " "):
				cur = &section{name: strings.TrimSuffix(strings.TrimSpace(line), ":"), vals: map[string]string{}}
				out = append(out, cur)
			case cur != nil:
				k, _, _ := strings.Cut(strings.TrimSpace(line), ":")
				if _, seen := cur.vals[k]; !seen {
					cur.keys = append(cur.keys, k)
				}
				cur.vals[k] = line
			}
		}
		return out
	}
	secs := parse(base)
	for _, e := range parse(extra) {
		var into *section
		for _, s := range secs {
			if s.name == e.name {
				into = s
			}
		}
		if into == nil {
			secs = append(secs, e)
			continue
		}
		for _, k := range e.keys {
			if _, seen := into.vals[k]; !seen {
				into.keys = append(into.keys, k)
			}
			into.vals[k] = e.vals[k]
		}
	}
	var b strings.Builder
	for _, s := range secs {
		b.WriteString(s.name + ":\n")
		for _, k := range s.keys {
			b.WriteString(s.vals[k] + "\n")
		}
	}
	return b.String()
}
