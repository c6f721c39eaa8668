package main_test

import (
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/internal/waitfor"
)

// startConsole starts `hopper dlq console` on one queue's DLQ.
func startConsole(t *testing.T, args ...string) *proc {
	t.Helper()
	base := []string{"dlq", "console", "--queue", queueName(t), "--broker-url", rabbit.URL(), "--sample-every", "1h", "--scan-on-start=false"}
	cmd := exec.Command(hopperBin, append(base, args...)...)
	cmd.Env = cleanEnv()
	p := &proc{t: t, cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stderr, p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		if !p.exited() {
			cmd.Process.Kill() //nolint:errcheck // the process we started
			<-p.done
		}
		if t.Failed() {
			t.Logf("hopper output:\n%s", p.stderr.String())
		}
	})
	return p
}

var consoleURL = regexp.MustCompile(`listening on http://[^ ]*:(\d+)/`)

// started waits for the console to listen or exit, and returns the
// loopback URL it answers on ("" when it exited).
func (p *proc) started() string {
	p.t.Helper()
	var port string
	waitfor.Until(p.t, 30*time.Second, "the console to listen or exit", func() bool {
		if m := consoleURL.FindStringSubmatch(p.stderr.String()); m != nil {
			port = m[1]
			return true
		}
		return p.exited()
	})
	if port == "" {
		return ""
	}
	return "http://127.0.0.1:" + port + "/"
}

// get calls the console's API as its page does, with the token if given
// and, if given, a Host header of another name.
func get(t *testing.T, url, token string, host ...string) int {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(host) > 0 {
		req.Host = host[0]
	}
	req.Header.Set("Hopper-Console", "1")
	if token != "" {
		req.Header.Set("X-Hopper-Token", token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// TestConsoleListenBeyondLoopback: on an address that is not loopback the
// Host check cannot keep a web page from reaching the console through a
// DNS name of its own, so the console refuses to start there unless every
// call needs a token (--reads-need-token) or the operator says the address
// is meant to be open for reading (--allow-remote-read).
func TestConsoleListenBeyondLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0"} {
		p := startConsole(t, "--listen", addr)
		if url := p.started(); url != "" {
			t.Fatalf("--listen %s without a token for reads: the console started on %s", addr, url)
		}
		out := p.stderr.String()
		if code := p.wait(10 * time.Second); code != 64 || !strings.Contains(out, "not a loopback address") || !strings.Contains(out, "--reads-need-token") || !strings.Contains(out, "--allow-remote-read") {
			t.Errorf("--listen %s: exit %d, want 64 naming both flags:\n%s", addr, code, out)
		}
	}

	// On loopback nothing more is needed, and a Host that is not a
	// loopback name (a DNS name pointed at 127.0.0.1) is refused.
	p := startConsole(t, "--listen", "127.0.0.1:0")
	url := p.started()
	if url == "" || get(t, url+"api/overview", "") != http.StatusOK {
		t.Fatalf("--listen 127.0.0.1:0: started at %q", url)
	}
	if code := get(t, url+"api/overview", "", "rebound.example:8089"); code != http.StatusForbidden {
		t.Errorf("loopback console, Host rebound.example: %d, want 403", code)
	}

	// The operator means it: the console starts, reads need no token.
	p = startConsole(t, "--listen", "0.0.0.0:0", "--allow-remote-read")
	url = p.started()
	if url == "" {
		t.Fatalf("--allow-remote-read: the console did not start")
	}
	if code := get(t, url+"api/overview", ""); code != http.StatusOK {
		t.Errorf("--allow-remote-read: overview %d, want 200", code)
	}

	// Every call needs the token, which is generated and printed once.
	p = startConsole(t, "--listen", "0.0.0.0:0", "--reads-need-token")
	if url = p.started(); url == "" {
		t.Fatalf("--reads-need-token: the console did not start")
	}
	m := regexp.MustCompile(`token \(shown once\): (\S+)`).FindStringSubmatch(p.stderr.String())
	if m == nil {
		t.Fatalf("--reads-need-token: no token printed")
	}
	for _, tok := range []string{"", m[1] + "x"} {
		if code := get(t, url+"api/overview", tok); code != http.StatusUnauthorized {
			t.Errorf("--reads-need-token: overview with token %q: %d, want 401", tok, code)
		}
	}
	if code := get(t, url+"api/overview", m[1]); code != http.StatusOK {
		t.Errorf("--reads-need-token: overview with the token: %d, want 200", code)
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(30 * time.Second); code != 0 {
		t.Errorf("SIGTERM: exit %d, want 0", code)
	}
}
