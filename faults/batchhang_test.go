package faults

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// hangEvery is how often a message of the batch-hang scenario hangs on
// its first attempt: one in hangEvery.
const hangEvery = 80

// TestFaultBatchOneHangs: a healthy app, batches of 32, app.timeout 1s,
// and one message in 80 that hangs (3s) on its first attempt only. A
// batch that times out sends each of its messages again alone, all at
// once, more than Hopper has connections: they wait for one, and Hopper
// having no free connection is never taken for the app being down. The
// breaker stays closed, every message is acked, and the drain costs about
// one timeout per hanging message: it is set beside the same run without
// batching.
func TestFaultBatchOneHangs(t *testing.T) {
	n := flowSize(t, 1000, 4000)
	// The prefetch and workers Hopper picks, as a new user gets them (the
	// suite pins a prefetch of its own otherwise).
	batched, a := batchHangRun(t, "batch-hang", n, "consumer:\n  prefetch: 0\n  batch: {maxMessages: 32}\n")
	single, _ := batchHangRun(t, "batch-hang-single", n, "consumer:\n  prefetch: 0\n")
	line := fmt.Sprintf("batch-hang: n=%d hanging=%d batched %.2fs, single %.2fs, ratio=%.2f",
		n, (n+hangEvery-1)/hangEvery, batched.Seconds(), single.Seconds(), batched.Seconds()/single.Seconds())
	fmt.Println(line)
	t.Log(line)
	if a.byReason["max-attempts"]+a.byReason["non-retriable"] > 0 {
		t.Errorf("DLQ by reason %v, want none: every message succeeds on its second attempt at the latest", a.byReason)
	}
}

// batchHangRun drains n prefilled messages, one in hangEvery hanging on
// its first attempt, through hopper with extra config, and returns how
// long it took until every message was answered 2xx. The breaker must not
// open: the app is healthy all along.
func batchHangRun(t *testing.T, name string, n int, extra string) (time.Duration, *accounting) {
	t.Helper()
	ids := makeIDs(name, n)
	scripts := make(map[string]*script, n)
	want := make(map[string]bool, n)
	for i, id := range ids {
		s := &script{final: answer2xx, want: expectAck}
		if i%hangEvery == hangEvery/2 {
			s.fails = []behavior{answerHang}
		}
		scripts[id], want[id] = s, true
	}
	app := startApp(t, scripts)
	url := app.URL()
	if strings.Contains(extra, "batch:") {
		url = app.BatchURL()
	}
	cfg := hopperConfig{Extra: fmt.Sprintf("app:\n  url: %q\n  timeout: 1s\n%s", url, extra)}
	var ps publishStats
	r := beginPrefilled(t, name, app, cfg, func(q string) { ps = publishAll(t, q, ids) })
	took := r.waitAcked(want, r.began, 3*time.Minute)
	r.step("%d messages acked in %s", n, took.Round(time.Millisecond))
	done := make(chan publishStats, 1)
	done <- ps
	a := r.finish(done)
	a.report(t)
	checkScripts(t, a, scripts)
	ev := r.hopper.eventCounts("BREAKER_OPEN", "BATCH_SPLIT")
	t.Logf("hopper events %v", ev)
	if ev["BREAKER_OPEN"] > 0 {
		t.Errorf("the breaker opened %d time(s) on a healthy app with one message in %d hanging", ev["BREAKER_OPEN"], hangEvery)
	}
	return took, a
}
