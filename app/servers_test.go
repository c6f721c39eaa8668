package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/app"
	"github.com/hopper-sidecar/hopper/msg"
)

// The app servers Hopper's requests must pass, each started from the test
// on 127.0.0.1 with a port of the system's choosing. Each prints the port,
// then one JSON line per request it accepted: how many headers it got and
// the value of Hopper-Headers-Omitted. A request it refuses (431) prints
// nothing.

// pythonServer is Python's standard http.server, which refuses more than
// 100 request headers.
const pythonServer = `
import http.server, json, sys

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        print(json.dumps({"headers": len(self.headers), "omitted": self.headers.get("Hopper-Headers-Omitted", "")}), flush=True)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
`

// nodeServer is Node.js's http server, which refuses a request head over
// 16 KiB.
const nodeServer = `
const http = require("http");
const server = http.createServer((req, res) => {
  req.resume();
  req.on("end", () => {
    console.log(JSON.stringify({headers: req.rawHeaders.length / 2, omitted: req.headers["hopper-headers-omitted"] || ""}));
    res.writeHead(200, {"Content-Length": "0"});
    res.end();
  });
});
server.listen(0, "127.0.0.1", () => console.log(String(server.address().port)));
`

// seen is what a server printed about one request it accepted.
type seen struct {
	Headers int    `json:"headers"`
	Omitted string `json:"omitted"`
}

// startServer runs interpreter on script and returns the server's URL and
// its request reports. The process ends with the test.
func startServer(t *testing.T, interpreter, script, ext string) (string, <-chan seen) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "server"+ext)
	if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(interpreter, path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", interpreter, err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill() //nolint:errcheck // it may have exited
		cmd.Wait()         //nolint:errcheck // killed
	})
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		t.Fatalf("%s server printed no port: %v", interpreter, lines.Err())
	}
	port, err := strconv.Atoi(strings.TrimSpace(lines.Text()))
	if err != nil {
		t.Fatalf("%s server printed %q, not a port", interpreter, lines.Text())
	}
	reports := make(chan seen, 16)
	go func() {
		for lines.Scan() {
			var s seen
			if json.Unmarshal(lines.Bytes(), &s) == nil {
				reports <- s
			}
		}
	}()
	return "http://127.0.0.1:" + strconv.Itoa(port) + "/messages/{routingKey}", reports
}

// heavyMessages are valid messages whose application headers, all
// forwarded, exceed what common servers accept.
func heavyMessages() map[string]*msg.Message {
	huge := &msg.Message{MessageID: "huge", ContentType: "application/json", Body: []byte("{}"), Headers: map[string]any{}}
	for i, c := range "abcdef" {
		huge.Headers["big-"+string(c)] = strings.Repeat(string(c), 3000+i)
	}
	huge.Headers["small"] = "1"
	huge.Headers["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	many := manyHeaders(500, 12)
	many.ContentType = "application/json"
	return map[string]*msg.Message{"500 headers": many, "huge values": huge}
}

// deliverAll sends every heavy message through a Client to url and
// checks that the server accepted each within the default bounds and was
// told what was left out.
func deliverAll(t *testing.T, url string, reports <-chan seen) {
	t.Helper()
	c := app.NewClient(app.ClientOptions{URL: url, Timeout: 30 * time.Second, CloudEvents: true})
	for name, m := range heavyMessages() {
		o := c.Deliver(context.Background(), m, msg.Info{Queue: "orders", Exchange: "shop", RoutingKey: "order.created.eu", Attempt: 1})
		if o.Status < 200 || o.Status > 299 {
			t.Errorf("%s: HTTP %d (%s), want 2xx", name, o.Status, o.Error)
			continue
		}
		var s seen
		select {
		case s = <-reports:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: answered %d but the server reported no request", name, o.Status)
		}
		if s.Headers > defaultMaxHeaders {
			t.Errorf("%s: the server got %d headers, want at most %d", name, s.Headers, defaultMaxHeaders)
		}
		if n, err := strconv.Atoi(s.Omitted); err != nil || n < 1 {
			t.Errorf("%s: %s = %q, want the number left out", name, hdrOmitted, s.Omitted)
		}
		t.Logf("%s: accepted with %d headers, %s: %s", name, s.Headers, hdrOmitted, s.Omitted)
	}
}

// TestForwardedHeadersAcceptedByPython: Python's http.server takes every
// heavy message.
func TestForwardedHeadersAcceptedByPython(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed for this test: %v", err)
	}
	url, reports := startServer(t, python, pythonServer, ".py")
	deliverAll(t, url, reports)
}

// TestForwardedHeadersAcceptedByNode: Node.js's http server takes every
// heavy message.
func TestForwardedHeadersAcceptedByNode(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the Node.js server check is skipped (Python's runs)")
	}
	url, reports := startServer(t, node, nodeServer, ".js")
	deliverAll(t, url, reports)
}

// rawServer answers 200 to every request on a plain TCP listener and
// reports each request head as received: its size in bytes (request line
// to the blank line) and its number of header lines.
func rawServer(t *testing.T) (string, <-chan seenHead) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	heads := make(chan seenHead, 16)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				r := bufio.NewReader(conn)
				for {
					var h seenHead
					length := 0
					for first := true; ; first = false {
						line, err := r.ReadString('\n')
						if err != nil {
							return
						}
						h.bytes += len(line)
						if line == "\r\n" {
							break
						}
						if !first {
							h.headers++
						}
						if v, ok := strings.CutPrefix(line, "Content-Length: "); ok {
							length, _ = strconv.Atoi(strings.TrimSpace(v))
						}
					}
					if _, err := io.CopyN(io.Discard, r, int64(length)); err != nil {
						return
					}
					heads <- h
					if _, err := conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String(), heads
}

type seenHead struct{ bytes, headers int }

// TestRequestHeadFillsTheLimits: what the app receives is within the
// limits, counted as the server counts it (request line, Host, User-Agent,
// Content-Type and Content-Length included), and the limits are filled
// rather than guessed at: the head is within one forwarded header of the
// bound that stopped forwarding.
func TestRequestHeadFillsTheLimits(t *testing.T) {
	base, heads := rawServer(t)
	long := strings.Repeat("k", 200)
	cases := []struct {
		name   string
		limits app.Limits
		m      *msg.Message
		check  func(h seenHead) bool
	}{
		{"count bound", app.Limits{}, manyHeaders(500, 12), func(h seenHead) bool {
			return h.headers == defaultMaxHeaders && h.bytes <= defaultMaxHeaderBytes
		}},
		{"byte bound", app.Limits{}, manyHeaders(80, 200), func(h seenHead) bool {
			return h.headers <= defaultMaxHeaders && h.bytes <= defaultMaxHeaderBytes && h.bytes > defaultMaxHeaderBytes-(len("Hopper-Header-h000: \r\n")+200)
		}},
		{"tight limits", app.Limits{MaxHeaders: 60, MaxHeaderBytes: 3000, MaxValueBytes: 100}, manyHeaders(60, 50), func(h seenHead) bool {
			return h.headers <= 60 && h.bytes <= 3000 && h.bytes > 3000-(len("Hopper-Header-h000: \r\n")+50)
		}},
	}
	for _, tc := range cases {
		c := app.NewClient(app.ClientOptions{URL: base + "/m/{routingKey}?q={queue}", Timeout: 30 * time.Second, CloudEvents: true, Limits: tc.limits})
		tc.m.Headers["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		tc.m.Headers["tracestate"] = "vendor=" + long
		tc.m.ContentType = "application/json; charset=utf-8"
		in := msg.Info{Queue: "orders", Exchange: "shop", RoutingKey: "order.created." + long, Attempt: 3}
		if o := c.Deliver(context.Background(), tc.m, in); o.Status != 200 {
			t.Fatalf("%s: %+v", tc.name, o)
		}
		var h seenHead
		select {
		case h = <-heads:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no request reported", tc.name)
		}
		if !tc.check(h) {
			t.Errorf("%s: head of %d bytes with %d headers, limits %+v", tc.name, h.bytes, h.headers, tc.limits)
		}
		t.Logf("%s: head of %d bytes with %d headers", tc.name, h.bytes, h.headers)
	}
}

// TestRequestHeadOwnHeadersAtMost6KiB: with every AMQP property, name and
// routing key at its 255-byte maximum, a tracestate of 512 bytes, a
// first-failure time made up to 512 and CloudEvents on, Hopper's own part
// of the head stays under 6 KiB, so the default bound still leaves room
// for application headers.
func TestRequestHeadOwnHeadersAtMost6KiB(t *testing.T) {
	base, heads := rawServer(t)
	s255 := func(c string) string { return strings.Repeat(c, 255) }
	m := &msg.Message{
		MessageID: s255("i"), CorrelationID: s255("c"), Type: s255("t"), ContentType: s255("x"),
		ContentEncoding: s255("e"), AppID: s255("a"), Timestamp: time.Now(), Body: []byte("{}"),
		Headers: map[string]any{
			"traceparent":              "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tracestate":               "v=" + strings.Repeat("s", 510),
			msg.HeaderFirstFailureTime: strings.Repeat("f", 600),
			"tenant":                   "acme",
		},
	}
	in := msg.Info{Queue: s255("q"), Exchange: s255("x"), RoutingKey: s255("r"), Attempt: 12, Requeues: 3, Deadline: time.Now()}
	c := app.NewClient(app.ClientOptions{URL: base + "/{queue}/{routingKey}", Timeout: 30 * time.Second, CloudEvents: true})
	if o := c.Deliver(context.Background(), m, in); o.Status != 200 {
		t.Fatalf("%+v", o)
	}
	var h seenHead
	select {
	case h = <-heads:
	case <-time.After(30 * time.Second):
		t.Fatal("no request reported")
	}
	// The head holds 26 headers of Hopper's own (14 Hopper-*, 2 trace, 6
	// ce-*, Host, User-Agent, Content-Type, Content-Length) and both
	// application headers (tenant and the first-failure time, which is
	// one too): nothing left out, no Hopper-Headers-Omitted.
	if h.headers != 28 {
		t.Errorf("%d headers, want 28", h.headers)
	}
	apps := len("Hopper-Header-tenant: acme\r\n") + len("Hopper-Header-"+msg.HeaderFirstFailureTime+": \r\n") + 600
	if own := h.bytes - apps; own > 6<<10 || h.bytes > defaultMaxHeaderBytes {
		t.Errorf("head of %d bytes, Hopper's own part %d: want at most 6 KiB", h.bytes, own)
	}
	t.Logf("head of %d bytes with %d headers", h.bytes, h.headers)
}
