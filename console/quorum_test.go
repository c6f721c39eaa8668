package console_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/console"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/dlqconn"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
)

// rotations is the console's broker, counting the passes it opened that
// rotate the DLQ (each message copied to the tail, the original acked).
type rotations struct {
	*dlqconn.Opener
	n atomic.Int64
}

func (r *rotations) count(p dlq.Pass, err error) (dlq.Pass, error) {
	if err == nil && p.Rotate != nil {
		r.n.Add(1)
	}
	return p, err
}

func (r *rotations) Browse(ctx context.Context, queue string) (dlq.Pass, error) {
	return r.count(r.Opener.Browse(ctx, queue))
}

func (r *rotations) BrowseInPlace(ctx context.Context, queue string) (dlq.Pass, error) {
	return r.count(r.Opener.BrowseInPlace(ctx, queue))
}

// refusal makes a request and returns its status and error text.
func (e *env) refusal(method, path string, hdr map[string]string) (int, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, nil)
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
	raw, _ := io.ReadAll(res.Body)
	var body struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(raw, &body) // a success has no error to show
	return res.StatusCode, body.Error
}

// overview is the first DLQ of the overview.
func (e *env) overview() map[string]any {
	e.t.Helper()
	var ov struct {
		DLQs []map[string]any `json:"dlqs"`
	}
	e.call("GET", "/api/overview", nil, nil, &ov)
	return ov.DLQs[0]
}

// TestLiveQuorumReadOnlyReadsNothing: reading a quorum DLQ rotates every
// message, so a read-only console never reads one: not at start, not when
// asked for a scan or a message, token or not. The overview says why.
func TestLiveQuorumReadOnlyReadsNothing(t *testing.T) {
	e := newEnv(t, true)
	ids := e.fill(threeKinds)
	b := &rotations{Opener: &dlqconn.Opener{Opts: e.opts, ConfirmTimeout: 10 * time.Second}}
	e.start(false, func(o *console.Options) { o.Broker, o.ScanOnStart = b, true })

	var ov map[string]any
	waitfor.Until(t, time.Minute, "the scan at start to end", func() bool {
		ov = e.overview()
		scan, _ := ov["scan"].(map[string]any)
		return scan != nil && scan["state"] != console.StateRunning
	})
	scan := ov["scan"].(map[string]any)
	why, _ := scan["error"].(string)
	if scan["state"] != console.StateFailed || ov["scanned"] != float64(0) || ov["readRotates"] != true || !strings.Contains(why, "quorum") || !strings.Contains(why, "--allow-actions") {
		t.Errorf("a read-only console's scan of a quorum DLQ at start: %v; want it refused, saying why", ov)
	}
	for _, r := range []struct{ method, path string }{{"POST", e.path("/scan")}, {"GET", e.path("/message?id=val-1")}} {
		for _, hdr := range []map[string]string{nil, withToken} {
			code, why := e.refusal(r.method, r.path, hdr)
			if code != http.StatusForbidden || !strings.Contains(why, "quorum") || !strings.Contains(why, "--allow-actions") {
				t.Errorf("%s %s on a read-only console (token: %v): %d %q; want 403 saying why", r.method, r.path, hdr != nil, code, why)
			}
		}
	}
	if n := b.n.Load(); n != 0 {
		t.Errorf("a read-only console rotated the quorum DLQ %d time(s)", n)
	}
	if got := e.contents(e.DLQ); !slices.Equal(got, sorted(ids["svc"], ids["val"], ids["exp"])) {
		t.Fatalf("DLQ = %v, want every message", got)
	}
}

// TestLiveQuorumReadNeedsTheToken: with actions allowed a scan or a message
// view of a quorum DLQ is an action, refused without the token (401) and
// made with it; a group's message list reads only the last scan and needs
// none. A classic DLQ is read without the token (see
// TestLiveScanGroupsAndShowsMessageReadOnly).
func TestLiveQuorumReadNeedsTheToken(t *testing.T) {
	e := newEnv(t, true)
	ids := e.fill(threeKinds)
	b := &rotations{Opener: &dlqconn.Opener{Opts: e.opts, ConfirmTimeout: 10 * time.Second}}
	e.start(true, func(o *console.Options) { o.Broker = b })

	for _, r := range []struct{ method, path string }{{"POST", e.path("/scan")}, {"GET", e.path("/message?id=val-1")}} {
		for _, hdr := range []map[string]string{nil, {console.TokenHeader: secret + "x"}} {
			code, why := e.refusal(r.method, r.path, hdr)
			if code != http.StatusUnauthorized || !strings.Contains(why, "quorum") || !strings.Contains(why, console.TokenHeader) {
				t.Errorf("%s %s without the token: %d %q; want 401 saying why", r.method, r.path, code, why)
			}
		}
	}
	if n := b.n.Load(); n != 0 {
		t.Fatalf("reads without the token rotated the quorum DLQ %d time(s)", n)
	}

	page := e.scan()
	if page.Scanned != 9 {
		t.Fatalf("scan with the token: %d scanned, want 9", page.Scanned)
	}
	if code := e.call("GET", e.path("/groups/"+page.Groups[1].ID+"/messages"), nil, nil, nil); code != http.StatusOK {
		t.Errorf("a group's message list without the token: %d, want 200", code)
	}
	var m console.MessageView
	if code := e.call("GET", e.path("/message?id=val-1"), nil, withToken, &m); code != http.StatusOK || m.ID != "val-1" {
		t.Fatalf("message view with the token: %d %q", code, m.ID)
	}
	if n := b.n.Load(); n != 2 {
		t.Errorf("%d rotating passes for a scan and a message view, want 2", n)
	}
	if got := e.contents(e.DLQ); !slices.Equal(got, sorted(ids["svc"], ids["val"], ids["exp"])) {
		t.Fatalf("DLQ = %v, want every message", got)
	}
}
