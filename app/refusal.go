package app

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/internal/backoff"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// RefusalOptions configure a Refusal. Zero values take the defaults named.
type RefusalOptions struct {
	// Gate pauses and resumes consuming, for a reason of the refusal's own
	// (not the breaker's). Required.
	Gate Gate
	// ProbeMin and ProbeMax bound the jittered backoff between probes: the
	// first comes about ProbeMin after the app refused, each refused probe
	// doubles the wait up to ProbeMax. ProbeMin is also how often
	// CredentialsChanged is asked. Defaults 1s and 30s.
	ProbeMin, ProbeMax time.Duration
	// CredentialsChanged, when set, looks at Hopper's credential files
	// again and reports whether one now holds something new (see
	// Auth.Changed): a new token or secret is worth a probe at once rather
	// than at the end of the backoff. Default nil: the backoff alone.
	CredentialsChanged func() bool
	// MaxRefused bounds how long a refusal lasts before Overdue says so
	// (and it is logged once, as APP_CREDENTIALS_REFUSED_TOO_LONG).
	// Probing goes on past it. Default 0: no bound.
	MaxRefused time.Duration
	// Clock defaults to the wall clock.
	Clock  Clock
	Logger *slog.Logger
	// OnChange is told when the app starts refusing Hopper (true) and when
	// it accepts a probe (false).
	OnChange func(refused bool)
}

// Refusal decorates a Deliverer for an app that refuses Hopper itself. An
// answer that the outcome table marks pause (401 by default: the caller's
// credentials are wrong) is about the token, key or secrets Hopper sends,
// and they are the same for every message: a secret rotation gone wrong,
// or a Secret mounted from the wrong place, would otherwise send the whole
// queue to the DLQ one message at a time. Like the app being down, it is
// not the message failing: consuming pauses and nothing is counted
// against a message.
//
// It holds a pause of its own beside the Breaker's rather than being a
// breaker state, because something else ends it. The breaker judges
// whether the app is up: for it a 401 is an answer, so the app is up, and
// its probe, the health check, is usually not authenticated and passes all
// along. Only a request that carries Hopper's credentials can tell whether
// they are taken again, so the probe here is a real delivery: the app
// judges it as any other, and a probe refused again goes back like the
// rest. Each holds the consumer paused for its own reason, and consuming
// resumes once neither does.
//
//	accepted ─(a decision says pause)──────────→ refused: consumer paused; every
//	                                               request is refused without calling
//	                                               the app (given back, no attempt)
//	refused ─(backoff over, or a credential ────→ probing: consumer resumed with
//	          file changed)                        prefetch 1; the next request goes
//	                                               to the app, the others wait for it
//	probing ─(its answer decided on its merits)─→ accepted: full prefetch; the
//	                                               waiting requests go to the app
//	probing ─(refused again, or no answer)──────→ refused; the next probe after a
//	                                               longer wait (up to ProbeMax)
//
// The decision on an answer is the delivery loop's (retry.Decide, under
// each message's own policy), so the loop tells the Refusal what it
// decided (Judged): a config that makes 401 a message outcome never
// pauses. Requests already at the app when the refusal begins come back
// with their own answers and are decided as usual; a 401 among them is
// given back too.
type Refusal struct {
	next  Deliverer
	o     RefusalOptions
	log   *slog.Logger
	clock Clock
	// accepted is true while requests go straight to the app: the path
	// every delivery takes when nothing is wrong costs one atomic load.
	accepted atomic.Bool

	mu    sync.Mutex
	state refusalState
	// probeSent: the probe of this round has gone to the app; answered:
	// it came back with an answer the loop is deciding on, at answeredAt.
	probeSent, answered bool
	answeredAt          time.Time
	// decided is closed when a probe round ends, waking the requests that
	// waited for its verdict.
	decided chan struct{}
	// since and status describe the refusal for /readyz; probes counts
	// the probes refused since; nextProbe is when the next one is due.
	since     time.Time
	status    int
	probes    int
	nextProbe time.Time
	// overdueLogged: this refusal's passing MaxRefused was logged.
	overdueLogged bool

	// start wakes Run when a refusal begins; verdicts carries the end of
	// each probe round to it.
	start    chan struct{}
	verdicts chan verdict
}

type refusalState int

const (
	stateAccepted refusalState = iota
	stateRefused
	stateProbing
)

// verdict is how a probe round ended.
type verdict int

const (
	verdictAccepted verdict = iota
	verdictRefused
	verdictNone // no answer to judge: a timeout, the app away, shutdown
)

// NewRefusal wraps next.
func NewRefusal(next Deliverer, o RefusalOptions) *Refusal {
	if o.ProbeMin <= 0 {
		o.ProbeMin = time.Second
	}
	if o.ProbeMax < o.ProbeMin {
		o.ProbeMax = max(30*time.Second, o.ProbeMin)
	}
	if o.Clock == nil {
		o.Clock = wallClock{}
	}
	r := &Refusal{next: next, o: o, log: o.Logger, clock: o.Clock,
		start: make(chan struct{}, 1), verdicts: make(chan verdict, 1)}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.accepted.Store(true)
	return r
}

// Refusing reports whether the app is refusing Hopper's credentials:
// consuming is paused, or one delivery is out as a probe.
func (r *Refusal) Refusing() bool { return !r.accepted.Load() }

// Overdue reports whether the app has refused Hopper's credentials for
// longer than MaxRefused: /readyz then answers 503, since waiting has not
// fixed it and someone has to (a rollout that brought the wrong Secret
// stops, and the pod shows not ready).
func (r *Refusal) Overdue() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.overdueLocked()
}

func (r *Refusal) overdueLocked() bool {
	return r.o.MaxRefused > 0 && r.state != stateAccepted && r.clock.Now().Sub(r.since) >= r.o.MaxRefused
}

// noteOverdue logs, once per refusal, that it has lasted past MaxRefused.
func (r *Refusal) noteOverdue() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.overdueLocked() || r.overdueLogged {
		return
	}
	r.overdueLogged = true
	r.log.Error("the app has refused Hopper's credentials for longer than app.auth.maxRefused: /readyz answers 503 until a probe is accepted; consuming stays paused and the messages wait in the queue",
		"event", "APP_CREDENTIALS_REFUSED_TOO_LONG", "status", r.status, "refused_for", r.clock.Now().Sub(r.since).String(),
		"max_refused", r.o.MaxRefused.String(), "probes_refused", r.probes)
}

// Describe says, while the app refuses Hopper, since when, with what, and
// what happens next, for /readyz; "" while it accepts.
func (r *Refusal) Describe() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == stateAccepted {
		return ""
	}
	s := fmt.Sprintf("HTTP %d since %s", r.status, r.since.UTC().Format(time.RFC3339))
	if r.probes > 0 {
		s += fmt.Sprintf(", probes refused: %d", r.probes)
	}
	if r.state == stateProbing {
		return s + "; probing: the next delivery goes to the app"
	}
	s += fmt.Sprintf("; next probe in %s", max(r.nextProbe.Sub(r.clock.Now()), 0).Round(100*time.Millisecond))
	if r.o.CredentialsChanged != nil {
		s += ", or when a credential file changes"
	}
	return s
}

// Deliver sends the message unless the app is refusing Hopper: then it
// answers "refused" without calling the app, and the loop gives the
// message back without spending an attempt.
func (r *Refusal) Deliver(ctx context.Context, m *msg.Message, in msg.Info) retry.Outcome {
	if r.accepted.Load() {
		return r.next.Deliver(ctx, m, in)
	}
	probe, out, ok := r.admit(ctx)
	if !ok {
		return out
	}
	if !probe {
		return r.next.Deliver(ctx, m, in)
	}
	defer r.unlessProbed()()
	o := r.next.Deliver(ctx, m, in)
	o.Probe = true
	r.probed(o)
	return o
}

// DeliverBatch is Deliver for a batch request: a batch can be the probe,
// and every entry then carries the mark, since the loop decides on each.
func (r *Refusal) DeliverBatch(ctx context.Context, req *batch.Request) batch.Answer {
	if r.accepted.Load() {
		return r.next.DeliverBatch(ctx, req)
	}
	probe, out, ok := r.admit(ctx)
	if !ok {
		return batch.Classified(batch.Answer{}, out, req.Len())
	}
	if !probe {
		return r.next.DeliverBatch(ctx, req)
	}
	defer r.unlessProbed()()
	a := r.next.DeliverBatch(ctx, req)
	a.Whole.Probe = true
	for i := range a.Entries {
		a.Entries[i].Probe = true
	}
	r.probed(a.Whole)
	return a
}

// unlessProbed returns what the probe's sender defers: a probe request
// that never came back (it panicked, and the worker recovers the panic
// with the message) ends its round without a verdict, or the requests
// waiting in admit would wait for it until shutdown and consuming would
// stay at prefetch 1. A probe that came back is left to probed.
func (r *Refusal) unlessProbed() func() {
	r.mu.Lock()
	round := r.decided
	r.mu.Unlock()
	return func() {
		if p := recover(); p != nil {
			r.mu.Lock()
			if r.state == stateProbing && r.decided == round && !r.answered {
				r.endRoundLocked(verdictNone, retry.Outcome{Error: fmt.Sprintf("the probe request panicked: %v", p)})
			}
			r.mu.Unlock()
			panic(p)
		}
	}
}

// admit says whether a request goes to the app while it is not accepted:
// the first one of a probe round goes as the probe; the others wait for
// its verdict, so that a consumer resumed for the probe does not spin on
// deliveries refused and given back at once.
func (r *Refusal) admit(ctx context.Context) (probe bool, out retry.Outcome, ok bool) {
	for {
		r.mu.Lock()
		switch r.state {
		case stateAccepted:
			r.mu.Unlock()
			return false, out, true
		case stateRefused:
			out = retry.Outcome{Kind: retry.Unavailable, Refused: true,
				Error: fmt.Sprintf("the app refuses Hopper's credentials (HTTP %d); consuming paused until it accepts a probe", r.status)}
			r.mu.Unlock()
			return false, out, false
		}
		if !r.probeSent {
			r.probeSent = true
			r.mu.Unlock()
			return true, out, true
		}
		wait := r.decided
		r.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return false, retry.Outcome{Kind: retry.Unavailable, CutOff: true,
				Error: "request cancelled by shutdown while a probe of the app's credentials was out"}, false
		}
	}
}

// probed is told what came of the probe request. An answer the outcome
// table can judge waits for the loop's decision (Judged); anything else
// (a timeout, the app away, the breaker refusing, shutdown) says nothing
// about the credentials, and the round ends without a verdict.
func (r *Refusal) probed(o retry.Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != stateProbing {
		return
	}
	if o.Kind == retry.Response && o.Status >= 100 && o.Status <= 599 && !o.Given() {
		r.answered, r.answeredAt = true, r.clock.Now()
		return
	}
	r.endRoundLocked(verdictNone, o)
}

// Judged is told, by the delivery loop, the decision on an answer that
// either paused (the app refused Hopper) or was the probe's. The first
// pause starts the refusal; the probe's decision ends the round.
func (r *Refusal) Judged(out retry.Outcome, pause bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case pause && r.state == stateAccepted:
		r.state = stateRefused
		r.accepted.Store(false)
		r.since, r.status, r.probes, r.overdueLogged = r.clock.Now(), out.Status, 0, false
		r.o.Gate.Pause()
		r.log.Warn("the app refuses Hopper's credentials, the same for every message: consuming paused, messages held go back to the queue without spending an attempt; a delivery goes as a probe until one is accepted",
			"event", "APP_REFUSED_CREDENTIALS", "status", out.Status, "error", msg.Truncate(out.Error, msg.MaxErrorLen))
		if r.o.OnChange != nil {
			r.o.OnChange(true)
		}
		select {
		case r.start <- struct{}{}:
		default:
		}
	case out.Probe && r.state == stateProbing && r.answered:
		// answered: this round's probe came back with an answer to judge,
		// so the decision is on it, not on an earlier round's probe.
		v := verdictAccepted
		if pause {
			v = verdictRefused
		}
		r.endRoundLocked(v, out)
	}
}

// endRoundLocked ends a probe round with v: consuming resumes in full
// after an accepted probe, and pauses again otherwise. Requests that
// waited for the verdict go on.
func (r *Refusal) endRoundLocked(v verdict, out retry.Outcome) {
	close(r.decided)
	r.probeSent, r.answered = false, false
	switch v {
	case verdictAccepted:
		refusedFor := r.clock.Now().Sub(r.since)
		r.state = stateAccepted
		r.accepted.Store(true)
		r.o.Gate.Resume(0)
		r.log.Info("the app accepted Hopper's credentials again: consuming resumed",
			"event", "APP_CREDENTIALS_ACCEPTED", "status", out.Status, "refused_for", refusedFor.String(), "probes_refused", r.probes)
		if r.o.OnChange != nil {
			r.o.OnChange(false)
		}
	case verdictRefused:
		r.state = stateRefused
		r.probes++
		r.o.Gate.Pause()
		r.log.Info("the app refused Hopper's credentials again; the probe goes back to the queue",
			"event", "APP_CREDENTIALS_PROBE_REFUSED", "status", out.Status, "probes_refused", r.probes,
			"error", msg.Truncate(out.Error, msg.MaxErrorLen))
	default:
		r.state = stateRefused
		r.o.Gate.Pause()
		r.log.Info("the probe of Hopper's credentials got no answer to judge; probing again",
			"event", "APP_CREDENTIALS_PROBE_UNANSWERED", "error", msg.Truncate(out.Error, msg.MaxErrorLen))
	}
	select {
	case r.verdicts <- v:
	default:
	}
}

// Run probes while the app refuses Hopper, until ctx ends.
func (r *Refusal) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.start:
		}
		r.probeUntilAccepted(ctx)
	}
}

// probeUntilAccepted runs probe rounds, each after a jittered wait that
// doubles from ProbeMin to ProbeMax (at once when a credential file
// changes), until one is accepted.
func (r *Refusal) probeUntilAccepted(ctx context.Context) {
	bo := backoff.Backoff{Min: r.o.ProbeMin, Max: r.o.ProbeMax}
	for {
		trigger, ok := r.waitForProbe(ctx, bo.Next())
		if !ok {
			return
		}
		r.mu.Lock()
		r.state, r.decided = stateProbing, make(chan struct{})
		// Prefetch 1: the broker sends the probe and holds the rest back
		// until its verdict.
		r.o.Gate.Resume(1)
		r.log.Info("probing whether the app accepts Hopper's credentials with the next delivery",
			"event", "APP_CREDENTIALS_PROBE", "trigger", trigger)
		r.mu.Unlock()
		if v, ok := r.waitForVerdict(ctx); !ok || v == verdictAccepted {
			return
		}
	}
}

// waitForProbe waits until a probe is due, looking at the credential
// files every ProbeMin meanwhile. It says what made the probe due.
func (r *Refusal) waitForProbe(ctx context.Context, wait time.Duration) (string, bool) {
	due := r.clock.Now().Add(wait)
	r.mu.Lock()
	r.nextProbe = due
	r.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return "", false
		case <-r.clock.After(min(r.o.ProbeMin, max(due.Sub(r.clock.Now()), 0))):
		}
		r.noteOverdue()
		if r.o.CredentialsChanged != nil && r.o.CredentialsChanged() {
			return "credential file changed", true
		}
		if !r.clock.Now().Before(due) {
			return "backoff", true
		}
	}
}

// waitForVerdict waits for the end of the probe round. A probe whose
// answer came back but whose decision never reached the Refusal (the
// loop failed between the two) ends the round without a verdict after a
// further ProbeMin, so requests never wait on it for ever.
func (r *Refusal) waitForVerdict(ctx context.Context) (verdict, bool) {
	for {
		select {
		case <-ctx.Done():
			return verdictNone, false
		case v := <-r.verdicts:
			return v, true
		case <-r.clock.After(r.o.ProbeMin):
			r.mu.Lock()
			if r.state == stateProbing && r.answered && !r.clock.Now().Before(r.answeredAt.Add(r.o.ProbeMin)) {
				r.endRoundLocked(verdictNone, retry.Outcome{Error: "the decision on the probe's answer never came"})
			}
			r.mu.Unlock()
		}
	}
}
