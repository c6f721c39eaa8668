// Package retry decides a message's fate from the app's answer. It is pure:
// (outcome, state, policy, now) → decision, with no I/O, so every row of the
// outcome table is a table test.
//
// The life of a message, as this package sees it:
//
//	delivered (attempt = retries+1)
//	  ├─ past its deadline ───────────────→ DLQ "expired" (or dropped, by policy)
//	  ├─ 2xx ─────────────────────────────→ ack
//	  ├─ 425 ─────────────────────────────→ requeue: hold, back to the work queue,
//	  │                                      requeues+1 (not an attempt); a long
//	  │                                      Retry-After goes through a tier; past
//	  │                                      MaxRequeues → DLQ "too-early"
//	  ├─ 408/409/429/5xx/timeout ─────────→ retry: tier min(attempt, last), retries+1;
//	  │                                      attempt ≥ MaxAttempts → DLQ "max-attempts"
//	  ├─ cut while the app stays healthy ─→ retry, like a timeout (an attempt)
//	  ├─ app unavailable ─────────────────→ return to the work queue, no attempt spent
//	  ├─ app died handling it ────────────→ return, crashes+1 (not an attempt);
//	  │                                      crashes ≥ MaxCrashes → DLQ "app-crash"
//	  ├─ app died, others in flight too ──→ return as a suspect, nothing charged:
//	  │                                      delivered next on its own
//	  ├─ 401 ─────────────────────────────→ return, nothing charged, and pause
//	  │                                      consuming: the app refuses Hopper's
//	  │                                      credentials, not this message
//	  └─ other 4xx ───────────────────────→ DLQ "non-retriable"
//
// The app can override the table with a Hopper-Action response header.
package retry

import (
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Action is what happens to a delivery.
type Action int

// The actions. The zero value is not an action, so a missing table entry is
// caught instead of silently acking.
const (
	ActionNone Action = iota
	// Ack removes the message: the app handled it.
	Ack
	// Drop acks without delivering further, counted separately from Ack.
	Drop
	// Requeue sends the message back to the work queue after a short hold,
	// without spending an attempt (425 Too Early).
	Requeue
	// Retry sends the message through a delay tier and spends an attempt.
	Retry
	// DLQ moves the message to the dead-letter queue.
	DLQ
	// Return gives the message back to the work queue untouched because the
	// app could not take it (down, not ready, breaker open). Not an attempt.
	Return
	// Pause is an entry of the outcome table, never a decision's action:
	// the answer says the app refuses Hopper itself (401: the caller's
	// credentials are wrong), which is the same for every message. The
	// delivery is given back like a Return, with Decision.Pause set, so
	// that consuming pauses until the app takes Hopper's requests again,
	// instead of every message in the queue failing on it in turn.
	Pause
)

var actionNames = map[Action]string{
	Ack: "ack", Drop: "drop", Requeue: "requeue", Retry: "retry", DLQ: "dlq", Return: "return", Pause: "pause",
}

func (a Action) String() string {
	if s, ok := actionNames[a]; ok {
		return s
	}
	return "none"
}

// ParseAction reads an action name as written in config or in the
// Hopper-Action response header (case-insensitive).
func ParseAction(s string) (Action, error) {
	ls := strings.ToLower(strings.TrimSpace(s))
	for a, name := range actionNames {
		if name == ls {
			return a, nil
		}
	}
	return ActionNone, fmt.Errorf("unknown action %q (want ack, drop, requeue, retry, dlq, return or pause)", s)
}

// Kind says how the HTTP exchange with the app ended.
type Kind int

const (
	// Response: the app answered with a status code.
	Response Kind = iota
	// Timeout: the request was sent but no answer came within the timeout.
	// The app may have done the work, so it counts as an attempt.
	Timeout
	// Unavailable: no request reached the app (connection refused or reset
	// before a response, app not ready). The message did not fail.
	Unavailable
	// Cut: the app took the request and closed or reset the connection
	// without an answer while its health check kept passing. The app is up,
	// so this message is what failed: an attempt, never a return (a message
	// that always breaks its connection would otherwise circle for ever).
	Cut
)

// Outcome is the classified result of one delivery attempt.
type Outcome struct {
	Kind   Kind
	Status int // HTTP status when Kind is Response
	// RetryAfter is the app's Retry-After; HasRetryAfter says it was given.
	RetryAfter    time.Duration
	HasRetryAfter bool
	// Override is the Hopper-Action response header ("" when absent).
	Override string
	// Error is a short description for logs and the DLQ x-final-error header.
	Error string
	// Refused means no request was even attempted: the circuit breaker is
	// open, the app is refusing Hopper's credentials, or Hopper had no
	// connection to send it on; it says nothing against the app. The
	// message goes back without the unavailable backoff, since the
	// consumer is paused and will not see it again soon.
	Refused bool
	// CutOff means Hopper itself ended the request because it is shutting
	// down. The app may have done the work, but the message did not fail.
	CutOff bool
	// Cut means the request was sent and the connection then closed or
	// reset before an answer (Kind is Unavailable): the app went away while
	// handling it.
	Cut bool
	// Crashed means a Cut request was followed by a failing health check:
	// the app died handling this message. Such deliveries are counted per
	// message, so one message cannot keep the app in a crash loop.
	Crashed bool
	// CrashSuspect means the app died while this request and others were
	// in flight: any of them may have killed it. None is charged a crash;
	// each goes back marked to be delivered again on its own, where a
	// message that kills the app is caught alone.
	CrashSuspect bool
	// Probe means the request went to an app that had refused Hopper's
	// credentials, to learn whether it takes them now: the decision on its
	// answer (a pause again, or anything else) ends the refusal or keeps
	// it. The decision itself does not depend on it.
	Probe bool
	// Entry means the outcome is one message's result inside a batch the
	// app took as a whole with a 2xx: the request's credentials were
	// accepted, so whatever status the entry has speaks of its message. A
	// status the table makes pause is decided as its class (a 401 entry as
	// the table's 4xx), and pauses nothing.
	Entry bool
}

// Given reports whether the message was taken from Hopper's side: refused
// by the breaker or cut off by shutdown. Such a message goes back to the
// work queue whatever the outcome table says, and never spends an attempt.
func (o Outcome) Given() bool { return o.Refused || o.CutOff }

// State is what the message's headers say about its history.
type State struct {
	Retries  int       // failed attempts so far (x-retry-count)
	Requeues int       // 425 requeues so far (x-requeue-count)
	Crashes  int       // requests that ended with the app dying (x-hopper-crash-count)
	Deadline time.Time // zero when the message has none
	// Suspect: the message was in flight when the app died with others,
	// and is to be delivered on its own (x-hopper-crash-suspect).
	Suspect bool
}

// Attempt is the 1-based number of the delivery in progress. It saturates
// instead of wrapping, whatever the header said.
func (s State) Attempt() int { return inc(s.Retries) }

// inc is n+1 for a count: never below 1, never wrapped past the integer
// limit.
func inc(n int) int {
	switch {
	case n < 0:
		return 1
	case n == math.MaxInt:
		return n
	}
	return n + 1
}

// Reasons written to x-dead-letter-reason.
const (
	ReasonMaxAttempts  = "max-attempts"
	ReasonNonRetriable = "non-retriable"
	ReasonExpired      = "expired"
	ReasonTooEarly     = "too-early"
	ReasonAppAction    = "app-action"
	ReasonAppCrash     = "app-crash"
	// ReasonHopperError: Hopper itself failed handling the message (a
	// recovered panic). The message is set aside with the error rather than
	// retried into the same failure or lost.
	ReasonHopperError = "hopper-error"
	// ReasonFiltered: the subscription's filter left the message out and
	// onFiltered is dlq.
	ReasonFiltered = "filtered"
	// ReasonFilterError: the filter could not be evaluated for the message
	// (onFilterError dlq, the default), or a routing or filter rule needed
	// the body and it was not JSON, with onBodyError dlq.
	ReasonFilterError = "filter-error"
	// ReasonScheduleTooFar: the message asked to be delivered further
	// away than schedule.maxDelay, with schedule.pastMax dlq.
	ReasonScheduleTooFar = "schedule-too-far"
)

// Event is the stable log event name for a dead-lettering reason.
func Event(reason string) string {
	switch reason {
	case ReasonMaxAttempts:
		return "RABBITMQ_MESSAGE_MAX_RETRIES_EXCEEDED"
	case ReasonNonRetriable:
		return "RABBITMQ_MESSAGE_NON_RETRIABLE"
	case ReasonExpired:
		return "RABBITMQ_MESSAGE_EXPIRED"
	case ReasonTooEarly:
		return "RABBITMQ_MESSAGE_TOO_EARLY_LIMIT_EXCEEDED"
	case ReasonAppAction:
		return "RABBITMQ_MESSAGE_DEAD_LETTERED_BY_APP"
	case ReasonAppCrash:
		return "RABBITMQ_MESSAGE_CRASHED_APP"
	case ReasonHopperError:
		return "RABBITMQ_MESSAGE_HOPPER_ERROR"
	case ReasonFiltered:
		return "RABBITMQ_MESSAGE_FILTERED"
	case ReasonFilterError:
		return "RABBITMQ_MESSAGE_FILTER_ERROR"
	case ReasonScheduleTooFar:
		return "RABBITMQ_MESSAGE_SCHEDULE_TOO_FAR"
	}
	return "RABBITMQ_MESSAGE_DEAD_LETTERED"
}

// Decision is what to do with the delivery and the counters the moved copy
// carries.
type Decision struct {
	Action Action
	// Hold is how long to keep the delivery before a Requeue republishes it
	// to the work queue.
	Hold time.Duration
	// Tier is the delay tier to publish to. It is set for Retry, and for a
	// Requeue whose Retry-After is longer than the hold limit.
	Tier time.Duration
	// Reason is the x-dead-letter-reason for DLQ (and Drop) decisions.
	Reason string
	// Retries, Requeues and Crashes are the counters after this decision.
	// A Return whose Crashes grew must be republished with the new count.
	Retries  int
	Requeues int
	Crashes  int
	// Suspect is the crash-suspect mark the message carries on: set by a
	// crash it shared with other requests (or caused alone), cleared once
	// the app has answered it. A Return whose mark changed must be
	// republished with it.
	Suspect bool
	// Pause says the app refused Hopper itself rather than the message
	// (the outcome table's pause, 401 by default): the delivery goes back
	// (Action is Return) and consuming pauses until the app accepts a
	// request again. Nothing is counted: the app never judged the message.
	Pause bool
}

// Unlimited as MaxAttempts retries a message for ever (until its deadline).
const Unlimited = 0

// Policy is the retry behaviour for a class of messages.
type Policy struct {
	Name string
	// MaxAttempts is the attempt at which a failing message goes to the DLQ
	// instead of another retry; Unlimited (0) never gives up.
	MaxAttempts int
	// Tiers are the delay tiers in order; attempt n uses Tiers[min(n, len)-1].
	Tiers []time.Duration
	// Table maps outcomes to actions.
	Table Table
	// ExpiredAction is DLQ or Drop, for messages past their deadline.
	ExpiredAction Action
	// MaxRequeues caps 425 requeues; past it the message goes to the DLQ.
	MaxRequeues int
	// MaxHold caps the hold before a requeue; a longer Retry-After goes
	// through the smallest tier at least that long.
	MaxHold time.Duration
	// MinHold is the lower end of the jittered hold (MinHold..MaxHold) used
	// when a 425 has no Retry-After.
	MinHold time.Duration
	// MaxCrashes is the number of app crashes a message may cause before it
	// goes to the DLQ as app-crash; 0 never dead-letters for crashes.
	MaxCrashes int
}

// Rand returns a pseudo-random number in [0, 1). It is injected so that
// decisions are reproducible in tests.
type Rand func() float64

// Decide returns the decision for one attempt. now is the time the outcome
// was seen; rnd jitters the 425 hold.
func Decide(p *Policy, st State, o Outcome, now time.Time, rnd Rand) Decision {
	// Counters come from headers: a negative one has counted nothing.
	st.Retries, st.Requeues, st.Crashes = max(st.Retries, 0), max(st.Requeues, 0), max(st.Crashes, 0)
	d := Decision{Retries: st.Retries, Requeues: st.Requeues, Crashes: st.Crashes, Suspect: st.Suspect}
	if o.Given() {
		d.Action = Return
		return d
	}
	if o.CrashSuspect {
		// Not charged: the app died with several requests in flight. The
		// message goes back to be tried alone.
		d.Action, d.Suspect = Return, true
		return d
	}
	if o.Crashed {
		// Proven alone (or tried alone as a suspect): it stays marked, so
		// it keeps being delivered on its own.
		d.Suspect = true
		// Not an attempt: the message may be fine and the app broken. But a
		// message that keeps killing the app is set aside.
		d.Crashes = inc(st.Crashes)
		if p.MaxCrashes > 0 && d.Crashes >= p.MaxCrashes {
			d.Action, d.Reason = DLQ, ReasonAppCrash
			return d
		}
		d.Action = Return
		return d
	}

	if o.Kind != Unavailable {
		d.Suspect = false // the app answered it (or timed out on it) and lived
	}
	action := p.Table.Lookup(o)
	if action == Pause && o.Entry {
		action = p.Table.lookupClass(o.Status)
	}
	if o.Override != "" && o.Kind == Response {
		// Return and pause say something of the app, not of the message:
		// the app's answer about one message cannot ask for them.
		if a, err := ParseAction(o.Override); err == nil && a != Return && a != Pause {
			action = a
			if a == DLQ {
				// The app answered and asked for the DLQ: that answer is a
				// failed attempt, counted like every other final one.
				d.Action, d.Reason, d.Retries = DLQ, ReasonAppAction, st.Attempt()
				return d
			}
		}
	}

	switch action {
	case Ack:
		d.Action = Ack
	case Drop:
		d.Action, d.Reason = Drop, ReasonAppAction
	case Return:
		d.Action = Return
	case Pause:
		// The app turned Hopper away before looking at the message: no
		// attempt, and a crash suspect stays one (it has not run yet).
		d.Action, d.Pause, d.Suspect = Return, true, st.Suspect
	case DLQ:
		// The failed attempt that decided it is counted, so the DLQ copy's
		// retry count means the same for every reason.
		d.Action, d.Reason, d.Retries = DLQ, ReasonNonRetriable, st.Attempt()
	case Requeue:
		if p.MaxRequeues > 0 && st.Requeues >= p.MaxRequeues {
			// Requeues done so far; this 425 is not requeued.
			d.Action, d.Reason = DLQ, ReasonTooEarly
			return d
		}
		d.Requeues = inc(st.Requeues)
		d.Action = Requeue
		if o.HasRetryAfter && o.RetryAfter > p.MaxHold {
			d.Tier = TierFor(p.Tiers, o.RetryAfter)
			return d
		}
		if o.HasRetryAfter {
			d.Hold = o.RetryAfter
		} else {
			d.Hold = jitter(p.MinHold, p.MaxHold, rnd)
		}
	case Retry:
		attempt := st.Attempt()
		d.Retries = attempt
		if p.MaxAttempts != Unlimited && attempt >= p.MaxAttempts {
			d.Action, d.Reason = DLQ, ReasonMaxAttempts
			return d
		}
		d.Action = Retry
		if o.HasRetryAfter {
			d.Tier = TierFor(p.Tiers, o.RetryAfter)
		} else {
			d.Tier = TierOf(p.Tiers, attempt)
		}
		if !st.Deadline.IsZero() && !now.Add(d.Tier).Before(st.Deadline) {
			// The message would come back stale: settle it now rather than
			// churn a tier queue for nothing. This attempt failed too.
			e := Expired(p, st)
			e.Retries = attempt
			return e
		}
	default:
		// Unreachable with a validated table; fail safe by retrying.
		d.Action = Retry
		d.Retries = st.Attempt()
		d.Tier = TierOf(p.Tiers, 1)
	}
	return d
}

// TierOf is the tier of a 1-based attempt: Tiers[min(attempt, len)-1],
// with the attempt clamped into range first, so no count read from a
// header can index past the list. Zero when there are no tiers.
func TierOf(tiers []time.Duration, attempt int) time.Duration {
	if len(tiers) == 0 {
		return 0
	}
	return tiers[min(max(attempt, 1), len(tiers))-1]
}

// Expired is the decision for a message past its deadline.
func Expired(p *Policy, st State) Decision {
	a := p.ExpiredAction
	if a != Drop {
		a = DLQ
	}
	return Decision{Action: a, Reason: ReasonExpired, Retries: st.Retries, Requeues: st.Requeues, Crashes: st.Crashes}
}

// TierFor picks the smallest tier at least d long, or the longest tier.
// tiers must be sorted ascending.
func TierFor(tiers []time.Duration, d time.Duration) time.Duration {
	if len(tiers) == 0 {
		return 0
	}
	i := sort.Search(len(tiers), func(i int) bool { return tiers[i] >= d })
	if i == len(tiers) {
		return tiers[len(tiers)-1]
	}
	return tiers[i]
}

func jitter(lo, hi time.Duration, rnd Rand) time.Duration {
	if hi <= lo || rnd == nil {
		return min(lo, hi)
	}
	return lo + time.Duration(rnd()*float64(hi-lo))
}

// ParseRetryAfter reads a Retry-After value: delay seconds or an HTTP date.
// A date in the past means zero; an unparsable value is not given.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil {
		if secs < 0 || secs > 365*24*3600 {
			return 0, false
		}
		return time.Duration(secs * float64(time.Second)), true
	}
	// An HTTP date in any of the three formats HTTP allows (IMF-fixdate,
	// RFC 850, asctime).
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	// Also a date with a zone name, as time.RFC1123 writes it ("UTC"
	// instead of "GMT"): apps do send that, and refusing it would turn a
	// clear delay into an immediate retry.
	if t, err := time.Parse(time.RFC1123, v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
