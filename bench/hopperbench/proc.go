package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// clockTick is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// procCPU returns the CPU time (user + system) a process has used so far.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return time.Duration(ut+st) * clockTick, nil
}

// procStatusKB reads a "<key>: N kB" line of /proc/<pid>/status (VmHWM is
// the peak resident set size, VmRSS the current one).
func procStatusKB(pid int, key string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			fields := strings.Fields(rest)
			if len(fields) == 0 {
				break
			}
			return strconv.ParseInt(fields[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, key)
}

// anonEvery is how often anonWatch samples.
const anonEvery = 10 * time.Millisecond

// anonWatch samples a process's anonymous resident memory (RssAnon of
// /proc/<pid>/status: its heap, stacks and runtime data, not the pages of
// its binary, which VmHWM counts as well) and keeps the highest sample. A
// peak shorter than anonEvery may be missed; VmHWM never misses one.
type anonWatch struct {
	peak atomic.Int64
	quit chan struct{}
	done chan struct{}
}

func watchAnon(pid int) *anonWatch {
	w := &anonWatch{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(anonEvery)
		defer t.Stop()
		for {
			kb, err := procStatusKB(pid, "RssAnon")
			if err != nil {
				return // the process is gone
			}
			w.peak.Store(max(w.peak.Load(), kb))
			select {
			case <-w.quit:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// stop ends the sampling and returns the highest sample, in KiB.
func (w *anonWatch) stop() int64 {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
	return w.peak.Load()
}

// child is a subprocess of the benchmark (hopper or the raw worker) whose
// output goes to a log file.
type child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
	err     error
}

func startChild(name, logPath string, argv []string, env []string) (*child, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer lf.Close() // the child has its own descriptor
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = env
	// If the benchmark dies, so does the child: never leave a consumer
	// running against a broker that is gone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// stop sends SIGTERM (both consumers then settle what they hold and exit)
// and, after grace, SIGKILL.
func (c *child) stop(grace time.Duration) error {
	select {
	case <-c.exited:
		return fmt.Errorf("%s had already exited: %v (log %s)", c.name, c.err, c.logPath)
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
		if c.err != nil {
			return fmt.Errorf("%s exited with %v (log %s)", c.name, c.err, c.logPath)
		}
		return nil
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.exited
		return fmt.Errorf("%s did not stop within %s; killed (log %s)", c.name, grace, c.logPath)
	}
}

// logTail is the end of a child's log, for error messages.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// machineBusy returns the CPU time all processes of the machine have used
// (every field of the "cpu" line of /proc/stat but idle and iowait), to tell
// how much of a run's window other work on the machine took.
func machineBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var busy int64
	// user nice system idle iowait irq softirq steal [guest guest_nice]
	for i, s := range f[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest time is already in user
			continue
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		busy += v
	}
	return time.Duration(busy) * clockTick, nil
}

// loadAvg is the first three fields of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
