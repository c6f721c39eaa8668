package console_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/console"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/dlqconn"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

var node testbroker.Lazy

func TestMain(m *testing.M) { os.Exit(testbroker.RunLazy(m, &node)) }

var seq atomic.Int64

const secret = "test-token-0123456789abcdef"

// env is a work queue and its DLQ on the package's broker, and a console
// over that DLQ.
type env struct {
	t         *testing.T
	rb        *testbroker.Broker
	opts      broker.Options
	pub       *broker.Publisher
	Work, DLQ string
	srv       *httptest.Server
	console   *console.Server
}

func newEnv(t *testing.T, quorum bool) *env {
	t.Helper()
	rb := node.Get(t)
	e := &env{t: t, rb: rb, Work: fmt.Sprintf("c%d.%s", seq.Add(1), strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-")))}
	e.DLQ = e.Work + ".dlq"
	e.opts = broker.Options{URLs: []string{rb.URL()}, ConnectTimeout: 5 * time.Second, ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond, Name: "test " + t.Name()}
	e.pub = broker.NewPublisher(broker.PublisherOptions{Options: e.opts, Channels: 4, ConfirmTimeout: 10 * time.Second})
	t.Cleanup(func() { e.pub.Close() })
	e.declare(e.Work, "classic")
	if quorum {
		e.declare(e.DLQ, "quorum")
	} else {
		e.declare(e.DLQ, "classic")
	}
	return e
}

func (e *env) declare(name, kind string) {
	e.t.Helper()
	plan := topology.Plan{Work: topology.Queue{Name: name, Role: topology.RoleWork, Args: map[string]any{"x-queue-type": kind}, Owned: true}, Declare: true}
	plan.DLQ = plan.Work
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := broker.Apply(ctx, e.opts, &plan, true); err != nil {
		e.t.Fatal(err)
	}
}

// failure is one kind of failure the DLQ is filled with.
type failure struct {
	prefix, rk, reason string
	status, n          int
	err                string // %d is the message's number
}

// threeKinds are three failure groups of 4, 3 and 2 messages.
var threeKinds = []failure{
	{"svc", "order.created", "max-attempts", 503, 4, "upstream 10.0.0.%d answered 503 Service Unavailable"},
	{"val", "order.paid", "non-retriable", 422, 3, "field amount of order %d: must be positive"},
	{"exp", "order.created", "expired", 0, 2, "deadline passed at 2026-11-25T03:0%d:00Z"},
}

// fill publishes the failures to the DLQ, interleaved, and returns the ids
// of each kind.
func (e *env) fill(kinds []failure) map[string][]string {
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
			m := &msg.Message{MessageID: id, ContentType: "application/json", Headers: map[string]any{}, Body: []byte(`{"id":"` + id + `","amount":-1}`)}
			*m = *msg.DLQCopy(m, msg.Info{Queue: e.Work, RoutingKey: k.rk, Retries: 3}, msg.DeadLetter{Status: k.status, Reason: k.reason, Retries: 3, Error: fmt.Sprintf(k.err, i+1), TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Now: time.Now()})
			if err := e.pub.Publish(context.Background(), e.DLQ, m); err != nil {
				e.t.Fatal(err)
			}
			out[k.prefix] = append(out[k.prefix], id)
		}
		if !more {
			return out
		}
	}
}

// start runs a console over the DLQ; set changes its options.
func (e *env) start(allow bool, set ...func(*console.Options)) {
	e.t.Helper()
	e.use(e.launch(allow, set...))
}

// live is a running console, until stop.
type live struct {
	c    *console.Server
	srv  *httptest.Server
	stop func()
}

// launch runs a console over the DLQ, stopped at the end of the test if
// not before; set changes its options.
func (e *env) launch(allow bool, set ...func(*console.Options)) *live {
	e.t.Helper()
	o := console.Options{
		DLQs:         []console.DLQ{{Name: e.DLQ, Queues: []string{e.Work}}},
		Broker:       &dlqconn.Opener{Opts: e.opts, ConfirmTimeout: 10 * time.Second, Log: slog.New(slog.DiscardHandler)},
		AllowActions: allow,
		TraceURL:     "http://jaeger.example:16686/trace/{traceId}",
		SampleEvery:  100 * time.Millisecond,
		Log:          slog.New(slog.DiscardHandler),
	}
	if allow {
		o.Tokens = []console.Token{{Label: "tester", Secret: secret}}
	}
	for _, f := range set {
		f(&o)
	}
	c, err := console.New(o)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	l := &live{c: c, srv: httptest.NewServer(c.Handler())}
	var once sync.Once
	l.stop = func() {
		once.Do(func() {
			l.srv.Close()
			cancel()
			<-done
		})
	}
	e.t.Cleanup(l.stop)
	return l
}

// use points the env's calls at l.
func (e *env) use(l *live) { e.console, e.srv = l.c, l.srv }

// call makes a request to the console and decodes a JSON answer into out
// (when not nil); it returns the status.
func (e *env) call(method, path string, body any, hdr map[string]string, out any) int {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set(console.APIHeader, "1")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	if out != nil && res.StatusCode < 300 {
		if err := json.Unmarshal(raw, out); err != nil {
			e.t.Fatalf("%s %s: %v\n%s", method, path, err, raw)
		}
	}
	if res.StatusCode >= 300 && out != nil {
		e.t.Logf("%s %s: %d %s", method, path, res.StatusCode, raw)
	}
	return res.StatusCode
}

var withToken = map[string]string{console.TokenHeader: secret}

func (e *env) path(rest string) string { return "/api/dlqs/" + e.DLQ + rest }

type groupsPage struct {
	Scanned int             `json:"scanned"`
	Groups  []console.Group `json:"groups"`
}

// scan rescans the DLQ, with the token, and waits for the new index.
func (e *env) scan() groupsPage {
	e.t.Helper()
	var job console.JobView
	if code := e.call("POST", e.path("/scan"), nil, withToken, &job); code != http.StatusAccepted {
		e.t.Fatalf("scan: %d", code)
	}
	e.waitJob(job.ID, console.StateDone)
	var page groupsPage
	e.call("GET", e.path("/groups"), nil, nil, &page)
	return page
}

// waitJob waits for a job to end, and fails unless it ended in want.
func (e *env) waitJob(id, want string) console.JobView {
	e.t.Helper()
	var j console.JobView
	waitfor.Until(e.t, 2*time.Minute, "job "+id+" to end", func() bool {
		e.call("GET", "/api/jobs/"+id, nil, nil, &j)
		return j.State != console.StateRunning
	})
	if j.State != want {
		e.t.Fatalf("job %s ended %s (%s %s), want %s", id, j.State, j.Summary, j.Error, want)
	}
	return j
}

// waitIdle waits until no scan or action runs on the DLQ (an action ends
// with a rescan).
func (e *env) waitIdle() {
	e.t.Helper()
	waitfor.Until(e.t, 2*time.Minute, "the console to be idle", func() bool {
		var ov struct {
			DLQs []console.Overview `json:"dlqs"`
		}
		e.call("GET", "/api/overview", nil, nil, &ov)
		return ov.DLQs[0].Busy == nil
	})
}

// contents reads every message of a queue and hands them all back; it
// returns their ids, sorted.
func (e *env) contents(queue string) []string {
	e.t.Helper()
	waitfor.Until(e.t, 30*time.Second, queue+" to have no unacked messages", func() bool {
		_, unacked, err := e.rb.QueueCounts(queue)
		return err == nil && unacked == 0
	})
	in, err := broker.OpenInspector(context.Background(), e.opts)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for {
		d, ok, err := in.Get(queue)
		if err != nil {
			e.t.Fatal(err)
		}
		if !ok {
			break
		}
		out = append(out, d.Message().MessageID)
	}
	if err := in.Close(); err != nil {
		e.t.Fatal(err)
	}
	slices.Sort(out)
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

func counts(gs []console.Group) []int {
	out := make([]int, len(gs))
	for i, g := range gs {
		out[i] = g.Count
	}
	return out
}

func TestLiveScanGroupsAndShowsMessageReadOnly(t *testing.T) {
	e := newEnv(t, false)
	ids := e.fill(threeKinds)
	e.start(false)

	page := e.scan()
	if got := counts(page.Groups); !slices.Equal(got, []int{4, 3, 2}) || page.Scanned != 9 {
		t.Fatalf("group counts = %v of %d, want [4 3 2] of 9", got, page.Scanned)
	}
	svc := page.Groups[0]
	if svc.Key.Reason != "max-attempts" || svc.Key.Status != "503" || svc.Key.RoutingKey != "order.created" || svc.Key.Fingerprint != "upstream <n>.<n>.<n>.<n> answered <n> Service Unavailable" {
		t.Errorf("largest group key = %+v", svc.Key)
	}
	if svc.Sample != "svc-0" || svc.Share < 0.44 || svc.Share > 0.45 || svc.First.IsZero() {
		t.Errorf("largest group = %+v", svc)
	}
	if got := e.contents(e.DLQ); !slices.Equal(got, sorted(ids["svc"], ids["val"], ids["exp"])) {
		t.Fatalf("DLQ after a scan = %v; a scan must leave every message", got)
	}

	var list struct {
		Messages []console.Entry `json:"messages"`
		Count    int             `json:"count"`
	}
	e.call("GET", e.path("/groups/"+page.Groups[1].ID+"/messages"), nil, nil, &list)
	if list.Count != 3 || len(list.Messages) != 3 || list.Messages[0].ID != "val-0" {
		t.Errorf("messages of the second group = %+v", list)
	}

	var m console.MessageView
	if code := e.call("GET", e.path("/message?id=val-1"), nil, nil, &m); code != http.StatusOK {
		t.Fatalf("message view: %d", code)
	}
	h := map[string]console.Field{}
	for _, f := range m.Headers {
		h[f.Name] = f
	}
	if h[msg.HeaderFinalError].Value != `"field amount of order 2: must be positive"` && h[msg.HeaderFinalError].Value != "field amount of order 2: must be positive" {
		t.Errorf("x-final-error shown as %q", h[msg.HeaderFinalError].Value)
	}
	if h[msg.HeaderDeadLetterReason].About == "" || h[msg.HeaderFinalStatusCode].Value == "" {
		t.Errorf("Hopper's headers not explained: %+v", h)
	}
	if m.Body.Kind != "json" || !strings.Contains(m.Body.Text, "\n  \"amount\": -1") {
		t.Errorf("body = %+v, want pretty JSON", m.Body)
	}
	if m.TraceURL != "http://jaeger.example:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("trace link = %q", m.TraceURL)
	}
	if m.Group == nil || m.Group.ID != page.Groups[1].ID {
		t.Errorf("message's group = %+v", m.Group)
	}
	var hist []string
	for _, f := range m.History {
		hist = append(hist, f.Name+"="+f.Value)
	}
	if !slices.Contains(hist, "failed attempts=3") || !slices.Contains(hist, "original queue="+e.Work) {
		t.Errorf("history = %v", hist)
	}
	if code := e.call("GET", e.path("/message?id=nope"), nil, nil, nil); code != http.StatusNotFound {
		t.Errorf("missing message: %d, want 404", code)
	}

	// Read-only: every action is refused, token or not.
	if code := e.call("POST", e.path("/replay"), map[string]string{"group": svc.ID}, withToken, nil); code != http.StatusForbidden {
		t.Errorf("replay on a read-only console: %d, want 403", code)
	}
	if code := e.call("POST", e.path("/purge"), map[string]string{"group": svc.ID, "confirm": "4"}, withToken, nil); code != http.StatusForbidden {
		t.Errorf("purge on a read-only console: %d, want 403", code)
	}
	if code := e.call("POST", e.path("/edit"), map[string]string{"message": "svc-0", "body": "{}", "contentType": "application/json"}, withToken, nil); code != http.StatusForbidden {
		t.Errorf("edit on a read-only console: %d, want 403", code)
	}
	if got := e.contents(e.DLQ); len(got) != 9 {
		t.Fatalf("DLQ holds %d messages, want 9", len(got))
	}
}

func TestLiveReplayGroupMovesExactlyThatGroup(t *testing.T) {
	for _, quorum := range []bool{false, true} {
		t.Run(map[bool]string{false: "classic", true: "quorum"}[quorum], func(t *testing.T) {
			e := newEnv(t, quorum)
			ids := e.fill(threeKinds)
			e.start(true)
			page := e.scan()
			val := page.Groups[1]
			if val.Key.Reason != "non-retriable" {
				t.Fatalf("second group = %+v", val.Key)
			}

			// No token, a wrong one, or another site's page: refused.
			if code := e.call("POST", e.path("/replay"), map[string]string{"group": val.ID}, nil, nil); code != http.StatusUnauthorized {
				t.Errorf("replay without token: %d, want 401", code)
			}
			if code := e.call("POST", e.path("/replay"), map[string]string{"group": val.ID}, map[string]string{console.TokenHeader: secret + "x"}, nil); code != http.StatusUnauthorized {
				t.Errorf("replay with a wrong token: %d, want 401", code)
			}
			cross := map[string]string{console.TokenHeader: secret, "Origin": "http://evil.example"}
			if code := e.call("POST", e.path("/replay"), map[string]string{"group": val.ID}, cross, nil); code != http.StatusForbidden {
				t.Errorf("replay from another origin: %d, want 403", code)
			}
			site := map[string]string{console.TokenHeader: secret, "Sec-Fetch-Site": "cross-site"}
			if code := e.call("POST", e.path("/replay"), map[string]string{"group": val.ID}, site, nil); code != http.StatusForbidden {
				t.Errorf("replay from another site: %d, want 403", code)
			}
			edit := map[string]string{"message": "val-0", "body": "{}", "contentType": "application/json"}
			if code := e.call("POST", e.path("/edit"), edit, cross, nil); code != http.StatusForbidden {
				t.Errorf("edit from another origin: %d, want 403", code)
			}
			if code := e.call("POST", e.path("/edit"), edit, nil, nil); code != http.StatusUnauthorized {
				t.Errorf("edit without token: %d, want 401", code)
			}
			if got := e.contents(e.Work); len(got) != 0 {
				t.Fatalf("refused replays and edits moved %v", got)
			}

			var job console.JobView
			if code := e.call("POST", e.path("/replay"), map[string]any{"group": val.ID, "rate": 50}, withToken, &job); code != http.StatusAccepted {
				t.Fatalf("replay: %d", code)
			}
			done := e.waitJob(job.ID, console.StateDone)
			if done.Percent != 100 || done.Done != 3 || !strings.HasPrefix(done.Who, "tester from ") {
				t.Errorf("job = %+v", done)
			}
			e.waitIdle()
			if got := e.contents(e.Work); !slices.Equal(got, sorted(ids["val"])) {
				t.Fatalf("work queue = %v, want exactly the group %v", got, ids["val"])
			}
			if got := e.contents(e.DLQ); !slices.Equal(got, sorted(ids["svc"], ids["exp"])) {
				t.Fatalf("DLQ = %v, want the other groups", got)
			}
			var after groupsPage
			e.call("GET", e.path("/groups"), nil, nil, &after)
			if got := counts(after.Groups); !slices.Equal(got, []int{4, 2}) {
				t.Errorf("groups after the replay = %v, want [4 2]", got)
			}
		})
	}
}

func TestLivePurgeNeedsTheGroupSizeTyped(t *testing.T) {
	e := newEnv(t, false)
	ids := e.fill(threeKinds)
	e.start(true)
	page := e.scan()
	svc := page.Groups[0]
	for _, typed := range []string{"", "3", "5", "four", "yes"} {
		if code := e.call("POST", e.path("/purge"), map[string]string{"group": svc.ID, "confirm": typed}, withToken, nil); code != http.StatusBadRequest {
			t.Errorf("purge confirmed with %q: %d, want 400", typed, code)
		}
	}
	if got := e.contents(e.DLQ); len(got) != 9 {
		t.Fatalf("unconfirmed purges left %d messages, want 9", len(got))
	}
	var job console.JobView
	if code := e.call("POST", e.path("/purge"), map[string]string{"group": svc.ID, "confirm": "4"}, withToken, &job); code != http.StatusAccepted {
		t.Fatalf("purge: %d", code)
	}
	if j := e.waitJob(job.ID, console.StateDone); j.Done != 4 {
		t.Errorf("purged %d, want 4", j.Done)
	}
	e.waitIdle()
	if got := e.contents(e.DLQ); !slices.Equal(got, sorted(ids["val"], ids["exp"])) {
		t.Fatalf("DLQ after the purge = %v, want the other groups", got)
	}
}

func TestLiveExportGroupAsNDJSON(t *testing.T) {
	e := newEnv(t, true)
	ids := e.fill(threeKinds)
	e.start(true)
	page := e.scan()
	exp := page.Groups[2]

	b, _ := json.Marshal(map[string]string{"group": exp.ID})
	req, _ := http.NewRequest("POST", e.srv.URL+e.path("/export"), bytes.NewReader(b))
	req.Header.Set(console.TokenHeader, secret)
	req.Header.Set(console.APIHeader, "1")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(res.Header.Get("Content-Disposition"), "attachment") {
		t.Fatalf("export: %d %v", res.StatusCode, res.Header)
	}
	var got []string
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		m, err := dlq.UnmarshalLine(sc.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if m.String(msg.HeaderDeadLetterReason) != "expired" {
			t.Errorf("exported %s of reason %q", m.MessageID, m.String(msg.HeaderDeadLetterReason))
		}
		got = append(got, m.MessageID)
	}
	slices.Sort(got)
	if !slices.Equal(got, sorted(ids["exp"])) {
		t.Fatalf("exported %v, want %v", got, ids["exp"])
	}
	e.waitIdle()
	if all := e.contents(e.DLQ); len(all) != 9 {
		t.Fatalf("DLQ holds %d after an export, want 9", len(all))
	}
}

func TestSecurityHeadersAndHost(t *testing.T) {
	c, err := console.New(console.Options{DLQs: []console.DLQ{{Name: "q.dlq"}}, Broker: &dlqconn.Opener{}, LoopbackOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	h := c.Handler()
	for _, path := range []string{"/", "/assets/app.js", "/api/overview"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", path, nil)
		req.Host = "127.0.0.1:8080"
		req.Header.Set(console.APIHeader, "1")
		h.ServeHTTP(rec, req)
		hd := rec.Header()
		if rec.Code != http.StatusOK || !strings.Contains(hd.Get("Content-Security-Policy"), "default-src 'self'") || hd.Get("X-Frame-Options") != "DENY" || hd.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: %d %v", path, rec.Code, hd)
		}
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/api/overview", nil)
	req.Host = "rebound.evil.example:8080"
	req.Header.Set(console.APIHeader, "1")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "not a loopback name") {
		t.Errorf("a non-loopback Host: %d, want 403", rec.Code)
	}
	rec = httptest.NewRecorder()
	req = httptest.NewRequest("GET", "/", nil)
	req.Host = "localhost:8080"
	h.ServeHTTP(rec, req)
	if body := rec.Body.String(); strings.Contains(body, "<script>") || !strings.Contains(body, `src="/assets/app.js"`) {
		t.Errorf("page has inline script or no app: %s", body)
	}
	if _, err := console.New(console.Options{DLQs: []console.DLQ{{Name: "q"}}, Broker: &dlqconn.Opener{}, AllowActions: true}); err == nil {
		t.Error("actions without a token accepted")
	}
	if _, err := console.New(console.Options{DLQs: []console.DLQ{{Name: "q"}}, Broker: &dlqconn.Opener{}, TraceURL: "javascript:alert({traceId})"}); err == nil {
		t.Error("a javascript: trace URL accepted")
	}
}

func TestLiveReplayCancelled(t *testing.T) {
	e := newEnv(t, false)
	ids := e.fill([]failure{{"slow", "order.created", "max-attempts", 503, 60, "upstream answered 503 after %dms"}})
	e.start(true)
	page := e.scan()
	var job console.JobView
	if code := e.call("POST", e.path("/replay"), map[string]any{"group": page.Groups[0].ID, "rate": 10}, withToken, &job); code != http.StatusAccepted {
		t.Fatalf("replay: %d", code)
	}
	waitfor.Until(t, time.Minute, "the replay to move a few messages", func() bool {
		var j console.JobView
		e.call("GET", "/api/jobs/"+job.ID, nil, nil, &j)
		return j.Done >= 2 && j.ETA != ""
	})
	if code := e.call("POST", "/api/jobs/"+job.ID+"/cancel", nil, nil, nil); code != http.StatusUnauthorized {
		t.Errorf("cancel without the token: %d, want 401", code)
	}
	if code := e.call("POST", "/api/jobs/"+job.ID+"/cancel", nil, withToken, nil); code != http.StatusOK {
		t.Fatalf("cancel: %d", code)
	}
	j := e.waitJob(job.ID, console.StateCancelled)
	e.waitIdle()
	work, dead := e.contents(e.Work), e.contents(e.DLQ)
	if len(work) != j.Done || len(work) >= 60 || len(work)+len(dead) != 60 {
		t.Fatalf("cancelled after %d: work queue %d, DLQ %d; want the %d moved and the rest kept", j.Done, len(work), len(dead), j.Done)
	}
	if got := sorted(work, dead); !slices.Equal(got, sorted(ids["slow"])) {
		t.Fatalf("messages after the cancel = %v", got)
	}
}

// A quorum DLQ under a delivery-limit policy of 2 read by the console four
// times over (a scan, the message view, each with the token, as reading a
// quorum DLQ is an action): every read rotates, so every
// message is still there afterwards and none has a return counted. (On
// RabbitMQ 4.x a console that took the quorum DLQ for a classic one
// returned what it read and lost every message by the third look.)
func TestLiveQuorumDLQUnderDeliveryLimitKeepsEveryMessage(t *testing.T) {
	e := newEnv(t, true)
	policy := "dl-" + e.DLQ
	if out, err := e.rb.Ctl("set_policy", "--apply-to", "queues", policy, "^"+regexp.QuoteMeta(e.DLQ)+"$", `{"delivery-limit":2}`); err != nil {
		t.Fatalf("set_policy: %v\n%s", err, out)
	}
	t.Cleanup(func() { e.rb.Ctl("clear_policy", policy) }) //nolint:errcheck // the node is private to the test run
	ids := e.fill(threeKinds)
	e.start(true)
	for round := range 4 {
		page := e.scan()
		if page.Scanned != 9 {
			t.Fatalf("round %d: scanned %d, want 9", round, page.Scanned)
		}
		var m console.MessageView
		if code := e.call("GET", e.path("/message?id=val-1"), nil, withToken, &m); code != http.StatusOK {
			t.Fatalf("round %d: message view: %d", round, code)
		}
	}
	if got := e.contents(e.DLQ); !slices.Equal(got, sorted(ids["svc"], ids["val"], ids["exp"])) {
		t.Fatalf("DLQ after four looks = %v, want every message", got)
	}
}
