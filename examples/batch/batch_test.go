// Package batch_test runs the batch handlers the README shows (Python,
// Node.js and Go) as the programs they are and checks that each one reads
// the request body Hopper sends in batch mode and answers with a results
// body that settles every entry on its own.
package batch_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startTimeout bounds a handler's start: an interpreter's first start on a
// busy machine, not a wait for anything in particular.
const startTimeout = time.Minute

// envelope is a batch as Hopper sends it with app.cloudEvents false: the
// first entry a valid order, the second one whose qty the handlers refuse.
// Each entry carries the headers a single request would have.
const envelope = `{"entries":[
 {"id":"m-1","headers":{"Hopper-Message-Id":"m-1","Hopper-Attempt":"1","Hopper-Requeue-Count":"0",
   "Hopper-Queue":"orders","Hopper-Routing-Key":"order.created","Hopper-Header-Tenant":"acme"},
  "datacontenttype":"application/json","data":{"sku":"A-1","qty":2}},
 {"id":"m-2","headers":{"Hopper-Message-Id":"m-2","Hopper-Attempt":"3","Hopper-Requeue-Count":"1",
   "Hopper-Queue":"orders","Hopper-Routing-Key":"order.created"},
  "datacontenttype":"application/json","data":{"sku":"B-7","qty":0}}
]}`

// notJSON is a batch of one message whose body is not JSON, so it comes
// as data_base64 ("qty=5"): the handlers only take JSON orders.
const notJSON = `{"entries":[{"id":"m-3","headers":{"Hopper-Message-Id":"m-3","Hopper-Attempt":"1",
 "Hopper-Requeue-Count":"0","Hopper-Queue":"orders"},"datacontenttype":"text/plain","data_base64":"cXR5PTU="}]}`

// result is one entry of the Hopper results shape.
type result struct {
	ID     string `json:"id"`
	Status int    `json:"status"`
	Error  string `json:"error"`
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
	if out, err := exec.Command(need(t, "go"), "build", "-o", bin, "./go").CombinedOutput(); err != nil {
		t.Fatalf("go build ./go: %v\n%s", err, out)
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

// check sends both batches and compares every entry's result.
func check(t *testing.T, url string) {
	t.Helper()
	got := post(t, url, envelope)
	if len(got) != 2 {
		t.Fatalf("two entries sent, %d results: %+v", len(got), got)
	}
	if got[0].ID != "m-1" || got[0].Status != http.StatusOK {
		t.Errorf("first result %+v, want m-1 with status 200 (qty 2 is a valid order)", got[0])
	}
	if got[1].ID != "m-2" || got[1].Status != http.StatusUnprocessableEntity || got[1].Error == "" {
		t.Errorf("second result %+v, want m-2 with status 422 and an error (qty 0)", got[1])
	}

	got = post(t, url, notJSON)
	if len(got) != 1 || got[0].ID != "m-3" || got[0].Status != http.StatusUnprocessableEntity {
		t.Errorf("a body sent as data_base64: results %+v, want m-3 with status 422", got)
	}
}

// post sends one batch and decodes the answer strictly: a 2xx whose body
// has the results shape and nothing else.
func post(t *testing.T, url, body string) []result {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("answered %s, want 200 with a results body: %s", resp.Status, data)
	}
	var out struct {
		Results []result `json:"results"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("the answer is not a results body: %v: %s", err, data)
	}
	return out.Results
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

// TestReadmeShowsTheseHandlers: the code the README's "Batch delivery"
// section shows is these files' code, word for word, so the handlers the
// tests above run are the ones a reader copies.
func TestReadmeShowsTheseHandlers(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Batch delivery\n")
	if !ok {
		t.Fatal(`README.md has no "## Batch delivery" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	files := map[string]string{"python": "python/app.py", "js": "node/app.js", "go": "go/main.go"}
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
			t.Errorf("the README's %s block is not a part of %s as it stands:\n%s", lang, file, block)
		}
	}
}
