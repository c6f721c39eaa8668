package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stderrMu keeps lines from the children and from the demo itself whole
// when they reach standard error together.
var stderrMu sync.Mutex

// logf prints a progress line of the demo itself on standard error, so
// that standard output holds only the summary.
func logf(format string, args ...any) {
	stderrMu.Lock()
	defer stderrMu.Unlock()
	fmt.Fprintf(os.Stderr, "demo    | "+format+"\n", args...)
}

// lineWriter forwards a child's output to standard error line by line with
// a prefix, so the user can tell hopper's log from the app's, and keeps the
// last lines so a failure can show them even with --quiet.
type lineWriter struct {
	prefix string
	quiet  bool

	mu      sync.Mutex
	partial []byte
	tail    []string // last tailLines lines
	all     []string // every line, for scanning (the demo is short)
}

// tailLines is how many lines a failure report shows per process.
const tailLines = 40

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.line(string(bytes.TrimRight(w.partial[:i], "\r")))
		w.partial = w.partial[i+1:]
	}
	return len(p), nil
}

// flush emits a last line without a newline; call it after the process
// has exited.
func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 {
		w.line(string(w.partial))
		w.partial = nil
	}
}

func (w *lineWriter) line(s string) {
	w.all = append(w.all, s)
	w.tail = append(w.tail, s)
	if len(w.tail) > tailLines {
		w.tail = w.tail[1:]
	}
	if !w.quiet {
		stderrMu.Lock()
		fmt.Fprintf(os.Stderr, "%s%s\n", w.prefix, s)
		stderrMu.Unlock()
	}
}

// lines returns a copy of every line so far.
func (w *lineWriter) lines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.all...)
}

// lastLines returns a copy of the last lines.
func (w *lineWriter) lastLines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.tail...)
}

// child is a process the demo started. Only the demo's own children are
// ever signalled, by their PID.
type child struct {
	name string
	cmd  *exec.Cmd
	out  *lineWriter
	done chan struct{} // closed once the process has exited and its output is copied
	err  error         // cmd.Wait's result, valid after done
}

// startChild starts bin with args, its standard output and error both
// forwarded through one lineWriter.
func startChild(name, bin string, args []string, quiet bool) (*child, error) {
	out := &lineWriter{prefix: fmt.Sprintf("%-8s| ", name), quiet: quiet}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = out
	cmd.Stderr = out
	// Its own process group: a ^C in the terminal reaches the demo, which
	// then stops its children in order (hopper before the broker) instead
	// of every process racing to exit at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	dieWithParent(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	c := &child{name: name, cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		out.flush()
		close(c.done)
	}()
	return c, nil
}

// exited reports whether the process has ended.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// exitCode is the process's exit code, or -1 if a signal ended it. Valid
// after done.
func (c *child) exitCode() int {
	return c.cmd.ProcessState.ExitCode()
}

// describeExit says how the process ended, for error messages.
func (c *child) describeExit() string {
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		return ee.ProcessState.String()
	}
	if c.err != nil {
		return c.err.Error()
	}
	return "exit status 0"
}

// stop sends sig and waits up to grace for the process to exit; past it
// the process is killed. It returns the exit code and whether the process
// exited by itself within grace.
func (c *child) stop(sig syscall.Signal, grace time.Duration) (code int, inTime bool) {
	if c.exited() {
		return c.exitCode(), true
	}
	if err := c.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		logf("signal %s: %v", c.name, err)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
		return c.exitCode(), true
	case <-t.C:
	}
	logf("%s did not exit within %v after %v; killing it", c.name, grace, sig)
	if err := c.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		logf("kill %s: %v", c.name, err)
	}
	<-c.done
	return c.exitCode(), false
}

// report is the tail of the process's output, indented, for failures.
func (c *child) report() string {
	lines := c.out.lastLines()
	if len(lines) == 0 {
		return fmt.Sprintf("  (%s printed nothing)", c.name)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "  last %d line(s) of %s:\n", len(lines), c.name)
	for _, l := range lines {
		sb.WriteString("    " + l + "\n")
	}
	return strings.TrimRight(sb.String(), "\n")
}
