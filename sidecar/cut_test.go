package sidecar_test

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/msg"
)

// TestCutWhileHealthy: the app resets the connection for one message (its
// handler dies on that input) while its health check keeps passing. With
// one message at a time, that message used to come back without limit,
// opening the breaker again and again, and the messages behind it were
// never delivered. Now each cut spends an attempt: the message ends in the
// DLQ after its attempt budget, every message behind it is acked, and the
// breaker never opens. On classic and quorum queues.
func TestCutWhileHealthy(t *testing.T) {
	for _, qt := range []string{"classic", "quorum"} {
		t.Run(qt, func(t *testing.T) {
			app := newScriptApp(t)
			cfg := testConfig(t, app.URL)
			cfg.Queue.Type = qt
			cfg.Consumer.Prefetch = 1
			cfg.Consumer.Workers = 1
			cfg.Breaker.Failures = 2
			cfg.Admin.Listen = "127.0.0.1:0"
			app.script("pill", statusReset)
			r := start(t, cfg)
			r.publish("pill")
			behind := make([]string, 20)
			for i := range behind {
				behind[i] = fmt.Sprintf("behind-%d", i)
				r.publish(behind[i])
			}
			r.settled(1)

			if got := app.attempts("pill"); len(got) != int(cfg.Retry.MaxAttempts) {
				t.Errorf("pill delivered at attempts %v, want each of 1..%d once", got, cfg.Retry.MaxAttempts)
			}
			for _, id := range behind {
				if st := app.statuses(id); len(st) != 1 || st[0] != 200 {
					t.Errorf("%s: statuses %v, want one 200", id, st)
				}
			}
			dlq := r.drain(r.sc.Plan().DLQ.Name)
			pill, ok := dlq["pill"]
			if !ok || len(dlq) != 1 {
				t.Fatalf("DLQ holds %d messages (pill there: %v), want the pill alone", len(dlq), ok)
			}
			if reason := pill.String(msg.HeaderDeadLetterReason); reason != "max-attempts" {
				t.Errorf("pill dead-lettered as %q, want max-attempts", reason)
			}
			if n, _ := pill.Int(msg.HeaderFinalRetryCount); int(n) != int(cfg.Retry.MaxAttempts) {
				t.Errorf("x-final-retry-count %d, want %d", n, cfg.Retry.MaxAttempts)
			}
			if e := pill.String(msg.HeaderFinalError); !strings.Contains(e, "health check passes") {
				t.Errorf("x-final-error %q does not say the app stayed healthy", e)
			}
			if opens := metric(t, r.sc.AdminAddr(), "hopper_breaker_opens_total"); opens != "0" {
				t.Errorf("the breaker opened %s times on a message cutting its connection", opens)
			}
			if st := r.sc.Stats(); st.Returned.Load() != 0 {
				t.Errorf("%d messages returned to the queue; a cut while healthy is no return", st.Returned.Load())
			}
		})
	}
}

// metric reads one unlabelled series from the admin port's /metrics.
func metric(t *testing.T, addr, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			return f[1]
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return ""
}
