package proxy

import (
	"log/slog"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/route"
)

// routing is a delivery's route decision. It is taken once, on the first
// attempt, and kept for the attempts an in-place hold repeats: the
// message does not change, and neither are its metrics counted twice.
type routing struct {
	decided bool
	d       route.Decision
}

// route takes e's route decision unless it was taken already, and counts
// and logs it: the route, and the rules that could not be evaluated.
func (p *Loop) route(e *entry, rt *routing) {
	if rt.decided {
		return
	}
	rt.decided = true
	// The original routing key and exchange: a retried message comes back
	// from its tier queue with others.
	rt.d = p.o.Routes.Decide(e.m, e.in.RoutingKey, e.in.Exchange)
	for _, pr := range rt.d.Problems {
		p.obs.RuleFailed(pr.Kind)
		level := slog.LevelWarn
		if pr.Kind == route.ProblemBody {
			// Counted; a queue of non-JSON messages would flood the log.
			level = slog.LevelDebug
		}
		if p.log.Enabled(e.ctx, level) {
			p.log.Log(e.ctx, level, "a routing rule could not be evaluated for the message", "event", "ROUTE_RULE_FAILED",
				"message_id", e.m.MessageID, "rule", pr.Rule, "kind", pr.Kind, "error", msg.Truncate(pr.Err.Error(), msg.MaxErrorLen))
		}
	}
	if rt.d.Outcome != route.Deliver {
		if p.log.Enabled(e.ctx, slog.LevelDebug) {
			p.log.Debug("message left out by the filter", "event", "MESSAGE_FILTERED", "message_id", e.m.MessageID,
				"routing_key", e.in.RoutingKey, "reason", rt.d.Reason, "dead_lettered", rt.d.Outcome == route.DeadLetter)
		}
		return
	}
	p.obs.Routed(rt.d.RouteName())
}

// leftOut is the verdict on a message the filter left out, or that its
// rules could not judge: acked unseen, or dead-lettered with the reason.
// The app is not called, so no attempt is spent.
func (p *Loop) leftOut(e *entry, rd route.Decision) verdict {
	dec := retry.Decision{Action: retry.Ack, Reason: rd.Reason, Retries: e.st.Retries, Requeues: e.st.Requeues, Crashes: e.st.Crashes}
	var out retry.Outcome
	if rd.Outcome == route.DeadLetter {
		dec.Action = retry.DLQ
		out.Error = "left out by the filter"
		if rd.Err != nil {
			out.Error = rd.Err.Error()
		}
	}
	if e.span.IsRecording() {
		e.span.SetAttributes(keyFiltered.Bool(true))
	}
	return verdict{dec: dec, out: out}
}
