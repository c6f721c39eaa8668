// Package batch_test runs the batch handlers docs/batch.md shows (Python,
// Node.js and Go) as the programs they are and checks that each one reads
// the request body Hopper writes in batch mode and answers with a results
// body Hopper reads into one outcome per entry.
package batch_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/retry"
)

// startTimeout bounds a handler's start: an interpreter's first start on a
// busy machine, not a wait for anything in particular.
const startTimeout = time.Minute

// now is the clock the answers are read with (a Retry-After date would be
// measured from it).
var now = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

// entry is one message of a test batch as Hopper writes it: the headers a
// single request would carry, then its body.
func entry(id, attempt, contentType, body string) batch.Entry {
	return batch.Entry{
		ID: id,
		Fields: []batch.Field{
			{Name: "Hopper-Message-Id", Value: id}, {Name: "Hopper-Attempt", Value: attempt},
			{Name: "Hopper-Requeue-Count", Value: "0"}, {Name: "Hopper-Queue", Value: "orders"},
			{Name: "Hopper-Routing-Key", Value: "order.created"}, {Name: "Hopper-Header-Tenant", Value: "acme"},
		},
		ContentType: contentType,
		Body:        []byte(body),
	}
}

func TestPythonHandler(t *testing.T) {
	python := need(t, "python3")
	check(t, start(t, python, filepath.Join("python", "app.py")))
}

func TestNodeHandler(t *testing.T) {
	node := need(t, "node")
	check(t, start(t, node, filepath.Join("node", "app.js")))
}

func TestGoHandler(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "batch-handler")
	if out, err := exec.Command(need(t, "go"), "build", "-o", bin, "./golang").CombinedOutput(); err != nil {
		t.Fatalf("go build ./golang: %v\n%s", err, out)
	}
	check(t, start(t, bin))
}

// need finds a program on PATH. A missing one fails the test rather than
// skipping it: what the README shows must have been run.
func need(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is needed to run the %s batch handler (.ci/run installs it): %v", name, name, err)
	}
	return p
}

// check sends batches written by Hopper's own encoder and reads each
// answer as Hopper does, through the outcome table: a valid order is
// acked, one with qty 0 dead-lettered as non-retriable, and a body that
// is not JSON (sent as data_base64) dead-lettered too, as is a JSON body
// that is not UTF-8, while its neighbour is acked. Message ids that are
// not UTF-8, two differing only there, name their entries as ids that
// are.
func check(t *testing.T, url string) {
	t.Helper()
	got := send(t, url, entry("m-1", "1", "application/json", `{"sku":"A-1","qty":2}`),
		entry("m-2", "3", "application/json; charset=utf-8", `{"sku":"B-7","qty":0}`))
	if want := []string{"ack m-1 200", "dlq m-2 422"}; !slices.Equal(got, want) {
		t.Errorf("two orders: %q, want %q", got, want)
	}
	got = send(t, url, entry("m-3", "1", "text/plain", "qty=5"))
	if want := []string{"dlq m-3 422"}; !slices.Equal(got, want) {
		t.Errorf("a body that is not JSON: %q, want %q", got, want)
	}
	raw := []string{"m-4\xff", "m-4\xfe", "m-4\xff"}
	ids := batch.IDs(len(raw), func(i int) string { return raw[i] })
	got = send(t, url, entry(ids[0], "1", "application/json", `{"sku":"A-1","qty":2}`),
		entry(ids[1], "1", "application/json", `{"sku":"A-1","qty":0}`),
		entry(ids[2], "1", "application/json", `{"sku":"A-1","qty":1}`))
	if want := []string{`ack m-4\xff 200`, `dlq m-4\xfe 422`, `ack m-4\xff#2 200`}; !slices.Equal(got, want) {
		t.Errorf("message ids that are not UTF-8: %q, want %q", got, want)
	}
	got = send(t, url, entry("m-5", "1", "application/json", `{"sku":"A-1","qty":2}`),
		entry("m-6", "1", "application/json", "{\"sku\":\"caf\xe9\",\"qty\":2}"))
	if want := []string{"ack m-5 200", "dlq m-6 422"}; !slices.Equal(got, want) {
		t.Errorf("a JSON body that is not UTF-8 (sent as data_base64): %q, want %q", got, want)
	}
}

// send POSTs one batch as Hopper would and returns, per entry, what
// Hopper makes of the answer: "<action> <id> <status>". An answer Hopper
// could not read fails the test.
func send(t *testing.T, url string, entries ...batch.Entry) []string {
	t.Helper()
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.ID
	}
	body := batch.AppendJSON(nil, entries)
	if !json.Valid(body) {
		t.Fatalf("the envelope is not JSON: %s", body)
	}
	resp, err := http.Post(url, batch.ContentTypeJSON, bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	if resp.StatusCode != http.StatusOK || len(bytes.TrimSpace(answer)) == 0 {
		t.Fatalf("answered %s %q, want 200 with a results body", resp.Status, answer)
	}
	outs, err := batch.Read(retry.Outcome{Kind: retry.Response, Status: resp.StatusCode}, answer, ids, now)
	if err != nil {
		t.Fatalf("Hopper cannot read the answer %s: %v", answer, err)
	}
	p := &retry.Policy{MaxAttempts: 5, Tiers: []time.Duration{time.Second}, Table: retry.DefaultTable(), MaxRequeues: 5, MaxHold: time.Second}
	got := make([]string, len(outs))
	for i, o := range outs {
		d := retry.Decide(p, retry.State{}, o, now, func() float64 { return 0.5 })
		got[i] = fmt.Sprintf("%s %s %d", d.Action, ids[i], o.Status)
		if o.Status >= 400 && o.Error == "" {
			t.Errorf("%s: status %d without an error saying why: %s", ids[i], o.Status, answer)
		}
	}
	return got
}

// start runs a handler on a port of its choosing (PORT=0) and returns its
// URL, read from the "listening on" line it prints. The process is killed
// when the test ends.
func start(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "PORT=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // ours, by its PID; it may have exited already
		<-exited
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out) // keep the pipe drained until exit
		_ = cmd.Wait()
		close(exited)
	}()
	select {
	case line := <-lines:
		addr, ok := strings.CutPrefix(line, "listening on ")
		if !ok {
			t.Fatalf("%s printed %q, want \"listening on <address>\"", name, line)
		}
		return "http://" + addr + "/"
	case <-exited:
		t.Fatalf("%s exited before listening: %s", name, stderr.String())
	case <-time.After(startTimeout):
		t.Fatalf("%s did not print its address within %v", name, startTimeout)
	}
	return ""
}

// TestReadmeShowsTheseHandlers: the code the batch delivery page
// (docs/batch.md) shows is these files' code, word for word, so the handlers the
// tests above run are the ones a reader copies.
func TestReadmeShowsTheseHandlers(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "batch.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "# Batch delivery\n")
	if !ok {
		t.Fatal(`docs/batch.md has no "# Batch delivery" title`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	files := map[string]string{"python": "python/app.py", "js": "node/app.js", "go": "golang/main.go"}
	for lang, file := range files {
		src, err := os.ReadFile(filepath.FromSlash(file))
		if err != nil {
			t.Fatal(err)
		}
		_, block, ok := strings.Cut(section, "\n```"+lang+"\n")
		if !ok {
			t.Errorf("the Batch delivery section shows no %s block (for %s)", lang, file)
			continue
		}
		block, _, _ = strings.Cut(block, "```\n")
		if !strings.Contains(string(src), block) {
			t.Errorf("docs/batch.md's %s block is not a part of %s as it stands:\n%s", lang, file, block)
		}
	}
}
