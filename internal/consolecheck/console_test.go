// Package consolecheck drives the DLQ console in a headless Chromium, as an
// operator would, against the hopper binary and a private RabbitMQ node.
// It is a long suite of its own (make console-check), so that make test
// needs no browser; with CI=true a missing Chromium fails it.
package consolecheck

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/console"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

var node testbroker.Lazy

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

func TestMain(m *testing.M) {
	code := testbroker.RunLazy(m, &node)
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

const secret = "consolecheck-token-0123456789"

// chromium returns the browser to drive. Without one the test is skipped,
// except in CI, where it fails: the suite would otherwise pass proving
// nothing.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no Chromium found (chromium, chromium-browser, google-chrome): run scripts/install-chromium.sh")
	}
	t.Skip("no Chromium found; scripts/install-chromium.sh installs it (with CI=true this fails)")
	return ""
}

// hopper builds the binary once per run.
func hopper(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "hopper-consolecheck-")
		if binErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, "hopper"), "github.com/hopper-sidecar/hopper/cmd/hopper").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, "hopper")
}

var seq atomic.Int64

// env is a config of two subscriptions (a classic and a quorum work
// queue, each with its DLQ) on the package's broker.
type env struct {
	t              *testing.T
	rb             *testbroker.Broker
	opts           broker.Options
	pub            *broker.Publisher
	Orders, Bills  string
	config, tokens string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	rb := node.Get(t)
	n := seq.Add(1)
	e := &env{t: t, rb: rb, Orders: fmt.Sprintf("cc%d.orders", n), Bills: fmt.Sprintf("cc%d.invoices", n)}
	e.opts = broker.Options{URLs: []string{rb.URL()}, ConnectTimeout: 5 * time.Second, Name: "consolecheck " + t.Name()}
	e.pub = broker.NewPublisher(broker.PublisherOptions{Options: e.opts, Channels: 8, ConfirmTimeout: 10 * time.Second})
	t.Cleanup(func() { e.pub.Close() })
	dir := t.TempDir()
	e.config = filepath.Join(dir, "hopper.yaml")
	cfg := fmt.Sprintf("subscriptions:\n  - queue: {name: %s}\n  - queue: {name: %s, type: quorum}\n", e.Orders, e.Bills)
	e.tokens = filepath.Join(dir, "tokens")
	if err := os.WriteFile(e.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.tokens, []byte("# operators\noncall:"+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := e.hopperCmd("topology", "apply", "-c", e.config).CombinedOutput(); err != nil {
		t.Fatalf("topology apply: %v\n%s", err, out)
	}
	for q, want := range map[string]broker.QueueType{e.Orders + ".dlq": broker.Classic, e.Bills + ".dlq": broker.Quorum} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		got, err := broker.QueueTypeOf(ctx, e.opts, q)
		cancel()
		if err != nil || got != want {
			t.Fatalf("%s: type %q (%v), want %q", q, got, err, want)
		}
	}
	return e
}

func (e *env) hopperCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(hopper(e.t), append(args, "--broker-url", e.rb.URL())...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOPPER_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	return cmd
}

// failure is one kind of failure.
type failure struct {
	prefix, rk, reason string
	status, n          int
	err                string // %d: the message's number
}

var threeKinds = []failure{
	{"svc", "order.created", "max-attempts", 503, 4, "upstream 10.0.0.%d answered 503"},
	{"val", "order.paid", "non-retriable", 422, 3, "field amount of order %d: must be positive"},
	{"exp", "order.created", "expired", 0, 2, "deadline passed at 2026-11-25T03:0%d:00Z"},
}

// fill publishes the failures to queue's DLQ, interleaved; it returns the
// ids by prefix.
func (e *env) fill(queue string, kinds []failure, body func(id string) []byte, extra func(m *msg.Message)) map[string][]string {
	e.t.Helper()
	out := map[string][]string{}
	for i := 0; ; i++ {
		more := false
		for _, k := range kinds {
			if i >= k.n {
				continue
			}
			more = true
			id := k.prefix + "-" + strconv.Itoa(i)
			b := []byte(`{"id":"` + id + `"}`)
			if body != nil {
				b = body(id)
			}
			m := &msg.Message{MessageID: id, ContentType: "application/json", Headers: map[string]any{}, Body: b}
			errText := k.err
			if strings.Contains(errText, "%d") {
				errText = fmt.Sprintf(errText, i+1)
			}
			*m = *msg.DLQCopy(m, msg.Info{Queue: queue, RoutingKey: k.rk, Retries: 3}, msg.DeadLetter{Status: k.status, Reason: k.reason, Retries: 3, Error: errText, Now: time.Now()})
			if extra != nil {
				extra(m)
			}
			if err := e.pub.Publish(context.Background(), queue+".dlq", m); err != nil {
				e.t.Fatal(err)
			}
			out[k.prefix] = append(out[k.prefix], id)
		}
		if !more {
			return out
		}
	}
}

// contents reads a queue's messages and hands them back; ids sorted.
func (e *env) contents(queue string) []string {
	e.t.Helper()
	var out []string
	for _, m := range e.messages(queue) {
		out = append(out, m.MessageID)
	}
	slices.Sort(out)
	return out
}

// messages reads a queue's messages, in order, and hands them back.
func (e *env) messages(queue string) []*msg.Message {
	e.t.Helper()
	waitfor.Until(e.t, 30*time.Second, queue+" to have no unacked messages", func() bool {
		_, unacked, err := e.rb.QueueCounts(queue)
		return err == nil && unacked == 0
	})
	in, err := broker.OpenInspector(context.Background(), e.opts)
	if err != nil {
		e.t.Fatal(err)
	}
	defer in.Close()
	var out []*msg.Message
	for {
		d, ok, err := in.Get(queue)
		if err != nil {
			e.t.Fatal(err)
		}
		if !ok {
			break
		}
		out = append(out, d.Message())
	}
	return out
}

func sorted(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	slices.Sort(out)
	return out
}

// proc is a running hopper dlq console.
type proc struct {
	cmd *exec.Cmd
	URL string
	mu  sync.Mutex
	log bytes.Buffer
	// read is closed once the console's standard error is read to its end.
	read chan struct{}
}

var listening = regexp.MustCompile(`listening on (http://[^ ]+/)`)

// startConsole runs the console binary and waits for its address.
func (e *env) startConsole(extra ...string) *proc {
	e.t.Helper()
	args := append([]string{"dlq", "console", "-c", e.config, "--listen", "127.0.0.1:0", "--allow-actions", "--token-file", e.tokens, "--rate", "0", "--sample-every", "1s", "--log-format", "text"}, extra...)
	p := &proc{cmd: e.hopperCmd(args...), read: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // it may have exited already
			p.cmd.Wait()                          //nolint:errcheck // its exit status is not what the test checks
		}
		if e.t.Failed() {
			e.t.Logf("console log:\n%s", p.logText())
		}
	})
	urls := make(chan string, 1)
	go func() {
		defer close(p.read)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.log.WriteString(line + "\n")
			p.mu.Unlock()
			if m := listening.FindStringSubmatch(line); m != nil {
				urls <- m[1]
			}
		}
		close(urls)
	}()
	select {
	case u, ok := <-urls:
		if !ok {
			e.t.Fatalf("console exited before listening:\n%s", p.logText())
		}
		p.URL = strings.Replace(u, "127.0.0.1", "localhost", 1)
	case <-time.After(30 * time.Second):
		e.t.Fatalf("console not listening after 30s:\n%s", p.logText())
	}
	return p
}

// stop ends the console as an operator would (SIGTERM) and waits for it
// to exit, its log read to the end.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.read:
	case <-time.After(30 * time.Second):
		t.Fatalf("console still running 30s after SIGTERM:\n%s", p.logText())
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("console exit: %v\n%s", err, p.logText())
	}
}

func (p *proc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// api calls the console's API with the token.
func (p *proc) api(t *testing.T, method, path string, body any, out any) int {
	t.Helper()
	code, raw := p.call(t, method, path, body, true)
	if out != nil && code < 300 {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, raw)
		}
	}
	return code
}

// call makes one API call, with the token or without, and returns the
// status and the answer.
func (p *proc) call(t *testing.T, method, path string, body any, withToken bool) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, p.URL+strings.TrimPrefix(path, "/"), rd)
	if err != nil {
		t.Fatal(err)
	}
	if withToken {
		req.Header.Set(console.TokenHeader, secret)
	}
	req.Header.Set(console.APIHeader, "1")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return res.StatusCode, raw
}

// browser starts a headless Chromium; the context ends with the test.
func browser(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1400, 1000))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelB(); cancelA() })
	// The first run starts the browser, which lives as long as that
	// run's context: no timeout on it, only on the steps after.
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	ctx, cancelT := context.WithTimeout(bctx, timeout)
	t.Cleanup(cancelT)
	return ctx
}

// run runs browser actions and fails the test with what it was doing.
func run(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// texts returns the text of every element a selector matches.
func texts(t *testing.T, ctx context.Context, sel string) []string {
	t.Helper()
	out, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](fmt.Sprintf(`Array.from(document.querySelectorAll(%q)).map(e => e.textContent)`, sel)))
	if err != nil {
		t.Fatalf("read %s: %v", sel, err)
	}
	return out
}

// poll waits for a JavaScript condition on the page: observable state,
// never a fixed sleep.
func poll(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(90*time.Second))
}

func TestConsoleGroupsMessageReplayPurge(t *testing.T) {
	e := newEnv(t)
	ids := e.fill(e.Orders, threeKinds, nil, nil)
	p := e.startConsole()
	ctx := browser(t, 4*time.Minute)
	dlqOrders, dlqBills := e.Orders+".dlq", e.Bills+".dlq"

	// Overview: both subscriptions' DLQs, the classic one scanned.
	run(t, ctx, "overview", chromedp.Navigate(p.URL),
		poll(fmt.Sprintf(`document.querySelectorAll('#dlqs tr[data-dlq]').length === 2 && (document.querySelector('#dlqs tr[data-dlq=%q] .scan')||{}).textContent.includes('9 messages in 3 groups')`, dlqOrders)))
	if got := texts(t, ctx, "#dlqs tr[data-dlq] .dlq-link"); !slices.Equal(got, []string{dlqOrders, dlqBills}) {
		t.Fatalf("overview lists %v", got)
	}
	if d := texts(t, ctx, fmt.Sprintf("#dlqs tr[data-dlq=%q] .depth", dlqOrders)); len(d) != 1 || d[0] != "9" {
		t.Errorf("depth shown %v, want 9", d)
	}
	// The depth chart is inline SVG, with a line once samples exist.
	run(t, ctx, "depth chart", poll(fmt.Sprintf(`(document.querySelector('#dlqs tr[data-dlq=%q] svg.chart polyline')||{getAttribute:()=>''}).getAttribute('points').split(' ').length >= 2`, dlqOrders)))

	// Failure groups: three, with the right counts.
	run(t, ctx, "groups", chromedp.Navigate(p.URL+"#/dlq/"+dlqOrders), poll(`document.querySelectorAll('#groups tr.group').length === 3`))
	if got := texts(t, ctx, "#groups tr.group .count"); !slices.Equal(got, []string{"4", "3", "2"}) {
		t.Fatalf("group counts %v, want [4 3 2]", got)
	}
	if got := texts(t, ctx, "#groups tr.group .reason"); !slices.Equal(got, []string{"max-attempts", "non-retriable", "expired"}) {
		t.Errorf("group reasons %v", got)
	}

	// A group's messages, each a link to its view.
	run(t, ctx, "list a group's messages", chromedp.Click(chromedp.CSS(`#groups tr.group:nth-child(1) button.list`)), poll(`document.querySelectorAll('#groups tr.group:nth-child(1) ul.message-list a').length === 4`))
	if got := texts(t, ctx, "#groups tr.group:nth-child(1) ul.message-list a"); !slices.Equal(got, ids["svc"]) {
		t.Errorf("messages of the first group %v, want %v", got, ids["svc"])
	}

	// A message: its headers.
	run(t, ctx, "open the sample", chromedp.Click(chromedp.CSS(`#groups tr.group:nth-child(2) a.sample`)), poll(`document.querySelectorAll('#headers tr').length > 5`))
	names := texts(t, ctx, "#headers .hname")
	for _, h := range []string{msg.HeaderFinalError, msg.HeaderDeadLetterReason, msg.HeaderOriginalQueue, msg.HeaderFinalStatusCode} {
		if !slices.Contains(names, h) {
			t.Errorf("header %s not shown (shown: %v)", h, names)
		}
	}
	if id := texts(t, ctx, "#message-id"); len(id) != 1 || id[0] != "val-0" {
		t.Errorf("message shown %v, want val-0", id)
	}

	// Replay the second group: exactly its messages move, the bar reaches 100%.
	run(t, ctx, "replay a group", chromedp.Navigate(p.URL+"#/dlq/"+dlqOrders), poll(`document.querySelectorAll('#groups tr.group').length === 3`),
		chromedp.SendKeys(chromedp.CSS("#token"), secret),
		chromedp.Click(chromedp.CSS(`#groups tr.group:nth-child(2) button.replay`)),
		poll(`Array.from(document.querySelectorAll('#jobs .job[data-kind=replay]')).some(j => j.querySelector('.state').textContent === 'done' && j.querySelector('.pct').textContent === '100%' && j.querySelector('progress').value === 100)`))
	if got := e.contents(e.Orders); !slices.Equal(got, sorted(ids["val"])) {
		t.Fatalf("work queue after the replay = %v, want exactly %v", got, ids["val"])
	}
	run(t, ctx, "groups after the replay", poll(`document.querySelectorAll('#groups tr.group').length === 2`))
	if got := e.contents(dlqOrders); !slices.Equal(got, sorted(ids["svc"], ids["exp"])) {
		t.Fatalf("DLQ after the replay = %v", got)
	}

	// Purge: a wrong size purges nothing; the right one purges the group.
	run(t, ctx, "purge with a wrong size",
		chromedp.Click(chromedp.CSS(`#groups tr.group:nth-child(1) button.purge`)),
		chromedp.SendKeys(chromedp.CSS(`#groups tr.group:nth-child(1) input.purge-confirm`), "3"),
		chromedp.Click(chromedp.CSS(`#groups tr.group:nth-child(1) button.purge-go`)),
		poll(`!document.getElementById('error').hidden && document.getElementById('error').textContent.includes('nothing purged')`))
	if got := e.contents(dlqOrders); len(got) != 6 {
		t.Fatalf("a wrongly confirmed purge left %d messages, want 6", len(got))
	}
	run(t, ctx, "purge with the right size",
		chromedp.Click(chromedp.CSS(`#groups tr.group:nth-child(1) button.purge`)),
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#groups tr.group:nth-child(1) input.purge-confirm').value = ''`),
		chromedp.SendKeys(chromedp.CSS(`#groups tr.group:nth-child(1) input.purge-confirm`), "4"),
		chromedp.Click(chromedp.CSS(`#groups tr.group:nth-child(1) button.purge-go`)),
		poll(`Array.from(document.querySelectorAll('#jobs .job[data-kind=purge]')).some(j => j.querySelector('.state').textContent === 'done')`),
		poll(`document.querySelectorAll('#groups tr.group').length === 1`))
	if got := e.contents(dlqOrders); !slices.Equal(got, sorted(ids["exp"])) {
		t.Fatalf("DLQ after the purge = %v, want %v", got, ids["exp"])
	}

	// The activity list names who did what.
	run(t, ctx, "activity", chromedp.Navigate(p.URL+"#/activity"), poll(`document.querySelectorAll('#activity tr[data-job]').length >= 3`))
	who := strings.Join(texts(t, ctx, "#activity .who"), "\n")
	kinds := texts(t, ctx, "#activity .kind")
	if !strings.Contains(who, "oncall from ") || !slices.Contains(kinds, "replay") || !slices.Contains(kinds, "purge") {
		t.Errorf("activity: kinds %v, who %q", kinds, who)
	}
	if !strings.Contains(p.logText(), "console: replay done") {
		t.Errorf("the replay was not logged:\n%s", p.logText())
	}
}

// hostile are payloads that would run script if put into the page as
// markup; each sets window.pwned or the title.
var hostile = []string{
	`<script>window.pwned=1;document.title='pwned'</script>`,
	`<img src=x onerror="window.pwned=2;document.title='pwned'">`,
	`"><svg onload="window.pwned=3;document.title='pwned'">`,
}

func TestConsoleHostileContentIsText(t *testing.T) {
	e := newEnv(t)
	all := strings.Join(hostile, " ")
	kinds := []failure{{"evil", `rk"><img src=x onerror=window.pwned=4>`, "non-retriable", 400, 2, "bad input " + all}}
	e.fill(e.Bills, kinds, func(string) []byte { return []byte(all) }, func(m *msg.Message) {
		m.Headers["x-note"] = hostile[2]
		m.Headers[hostile[1]] = "header named with markup"
	})
	p := e.startConsole()
	ctx := browser(t, 3*time.Minute)
	dlqBills := e.Bills + ".dlq"

	run(t, ctx, "groups of the quorum DLQ", chromedp.Navigate(p.URL+"#/dlq/"+dlqBills), poll(`document.querySelectorAll('#groups tr.group').length === 1`))
	if fp := texts(t, ctx, "#groups tr.group .fp"); len(fp) != 1 || !strings.Contains(fp[0], `<img src=x onerror=`) {
		t.Errorf("fingerprint not shown as text: %v", fp)
	}
	// Opening a message of a quorum DLQ rotates it: an action, which the
	// page says needs the token until it is typed.
	run(t, ctx, "open the hostile message without the token", chromedp.Click(chromedp.CSS(`#groups tr.group a.sample`)), poll(`document.getElementById('load-error') !== null`))
	if why := texts(t, ctx, "#load-error"); len(why) != 1 || !strings.Contains(why[0], "quorum") || !strings.Contains(why[0], "token") {
		t.Errorf("message view of a quorum DLQ without the token: %q, want why it is refused", why)
	}
	run(t, ctx, "open the hostile message with the token", chromedp.SendKeys(chromedp.CSS("#token"), secret), chromedp.Click(chromedp.CSS("#retry")),
		poll(`document.querySelectorAll('#headers tr').length > 5`))
	pwned, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.pwned === undefined`))
	if err != nil {
		t.Fatal(err)
	}
	title, err := chromedp.Run(ctx, chromedp.Title())
	if err != nil {
		t.Fatal(err)
	}
	if !pwned || title != "Hopper DLQ console" {
		t.Fatalf("hostile content ran: window.pwned set = %v, title %q", !pwned, title)
	}
	body := texts(t, ctx, "#body")
	if len(body) != 1 || body[0] != all {
		t.Errorf("body shown as %q, want the text %q", body, all)
	}
	vals := strings.Join(texts(t, ctx, "#headers .hvalue"), "\n")
	names := strings.Join(texts(t, ctx, "#headers .hname"), "\n")
	if !strings.Contains(vals, hostile[2]) || !strings.Contains(names, hostile[1]) {
		t.Errorf("hostile header not shown as text:\nnames %s\nvalues %s", names, vals)
	}
	injected, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('main script, main img[src=x], main svg, #groups img').length`))
	if err != nil {
		t.Fatal(err)
	}
	if injected != 0 {
		t.Fatalf("%d elements from the payloads in the page", injected)
	}
	// The quorum DLQ kept both messages through the scan and the views.
	if got := e.contents(dlqBills); len(got) != 2 {
		t.Fatalf("quorum DLQ holds %d messages, want 2", len(got))
	}
}

func TestConsoleSIGKILLDuringReplayLosesNothing(t *testing.T) {
	for _, quorum := range []bool{false, true} {
		t.Run(map[bool]string{false: "classic", true: "quorum"}[quorum], func(t *testing.T) { sigkillDuringReplay(t, quorum, false) })
	}
}

// TestConsoleSIGKILLDuringTransformLosesNothing: the same kill in the
// middle of a transformation that keeps the originals.
func TestConsoleSIGKILLDuringTransformLosesNothing(t *testing.T) {
	for _, quorum := range []bool{false, true} {
		t.Run(map[bool]string{false: "classic", true: "quorum"}[quorum], func(t *testing.T) { sigkillDuringReplay(t, quorum, true) })
	}
}

// sigkillDuringReplay kills the console mid-replay (or mid-transformation)
// of one group of the classic (orders) or quorum (invoices) DLQ and
// accounts for every id.
func sigkillDuringReplay(t *testing.T, quorum, transform bool) {
	e := newEnv(t)
	work := e.Orders
	if quorum {
		work = e.Bills
	}
	const n, others = 3000, 200
	var want []string
	kinds := []failure{
		{"move", "order.created", "max-attempts", 503, n, "upstream answered 503"},
		{"stay", "order.paid", "non-retriable", 422, others, "validation failed"},
	}
	ids := e.fill(work, kinds, nil, nil)
	want = sorted(ids["move"], ids["stay"])
	p := e.startConsole()
	var groups struct {
		Groups []console.Group `json:"groups"`
	}
	waitfor.Until(t, time.Minute, "the scan at start", func() bool {
		p.api(t, "GET", "api/dlqs/"+work+".dlq/groups", nil, &groups)
		return len(groups.Groups) == 2
	})
	var job console.JobView
	action, req := "replay", map[string]any{"group": groups.Groups[0].ID, "rate": 500}
	if transform {
		action = "transform"
		req["patch"] = []map[string]any{{"op": "add", "path": "/body/fixed", "value": true}}
		req["keepOriginals"] = true
	}
	if code := p.api(t, "POST", "api/dlqs/"+work+".dlq/"+action, req, &job); code != http.StatusAccepted {
		t.Fatalf("%s: %d\n%s", action, code, p.logText())
	}
	waitfor.Until(t, time.Minute, "the replay to move some messages", func() bool {
		var j console.JobView
		p.api(t, "GET", "api/jobs/"+job.ID, nil, &j)
		return j.Done >= 200
	})
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait() //nolint:errcheck // killed on purpose

	moved, dead := e.contents(work), e.contents(work+".dlq")
	seen := map[string]bool{}
	for _, id := range append(slices.Clone(moved), dead...) {
		seen[id] = true
	}
	var lost []string
	for _, id := range want {
		if !seen[id] {
			lost = append(lost, id)
		}
	}
	if len(lost) > 0 {
		t.Fatalf("%d message(s) lost by a SIGKILL mid-replay: %v", len(lost), lost[:min(10, len(lost))])
	}
	for _, id := range moved {
		if strings.HasPrefix(id, "stay-") {
			t.Fatalf("%s of the other group was replayed", id)
		}
	}
	if transform {
		for _, m := range e.messages(work) {
			if !strings.Contains(string(m.Body), `"fixed":true`) {
				t.Fatalf("%s went unchanged: %s", m.MessageID, m.Body)
			}
		}
		for _, m := range e.messages(work + ".dlq") {
			if strings.Contains(string(m.Body), "fixed") {
				t.Fatalf("%s is back in the DLQ changed: %s", m.MessageID, m.Body)
			}
		}
		// Every message moved has its original kept (a copy kept for one
		// whose move the kill cut short is an extra, never a loss).
		kept := map[string]bool{}
		for _, id := range e.contents(dlq.OriginalsQueue(work + ".dlq")) {
			kept[id] = true
		}
		for _, id := range moved {
			if !kept[id] {
				t.Fatalf("%s was transformed and moved without its original kept", id)
			}
		}
	}
	if len(moved) == 0 || len(moved) == n {
		t.Fatalf("work queue holds %d of %d: the kill did not land mid-replay", len(moved), n)
	}
	t.Logf("killed after %d of %d moved; DLQ holds %d", len(moved), n, len(dead))
}

// TestConsoleShots writes the README's screenshots of the console over a
// seeded DLQ into $CONSOLE_SHOTS (make console-shots); it runs only when
// asked.
func TestConsoleShots(t *testing.T) {
	dir := os.Getenv("CONSOLE_SHOTS")
	if dir == "" {
		t.Skip("CONSOLE_SHOTS names no directory (make console-shots sets it)")
	}
	e := newEnv(t)
	batch := func(round int) {
		e.fill(e.Orders, []failure{
			{fmt.Sprintf("r%d-svc", round), "order.created", "max-attempts", 503, 40 + 10*round, "POST /orders: upstream 10.0.3.%d answered 503 Service Unavailable after 30000ms"},
			{fmt.Sprintf("r%d-val", round), "order.paid", "non-retriable", 422, 12, `{"error":"field amount of order %d must be positive"}`},
			{fmt.Sprintf("r%d-dup", round), "order.created", "non-retriable", 409, 5, "order %d already exists (request 3f2504e0-4f89-11d3-9a0c-0305e82c3301)"},
			{fmt.Sprintf("r%d-exp", round), "order.shipped", "expired", 0, 3, "deadline passed at 2026-11-25T03:0%d:00Z"},
		}, nil, nil)
		e.fill(e.Bills, []failure{{fmt.Sprintf("r%d-inv", round), "invoice.issued", "max-attempts", 500, 6 + round, "template render failed: missing field tax_id"}}, nil, nil)
	}
	batch(0)
	p := e.startConsole("--trace-url", "http://jaeger:16686/trace/{traceId}")
	samples := func() int {
		var ov struct {
			DLQs []console.Overview `json:"dlqs"`
		}
		p.api(t, "GET", "api/overview", nil, &ov)
		return ov.DLQs[0].Samples
	}
	for round := 1; round <= 4; round++ {
		want := samples() + 2
		waitfor.Until(t, time.Minute, "two more depth samples", func() bool { return samples() >= want })
		batch(round)
	}
	want := samples() + 2
	waitfor.Until(t, time.Minute, "the last depth samples", func() bool { return samples() >= want })
	for _, q := range []string{e.Orders, e.Bills} {
		var job console.JobView
		p.api(t, "POST", "api/dlqs/"+q+".dlq/scan", nil, &job)
		waitfor.Until(t, time.Minute, "the rescan of "+q, func() bool {
			var j console.JobView
			p.api(t, "GET", "api/jobs/"+job.ID, nil, &j)
			return j.State == console.StateDone
		})
	}
	ctx := browser(t, 2*time.Minute)
	run(t, ctx, "overview", chromedp.Navigate(p.URL), poll(`document.querySelectorAll('#dlqs tr[data-dlq] svg.chart polyline').length === 2`))
	shot := func(name string) {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: PNG; below, JPEG
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d bytes)", filepath.Join(dir, name), len(png))
	}
	shot("console-overview.png")
	run(t, ctx, "groups", chromedp.Navigate(p.URL+"#/dlq/"+e.Orders+".dlq"), poll(`document.querySelectorAll('#groups tr.group').length === 4`),
		chromedp.SendKeys(chromedp.CSS("#token"), "token"))
	shot("console-group.png")
}
