package app

import (
	"context"
	"sync"
	"time"

	"github.com/hopper-sidecar/hopper/retry"
)

// crashDetector tells, for a request the app cut without answering,
// whether the app died handling it, and whether the message it carried is
// the one to blame. It sits beside the breaker: the breaker decides when
// the app is let be called, the detector what a cut request means.
//
// A crash cuts every request at the app at once. A request that was alone
// at the app when it died is charged a crash; one cut in a crowd cannot be
// told from its neighbours, so each becomes a suspect and is delivered
// again on its own: a suspect holds the app exclusively (waiting for the
// requests in flight to finish and keeping new ones out until it is
// answered), where a message that kills the app is caught alone.
//
// Whether the app died is a question of order: a request cut by the app
// dying is a crash when anything that started after it found the app
// down, even if the app is back (restarted quickly) by the time the cut
// request gets to ask. Requests and health checks are therefore numbered
// in the order they start (seq).
type crashDetector struct {
	health Checker
	// restarted, when set, says whether the app's process ended since
	// Hopper's idle connections to it were opened.
	restarted func() bool
	clock     Clock

	// isolate lets a suspect reach the app alone: every other request
	// holds it shared, a suspect exclusively.
	isolate sync.RWMutex

	mu sync.Mutex
	// seq numbers requests and health checks as they start; downAt is the
	// seq of the latest one that found the app down.
	seq    uint64
	downAt uint64
	// inflight counts requests sent to the app and not yet back. A cut
	// request that comes back with others still in flight was cut in a
	// crowd; crowdedAt is the seq of the latest such return, so a cut of
	// the same crash that comes back last, alone, still knows it had
	// company (the crowd was seen after it was sent).
	inflight  int
	crowdedAt uint64
	// isolating counts suspects waiting for the app or holding it alone.
	isolating int
	// checking is the health check running now, shared by whoever asks
	// while it runs; lastCheck is when the latest one started.
	checking  *healthCheck
	lastCheck time.Time
}

// healthCheck is one run of the health check, shared by everyone who asks
// while it runs: a crash cuts every request in flight at once.
type healthCheck struct {
	seq  uint64 // when it started, on the detector's seq
	done chan struct{}
	err  error
}

// send waits until the request may go to the app (a suspect alone, any
// other beside everything but a suspect) and numbers it. The caller ends
// it with back, then release.
func (d *crashDetector) send(suspect bool) (sent uint64) {
	if suspect {
		d.mu.Lock()
		d.isolating++
		d.mu.Unlock()
		d.isolate.Lock()
	} else {
		d.isolate.RLock()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	d.inflight++
	return d.seq
}

// back counts the request sent at sent out of the ones in flight. For a
// request the app cut it says whether it was cut in a crowd: one crash
// cuts every request at the app at once; the first of them back sees the
// others still in flight and records the crowd, the last one back finds
// that record newer than its own send. A request refused meanwhile counts
// as company too while in flight: a crash wrongly called crowded only
// costs the message a delivery on its own, where a crash wrongly charged
// could send it to the DLQ.
func (d *crashDetector) back(sent uint64, cut bool) (crowded bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cut {
		if d.inflight > 1 {
			d.crowdedAt = max(d.crowdedAt, d.seq)
			crowded = true
		} else {
			crowded = d.crowdedAt >= sent
		}
	}
	d.inflight--
	return crowded
}

// release lets the next request at the app once this one is judged: a
// suspect keeps others out until then.
func (d *crashDetector) release(suspect bool) {
	if !suspect {
		d.isolate.RUnlock()
		return
	}
	d.isolate.Unlock()
	d.mu.Lock()
	d.isolating--
	d.mu.Unlock()
}

// suspectsWaiting counts the suspects waiting for the app or holding it.
func (d *crashDetector) suspectsWaiting() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.isolating
}

// latest is the seq of the latest request or check to start.
func (d *crashDetector) latest() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seq
}

// sawDown records that something which started at seq found the app down:
// a failing health check, or a request whose connection was refused.
func (d *crashDetector) sawDown(seq uint64) {
	d.mu.Lock()
	d.downAt = max(d.downAt, seq)
	d.mu.Unlock()
}

// check runs the health check, or waits for one already running that
// started after after (a seq). A check that began before a request was
// sent cannot say whether the app died with that request.
func (d *crashDetector) check(ctx context.Context, after uint64) error {
	d.mu.Lock()
	hc := d.checking
	if hc == nil || hc.seq <= after {
		d.seq++
		hc = &healthCheck{seq: d.seq, done: make(chan struct{})}
		d.checking = hc
		d.lastCheck = d.clock.Now()
		d.mu.Unlock()
		hc.err = d.health.Check(ctx)
		d.mu.Lock()
		if hc.err != nil {
			d.downAt = max(d.downAt, hc.seq)
		}
		if d.checking == hc {
			d.checking = nil
		}
		d.mu.Unlock()
		close(hc.done)
		return hc.err
	}
	d.mu.Unlock()
	select {
	case <-hc.done:
		return hc.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// claimCheck says whether a health check may be asked for now by failing
// messages: none is running and none started within every. The claim is
// taken here, so concurrent failures ask once.
func (d *crashDetector) claimCheck(every time.Duration) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.clock.Now()
	if d.checking != nil || now.Sub(d.lastCheck) < every {
		return false
	}
	d.lastCheck = now
	return true
}

// cut judges a request sent at sent that the app took and then cut
// without an answer; crowded is what back said of it. It returns the
// outcome as the message's loop is to see it, and whether the app was
// found down (the breaker opens at once).
func (d *crashDetector) cut(ctx context.Context, o retry.Outcome, sent uint64, crowded bool) (retry.Outcome, bool) {
	if down, why := d.diedSince(ctx, sent); down {
		// The app went away while it had the request, and was seen down
		// after it was sent: it died handling it. Alone at the app, the
		// message is charged a crash; with other requests in flight any
		// of them may be the cause, so none is charged and each becomes a
		// suspect, delivered next on its own.
		if crowded {
			o.CrashSuspect = true
			o.Error += "; then " + why + " (other requests were in flight: delivered again on its own)"
		} else {
			o.Crashed = true
			o.Error += "; then " + why
		}
		return o, true
	}
	if crowded {
		// Several requests cut at once and the app up again: a restart
		// quicker than the check, more likely than several messages
		// breaking their connections together. Nobody is charged; each
		// goes back to be delivered on its own, where a message that
		// breaks its connection is caught alone.
		o.CrashSuspect = true
		o.Error += "; cut together with other requests, the app's health check passing (delivered again on its own)"
		return o, false
	}
	// The app took the request alone and broke the connection, and it is
	// up: this message is what failed (a handler that dies on one input, a
	// server write timeout shorter than the handler). It spends an attempt
	// like a timeout; the app is not down.
	o.Kind = retry.Cut
	o.Error += "; the app's health check passes"
	return o, false
}

// diedSince says whether the app was seen down by anything that started
// after sent: a refused request or failed check already recorded, or else
// a health check run now.
func (d *crashDetector) diedSince(ctx context.Context, sent uint64) (bool, string) {
	d.mu.Lock()
	down := d.downAt > sent
	d.mu.Unlock()
	if down {
		return true, "the app was found down (refused connections or a failing health check)"
	}
	if err := d.check(context.WithoutCancel(ctx), sent); err != nil {
		return true, "the health check failed: " + err.Error()
	}
	if d.restarted != nil && d.restarted() {
		return true, "the app closed its idle connections too (its process ended and came back)"
	}
	return false, ""
}
