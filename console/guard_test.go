package console_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hopper-sidecar/hopper/console"
	"github.com/hopper-sidecar/hopper/dlq"
)

// fakeBroker opens nothing: it counts the passes asked for, which a
// refused request must never reach.
type fakeBroker struct {
	opened atomic.Int64
}

func (b *fakeBroker) Depth(context.Context, string) (int, error) { return 3, nil }

func (b *fakeBroker) Browse(context.Context, string) (dlq.Pass, error) {
	b.opened.Add(1)
	return dlq.Pass{}, errors.New("no broker")
}

func (b *fakeBroker) BrowseInPlace(context.Context, string) (dlq.Pass, error) {
	b.opened.Add(1)
	return dlq.Pass{}, errors.New("no broker")
}

func (b *fakeBroker) Own(context.Context, string, int, int) (dlq.Pass, error) {
	b.opened.Add(1)
	return dlq.Pass{}, errors.New("no broker")
}

func (b *fakeBroker) Originals(context.Context, string) (string, error) {
	b.opened.Add(1)
	return "", errors.New("no broker")
}

func (b *fakeBroker) CheckTarget(context.Context, string, string) error {
	b.opened.Add(1)
	return errors.New("no broker")
}

func (b *fakeBroker) Marks(_ context.Context, q string) (dlq.Marks, error) {
	m, _ := dlq.LatestMarks(q, nil)
	return m, nil
}

func (b *fakeBroker) ChangeMarks(context.Context, string, string, func(*dlq.Marks)) (dlq.Marks, error) {
	b.opened.Add(1)
	return dlq.Marks{}, errors.New("no broker")
}

// request sends one request to h as a browser on localhost:8089 would,
// with the headers given.
func request(h http.Handler, method, target string, hdr map[string]string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, target, nil)
	req.Host = "localhost:8089"
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	h.ServeHTTP(rec, req)
	return rec
}

func with(base map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// TestAPIRefusesOtherSites: every API call, GET included, is refused
// unless it carries the console page's header and nothing shows another
// site or origin sent it; a refused call opens nothing on the broker. An
// <img src> of another site's page (a GET with no custom header) is
// refused before the message view reads the DLQ.
func TestAPIRefusesOtherSites(t *testing.T) {
	b := &fakeBroker{}
	c, err := console.New(console.Options{DLQs: []console.DLQ{{Name: "q.dlq"}}, Broker: b, LoopbackOnly: true, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h := c.Handler()
	page := map[string]string{console.APIHeader: "1"}

	for _, hdr := range []map[string]string{
		page,
		with(page, "Sec-Fetch-Site", "same-origin"),
		with(page, "Sec-Fetch-Site", "none"),
		with(page, "Origin", "http://localhost:8089"),
	} {
		if rec := request(h, "GET", "/api/overview", hdr); rec.Code != http.StatusOK {
			t.Errorf("the page's own call %v: %d %s", hdr, rec.Code, rec.Body)
		}
	}

	refused := []struct {
		name string
		hdr  map[string]string
		want string
	}{
		{"no header (an <img src>, a link, a form)", nil, console.APIHeader},
		{"the header with another value", map[string]string{console.APIHeader: "yes"}, console.APIHeader},
		{"cross-site", with(page, "Sec-Fetch-Site", "cross-site"), "cross-site"},
		{"same-site (another port of localhost)", with(page, "Sec-Fetch-Site", "same-site"), "same-site"},
		{"another origin", with(page, "Origin", "http://evil.example"), "evil.example"},
		{"another port", with(page, "Origin", "http://localhost:3000"), "localhost:3000"},
		{"an opaque origin", with(page, "Origin", "null"), "null"},
		{"an image of another site", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Dest": "image"}, "cross-site"},
	}
	for _, path := range []string{"/api/overview", "/api/dlqs/q.dlq/groups", "/api/dlqs/q.dlq/message?id=m-1", "/api/dlqs/q.dlq/chart.svg", "/api/jobs"} {
		for _, r := range refused {
			rec := request(h, "GET", path, r.hdr)
			if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), r.want) {
				t.Errorf("GET %s, %s: %d %s; want 403 naming %q", path, r.name, rec.Code, strings.TrimSpace(rec.Body.String()), r.want)
			}
		}
	}
	for _, r := range refused {
		if rec := request(h, "POST", "/api/dlqs/q.dlq/scan", r.hdr); rec.Code != http.StatusForbidden {
			t.Errorf("POST scan, %s: %d, want 403", r.name, rec.Code)
		}
	}
	if n := b.opened.Load(); n != 0 {
		t.Errorf("refused requests opened the DLQ %d time(s)", n)
	}

	// The page and its assets are public: a link from anywhere opens it.
	for _, path := range []string{"/", "/assets/app.js"} {
		if rec := request(h, "GET", path, map[string]string{"Sec-Fetch-Site": "cross-site"}); rec.Code != http.StatusOK {
			t.Errorf("GET %s from a link: %d", path, rec.Code)
		}
	}
}

// TestReadsNeedToken: with ReadsNeedToken every API call needs a token,
// checked after the page's own checks; the page and its assets do not.
func TestReadsNeedToken(t *testing.T) {
	const tok = "reads-token-0123456789"
	if _, err := console.New(console.Options{DLQs: []console.DLQ{{Name: "q.dlq"}}, Broker: &fakeBroker{}, ReadsNeedToken: true}); err == nil {
		t.Error("reads behind a token, with no token: accepted")
	}
	b := &fakeBroker{}
	c, err := console.New(console.Options{DLQs: []console.DLQ{{Name: "q.dlq"}}, Broker: b, ReadsNeedToken: true, Tokens: []console.Token{{Label: "viewer", Secret: tok}}, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h := c.Handler()
	page := map[string]string{console.APIHeader: "1"}
	for _, path := range []string{"/api/overview", "/api/jobs", "/api/dlqs/q.dlq/groups", "/api/dlqs/q.dlq/message?id=m-1"} {
		for _, hdr := range []map[string]string{page, with(page, console.TokenHeader, tok+"x")} {
			if rec := request(h, "GET", path, hdr); rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), console.TokenHeader) {
				t.Errorf("GET %s, token %q: %d %s; want 401", path, hdr[console.TokenHeader], rec.Code, rec.Body)
			}
		}
		// Another site's page is refused before its token is looked at.
		if rec := request(h, "GET", path, with(page, console.TokenHeader, tok, "Sec-Fetch-Site", "cross-site")); rec.Code != http.StatusForbidden {
			t.Errorf("GET %s from another site with the token: %d, want 403", path, rec.Code)
		}
	}
	if n := b.opened.Load(); n != 0 {
		t.Errorf("calls without the token opened the DLQ %d time(s)", n)
	}
	rec := request(h, "GET", "/api/overview", with(page, console.TokenHeader, tok))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"tokenNeeded":true`) {
		t.Errorf("overview with the token: %d %s", rec.Code, rec.Body)
	}
	for _, path := range []string{"/", "/assets/app.js"} {
		if rec := request(h, "GET", path, nil); rec.Code != http.StatusOK {
			t.Errorf("GET %s without the token: %d, want 200", path, rec.Code)
		}
	}
}
