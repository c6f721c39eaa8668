package sidecar_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
)

// TestUnauthorizedAppPausesConsuming: an app that answers 401 to every
// request of a Hopper that sends a token, for a while (its secret rotated
// without Hopper's), refuses Hopper,
// not the messages. Consuming pauses and says why on /readyz, in a metric
// and a log event; the messages held go back without spending an attempt
// (on a quorum queue by republishing: a nack would spend its delivery
// limit), none reaches the DLQ and none is lost; its health check, which
// passes all along, does not resume anything. Once the app accepts Hopper
// again a probe finds it and every message is delivered, each on its first
// attempt.
func TestUnauthorizedAppPausesConsuming(t *testing.T) {
	for _, queueType := range []string{"classic", "quorum"} {
		t.Run(queueType, func(t *testing.T) {
			var refusing atomic.Bool
			var refusedCalls atomic.Int64
			refusing.Store(true)
			app := newScriptApp(t)
			inner := app.srv.Handler
			app.srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/healthz" {
					return // not authenticated: passes while the app refuses Hopper
				}
				if refusing.Load() {
					refusedCalls.Add(1)
					http.Error(w, "invalid bearer token", http.StatusUnauthorized)
					return
				}
				inner.ServeHTTP(w, r)
			})
			cfg := testConfig(t, app.URL)
			cfg.App.Auth.Token.File = tokenFile(t, "a-token-the-app-stopped-taking")
			cfg.Queue.Type = queueType
			if queueType == "quorum" {
				cfg.Queue.DeliveryLimit = 3
			}
			cfg.App.HealthPath = "/healthz"
			cfg.Admin.Listen = "127.0.0.1:0"
			logs := &lockedBuffer{}
			r := startLogged(t, cfg, slog.New(slog.NewJSONHandler(logs, nil)), nil)

			const n = 30
			for i := range n {
				r.publish(fmt.Sprintf("m-%d", i))
			}
			waitfor.Until(t, 15*time.Second, "/readyz saying the app refuses Hopper's credentials", func() bool {
				code, body := readyz(t, r.sc)
				return code == http.StatusOK && strings.Contains(body, "paused on purpose: app refuses Hopper's credentials (HTTP 401")
			})
			if v := counter(t, r.sc, "hopper_app_credentials_refused"); v != 1 {
				t.Fatalf("hopper_app_credentials_refused %v while refused, want 1", v)
			}
			if v := counter(t, r.sc, "hopper_consumer_paused"); v != 1 {
				t.Fatalf("hopper_consumer_paused %v while refused, want 1", v)
			}
			// The app refuses for a while: at least one probe is refused too.
			waitfor.Until(t, 15*time.Second, "a probe refused", func() bool {
				_, body := readyz(t, r.sc)
				return strings.Contains(body, "probes refused")
			})
			_, body := readyz(t, r.sc)
			t.Logf("/readyz while refused: %s", body)
			// Passive declares: the broker's listed counts of a quorum queue
			// lag behind it.
			dlq, work := depth(t, r, r.sc.Plan().DLQ.Name), depth(t, r, cfg.Queue.Name)
			if dlq != 0 {
				t.Fatalf("%d messages in the DLQ while the app refused Hopper", dlq)
			}
			if work < n-1 {
				t.Fatalf("work queue holds %d messages ready while refused, want all %d (one may be out as a probe)", work, n)
			}
			if c := refusedCalls.Load(); c >= n {
				t.Fatalf("the app was sent %d requests while refusing, want fewer than the %d messages: one per message is draining the queue into refusals", c, n)
			}

			refusing.Store(false)
			waitfor.Until(t, 30*time.Second, "every message delivered", func() bool {
				for i := range n {
					if len(app.callsFor(fmt.Sprintf("m-%d", i))) == 0 {
						return false
					}
				}
				return true
			})
			r.settled(0)
			if dlq, work := depth(t, r, r.sc.Plan().DLQ.Name), depth(t, r, cfg.Queue.Name); dlq != 0 || work != 0 {
				t.Fatalf("after the app accepted Hopper: %d in the DLQ, %d ready in the work queue, want none", dlq, work)
			}
			for i := range n {
				id := fmt.Sprintf("m-%d", i)
				calls := app.callsFor(id)
				if len(calls) != 1 || calls[0].Status != 200 {
					t.Fatalf("%s: answered %v by the app that accepts Hopper again, want one 200", id, app.statuses(id))
				}
				if calls[0].Attempt != 1 {
					t.Errorf("%s delivered as attempt %d: a refusal spent an attempt", id, calls[0].Attempt)
				}
			}
			waitfor.Until(t, 15*time.Second, "/readyz consuming again", func() bool {
				_, body := readyz(t, r.sc)
				return strings.Contains(body, "ready: consuming")
			})
			if v := counter(t, r.sc, "hopper_app_credentials_refused"); v != 0 {
				t.Fatalf("hopper_app_credentials_refused %v after the app accepted Hopper, want 0", v)
			}
			if v := counter(t, r.sc, "hopper_app_credential_refusals_total"); v != 1 {
				t.Fatalf("hopper_app_credential_refusals_total %v, want 1", v)
			}
			out := logs.String()
			if c := strings.Count(out, `"event":"APP_REFUSED_CREDENTIALS"`); c != 1 {
				t.Errorf("APP_REFUSED_CREDENTIALS logged %d times, want once", c)
			}
			if !strings.Contains(out, `"event":"APP_CREDENTIALS_ACCEPTED"`) {
				t.Error("no APP_CREDENTIALS_ACCEPTED logged")
			}
			if strings.Contains(out, "RABBITMQ_MESSAGE_NON_RETRIABLE") {
				t.Error("a message was dead-lettered as non-retriable")
			}
		})
	}
}

// depth is the ready messages of a queue, by a passive declare.
func depth(t *testing.T, r *running, queue string) int {
	t.Helper()
	n, err := r.insp.Depth(queue)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestUnauthorizedUntilTokenFileFixed: Hopper's token file holds the wrong
// token (a Secret mounted from the wrong place). The app refuses every
// request and consuming pauses; when the right token lands in the file,
// Hopper probes at once rather than at the end of its backoff, the app
// takes it, and every message is delivered with the new token.
func TestUnauthorizedUntilTokenFileFixed(t *testing.T) {
	const good = "the-right-token"
	app := newScriptApp(t)
	inner := app.srv.Handler
	app.srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+good {
			http.Error(w, "invalid bearer token", http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	})
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("a-stale-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, app.URL)
	cfg.App.Auth.Token.File = tokenFile
	cfg.Admin.Listen = "127.0.0.1:0"
	logs := &lockedBuffer{}
	r := startLogged(t, cfg, slog.New(slog.NewJSONHandler(logs, nil)), nil)
	const n = 20
	for i := range n {
		r.publish(fmt.Sprintf("m-%d", i))
	}
	waitfor.Until(t, 15*time.Second, "/readyz saying the app refuses Hopper's credentials", func() bool {
		_, body := readyz(t, r.sc)
		return strings.Contains(body, "app refuses Hopper's credentials (HTTP 401") &&
			strings.Contains(body, "or when a credential file changes")
	})
	// As a Secret update lands: a new file in place of the old one.
	tmp := filepath.Join(dir, "token.new")
	if err := os.WriteFile(tmp, []byte(good+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, tokenFile); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 30*time.Second, "every message delivered", func() bool {
		for i := range n {
			if len(app.callsFor(fmt.Sprintf("m-%d", i))) == 0 {
				return false
			}
		}
		return true
	})
	if dlq := depth(t, r, r.sc.Plan().DLQ.Name); dlq != 0 {
		t.Fatalf("%d messages in the DLQ", dlq)
	}
	for i := range n {
		if calls := app.callsFor(fmt.Sprintf("m-%d", i)); len(calls) != 1 || calls[0].Attempt != 1 {
			t.Fatalf("m-%d: calls %+v, want one first attempt", i, calls)
		}
	}
	if !strings.Contains(logs.String(), `"event":"APP_CREDENTIALS_PROBE","trigger":"credential file changed"`) {
		t.Errorf("no probe made because the token file changed; log:\n%s", logs.String())
	}
}

// tokenFile is a token file for app.auth.token.file.
func tokenFile(t *testing.T, token string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestUnauthorizedWithoutCredentials: Hopper sends no credentials, so a
// 401 cannot be about them: it is the message's answer, dead-lettered as
// non-retriable like any other 4xx, and the messages beside it are
// delivered without a pause.
func TestUnauthorizedWithoutCredentials(t *testing.T) {
	app := newScriptApp(t)
	inner := app.srv.Handler
	app.srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Hopper-Message-Id") == "m-401" {
			http.Error(w, "not your account", http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	})
	cfg := testConfig(t, app.URL)
	cfg.Admin.Listen = "127.0.0.1:0"
	logs := &lockedBuffer{}
	r := startLogged(t, cfg, slog.New(slog.NewJSONHandler(logs, nil)), nil)
	r.publish("m-401")
	const n = 10
	for i := range n {
		r.publish(fmt.Sprintf("m-%d", i))
	}
	waitfor.Until(t, 20*time.Second, "every other message delivered", func() bool {
		for i := range n {
			if len(app.callsFor(fmt.Sprintf("m-%d", i))) == 0 {
				return false
			}
		}
		return true
	})
	r.settled(1)
	if strings.Contains(logs.String(), "APP_REFUSED_CREDENTIALS") || counter(t, r.sc, "hopper_app_credential_refusals_total") != 0 {
		t.Error("a 401 paused consuming while Hopper sends no credentials")
	}
	if !strings.Contains(logs.String(), "RABBITMQ_MESSAGE_NON_RETRIABLE") {
		t.Error("the 401'd message was not dead-lettered as non-retriable")
	}
}

// TestUnauthorizedPastMaxRefused: past app.auth.maxRefused /readyz answers
// 503 and the refusal is logged as too long; consuming stays paused with
// nothing dead-lettered, and once the app takes Hopper's token again /readyz
// is 200 and every message is delivered.
func TestUnauthorizedPastMaxRefused(t *testing.T) {
	var refusing atomic.Bool
	refusing.Store(true)
	app := newScriptApp(t)
	inner := app.srv.Handler
	app.srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refusing.Load() {
			http.Error(w, "invalid bearer token", http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	})
	cfg := testConfig(t, app.URL)
	cfg.App.Auth.Token.File = tokenFile(t, "a-token-the-app-stopped-taking")
	cfg.App.Auth.MaxRefused = config.Duration(500 * time.Millisecond)
	cfg.Admin.Listen = "127.0.0.1:0"
	logs := &lockedBuffer{}
	r := startLogged(t, cfg, slog.New(slog.NewJSONHandler(logs, nil)), nil)
	const n = 5
	for i := range n {
		r.publish(fmt.Sprintf("m-%d", i))
	}
	waitfor.Until(t, 20*time.Second, "/readyz 503 past app.auth.maxRefused", func() bool {
		code, body := readyz(t, r.sc)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "refused Hopper's credentials for longer than app.auth.maxRefused (HTTP 401 since")
	})
	waitfor.Until(t, 10*time.Second, "APP_CREDENTIALS_REFUSED_TOO_LONG logged", func() bool {
		return strings.Contains(logs.String(), `"event":"APP_CREDENTIALS_REFUSED_TOO_LONG"`)
	})
	if v := counter(t, r.sc, "hopper_app_credentials_refused"); v != 1 {
		t.Errorf("hopper_app_credentials_refused %v, want 1", v)
	}
	if dlq := depth(t, r, r.sc.Plan().DLQ.Name); dlq != 0 {
		t.Fatalf("%d messages in the DLQ while the app refused Hopper", dlq)
	}
	refusing.Store(false)
	waitfor.Until(t, 30*time.Second, "every message delivered", func() bool {
		for i := range n {
			if len(app.callsFor(fmt.Sprintf("m-%d", i))) == 0 {
				return false
			}
		}
		return true
	})
	waitfor.Until(t, 10*time.Second, "/readyz 200 again", func() bool {
		code, _ := readyz(t, r.sc)
		return code == http.StatusOK
	})
	r.settled(0)
}
