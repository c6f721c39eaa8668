package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/console"
	"github.com/hopper-sidecar/hopper/msg"
)

// consoleResult is one scan of the DLQ console.
type consoleResult struct {
	secs   float64
	hwmKB  int64
	groups int
}

// consoleFailures are the kinds of failure the console's DLQ is filled
// with: each message's error carries its own numbers and ids, which the
// fingerprint masks, so the DLQ holds len(consoleFailures) groups.
var consoleFailures = []struct {
	rk, reason string
	status     int
	err        string
}{
	{"order.created", "max-attempts", 503, "POST /orders/%d: upstream 10.0.%d.7 answered 503 after %dms"},
	{"order.paid", "non-retriable", 422, `{"error":"field amount of order %d must be positive","request":"%08x-4f89-11d3-9a0c-0305e82c%04x"}`},
	{"order.created", "non-retriable", 409, "order %d already exists (shard %d, version %d)"},
	{"order.shipped", "expired", 0, "deadline passed %d ms ago at attempt %d of %d"},
	{"invoice.issued", "max-attempts", 500, "template render failed for tenant t%d: missing field tax_id (line %d, col %d)"},
}

// fillConsole publishes n dead-lettered messages of the consoleFailures.
func fillConsole(pub *broker.Publisher, queue, work string, n int, body []byte) error {
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	next := atomic.Int64{}
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || failed.Load() != nil {
					return
				}
				f := consoleFailures[i%len(consoleFailures)]
				m := &msg.Message{MessageID: "c" + strconv.Itoa(i), ContentType: "application/json", Headers: map[string]any{}, Body: body}
				*m = *msg.DLQCopy(m, msg.Info{Queue: work, RoutingKey: f.rk}, msg.DeadLetter{Status: f.status, Reason: f.reason, Retries: 10,
					Error: fmt.Sprintf(f.err, i, i%251, i%9973), TraceID: fmt.Sprintf("%032x", i), Now: time.Now()})
				if err := pub.Publish(context.Background(), queue, m); err != nil {
					failed.Store(&err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		return fmt.Errorf("fill %s: %w", queue, *p)
	}
	return nil
}

var consoleListening = regexp.MustCompile(`listening on (http://[^ ]+/)`)

// consoleToken is the bench console's token: a quorum DLQ's scan is an
// action, since it rotates the DLQ.
const consoleToken = "dlqbench-console-token-0123456789"

// consoleScan starts `hopper dlq console` on the work queue's DLQ, asks it
// for a scan through its API, polls the scan's progress until it ends and
// reads the process's peak RSS from /proc while it runs.
func consoleScan(o options, url, work, dlqName string) (consoleResult, error) {
	tokens, err := os.CreateTemp("", "dlqbench-console-tokens-")
	if err != nil {
		return consoleResult{}, err
	}
	defer os.Remove(tokens.Name())
	_, err = tokens.WriteString("bench:" + consoleToken + "\n")
	if cerr := tokens.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return consoleResult{}, fmt.Errorf("write the console's token file: %w", err)
	}
	cmd := exec.Command(o.hopperBin, "dlq", "console", "--broker-url", url, "--queue", work, "--listen", "127.0.0.1:0",
		"--allow-actions", "--token-file", tokens.Name(), "--scan-on-start=false", "--sample-every", "1h", "--log-format", "text")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOPPER_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return consoleResult{}, err
	}
	if err := cmd.Start(); err != nil {
		return consoleResult{}, err
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // it may have exited
		cmd.Wait()                          //nolint:errcheck // the measurement is taken
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(os.Stderr, "  console:", line)
			if m := consoleListening.FindStringSubmatch(line); m != nil {
				addr <- m[1]
			}
		}
	}()
	var base string
	select {
	case base = <-addr:
	case <-time.After(30 * time.Second):
		return consoleResult{}, fmt.Errorf("hopper dlq console not listening after 30s")
	}
	hwm := watchHWM(cmd.Process.Pid)
	defer hwm.stop()

	res, err := consoleCall("POST", base+"api/dlqs/"+dlqName+"/scan")
	if err != nil {
		return consoleResult{}, fmt.Errorf("start scan: %w", err)
	}
	var job console.JobView
	err = json.NewDecoder(res.Body).Decode(&job)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusAccepted {
		return consoleResult{}, fmt.Errorf("start scan: %d %v", res.StatusCode, err)
	}
	deadline := time.Now().Add(30 * time.Minute)
	last := time.Now()
	for job.State == console.StateRunning {
		if time.Now().After(deadline) {
			return consoleResult{}, fmt.Errorf("scan still running after 30m: %+v", job)
		}
		time.Sleep(100 * time.Millisecond) // polling the scan's progress
		res, err := consoleCall("GET", base+"api/jobs/"+job.ID)
		if err != nil {
			return consoleResult{}, fmt.Errorf("scan progress: %w", err)
		}
		err = json.NewDecoder(res.Body).Decode(&job)
		res.Body.Close()
		if err != nil {
			return consoleResult{}, fmt.Errorf("scan progress: %w", err)
		}
		if time.Since(last) >= 5*time.Second {
			last = time.Now()
			logf("  scan %d/%d", job.Taken, job.Total)
		}
	}
	if job.State != console.StateDone || job.Done != o.n {
		return consoleResult{}, fmt.Errorf("scan ended %s with %d of %d indexed: %s %s", job.State, job.Done, o.n, job.Summary, job.Error)
	}
	var page struct {
		Groups []console.Group `json:"groups"`
	}
	if res, err := consoleCall("GET", base+"api/dlqs/"+dlqName+"/groups"); err == nil {
		json.NewDecoder(res.Body).Decode(&page) //nolint:errcheck // the group count is informational
		res.Body.Close()
	}
	return consoleResult{secs: job.Finished.Sub(job.Started).Seconds(), hwmKB: hwm.peak(), groups: len(page.Groups)}, nil
}

// consoleCall calls the console's API as its page does, with the token.
func consoleCall(method, url string) (*http.Response, error) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(console.APIHeader, "1")
	req.Header.Set(console.TokenHeader, consoleToken)
	return http.DefaultClient.Do(req)
}
