package sidecar

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/streamsrc"
)

// readiness is the /readyz answer. A consumer sidecar takes no traffic, so
// readiness says whether this pod has started doing its job: not ready
// until it has consumed once (so a rollout waits for a pod that works), and
// not ready while shutting down; ready from then on, also while the broker
// connection is down or consuming is paused on purpose — taking every pod
// out of service during a broker outage would only block node drains. The
// exception is the app refusing Hopper's credentials past
// app.auth.maxRefused: that outage is the pod's own configuration (its
// Secret), and a not-ready pod stops the rollout that brought it.
func (s *Sidecar) readiness() (int, string) {
	code, text := s.readinessState()
	if notes, _ := s.notes.Load().([]string); len(notes) > 0 {
		text += "\nnote: " + strings.Join(notes, "\nnote: ")
	}
	return code, text
}

func (s *Sidecar) readinessState() (int, string) {
	switch {
	case s.stopping.Load():
		return http.StatusServiceUnavailable, "not ready: shutting down"
	case !s.started():
		phase, _ := s.phase.Load().(string)
		if phase == "" {
			phase = "starting"
		}
		return http.StatusServiceUnavailable, "not ready: " + phase
	}
	if r := s.refusal.Load(); r != nil && r.Overdue() {
		// Waiting has not fixed it: the Secret on one side is wrong.
		return http.StatusServiceUnavailable, "not ready: the app has refused Hopper's credentials for longer than app.auth.maxRefused (" +
			r.Describe() + "); consuming paused, messages wait in the queue"
	}
	if len(s.subs) > 1 || slices.ContainsFunc(s.subs, func(sub *subscription) bool {
		return sub.cfg.Consumer.Batch.On() || sub.cfg.Consumer.OrderingKey != "" || sub.cfg.Queue.SAC() || len(sub.plan.Parking) > 0 ||
			sub.src.Load() != nil
	}) {
		// Several queues, batches, ordering keys, parked messages or a
		// stream's lag worth seeing, or a single active consumer's role: a
		// line per queue.
		return http.StatusOK, "ready: " + s.stateLine() + "\n" + s.queueStates()
	}
	return http.StatusOK, "ready: " + s.stateLine()
}

// started reports whether every queue's consumer was registered at least
// once.
func (s *Sidecar) started() bool {
	for _, sub := range s.subs {
		if c := sub.cons.Load(); c == nil || !c.Started() {
			return false
		}
	}
	return true
}

// stateLine is the sidecar's state after it has started.
func (s *Sidecar) stateLine() string {
	switch {
	case s.Paused():
		return fmt.Sprintf("paused on purpose: %s (breaker %s)", strings.Join(s.PauseReasons(), ", "), s.BreakerState())
	case !s.Consuming():
		if g := s.group.Load(); g != nil && !g.Connected() {
			return "broker connection lost, reconnecting"
		}
		return "consumer lost, consuming again"
	}
	if l := s.ConcurrencyLimit(); l > 0 {
		return fmt.Sprintf("consuming (concurrency limit %d)", l)
	}
	return "consuming"
}

// queueStates is one line per queue: consuming, paused (and why) or
// reconnecting, with its deliveries in flight.
func (s *Sidecar) queueStates() string {
	var b strings.Builder
	for _, sub := range s.subs {
		state := "consuming"
		switch {
		case sub.paused() || s.refusing():
			state = "paused: " + strings.Join(s.pauseReasons(sub), ", ")
		case !sub.consuming():
			state = "reconnecting"
		case sub.cfg.Queue.SAC():
			state = "consuming, single active consumer: " + roleText(sub.role())
		}
		var (
			inFlight, batches, batched int64
			keysBusy, keysWaiting      int
		)
		if px := sub.px.Load(); px != nil {
			inFlight = px.Stats.InFlight.Load()
			batches, batched = px.Stats.Batches.Load(), px.Stats.BatchedMessages.Load()
			keysBusy, keysWaiting = px.Keys()
		}
		fmt.Fprintf(&b, "queue %s: %s (in flight %d", sub.name(), state, inFlight)
		if bt := sub.cfg.Consumer.Batch; bt.On() {
			mean := 0.0
			if batches > 0 {
				mean = float64(batched) / float64(batches)
			}
			fmt.Fprintf(&b, "; batches of up to %d: %d sent, %.1f messages each on average", bt.Size(), batches, mean)
		}
		if k := sub.cfg.Consumer.OrderingKey; k != "" {
			fmt.Fprintf(&b, "; ordered by %s: %d keys in delivery, %d messages waiting behind them", k, keysBusy, keysWaiting)
		}
		if len(sub.plan.Parking) > 0 {
			b.WriteString("; " + sub.scheduleText(time.Now()))
		}
		if src := sub.src.Load(); src != nil {
			b.WriteString("; " + streamText(sub, src))
		}
		b.WriteString(")\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// serveAdmin serves /livez and /healthz (alive), /readyz and /metrics.
func (s *Sidecar) serveAdmin(addr string) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.metrics.Handler())
	// Liveness: the process answers. Nothing a restart would fix is
	// checked here: a broker or app outage is waited out, not restarted.
	alive := func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }
	mux.HandleFunc("/livez", alive)
	mux.HandleFunc("/healthz", alive)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		code, text := s.readiness()
		w.WriteHeader(code)
		fmt.Fprintln(w, text)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listen %s: %w", addr, err)
	}
	s.adminAddr.Store(ln.Addr().String())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin server", "error", err.Error())
		}
	}()
	return srv, nil
}

// superStreamText is streamText for a super stream: the partitions this
// pod reads, and the lag of each.
func superStreamText(sub *subscription, src *streamsrc.Source) string {
	st := sub.cfg.Queue.Stream
	sac := st.SingleActiveConsumer != nil && *st.SingleActiveConsumer
	parts := src.Partitions()
	var reading, standing []string
	for _, p := range parts {
		if p.Active {
			reading = append(reading, p.Stream)
		} else {
			standing = append(standing, p.Stream)
		}
	}
	role := "reading " + strings.Join(reading, ", ")
	switch {
	case !src.Connected():
		role = "not subscribed"
	case sac && len(reading) == 0:
		role = "standing by on every partition (single active consumer: other pods read them; this one takes a partition over when its reader goes)"
	case sac:
		role = "active on " + strings.Join(reading, ", ") + " (single active consumer: the broker gives each partition to one pod)"
		if len(standing) > 0 {
			role += ", standing by on " + strings.Join(standing, ", ")
		}
	}
	text := fmt.Sprintf("super stream %s as %s: %s", st.Name, st.Consumer, role)
	if p, ok := src.Position(); ok {
		lags := make([]string, len(parts))
		for i, pp := range parts {
			lags[i] = fmt.Sprintf("%s %d", pp.Stream, pp.Lag)
		}
		text += fmt.Sprintf(", lag %d (%s)", p.Lag, strings.Join(lags, ", "))
	}
	return text
}

// roleText explains a single active consumer's role on /readyz.
func roleText(role string) string {
	switch role {
	case broker.RoleActive:
		return "active (the broker delivers to this pod)"
	case broker.RoleStandby:
		return "standby (another consumer is active; this pod takes over when it goes)"
	}
	return "idle (nothing delivered yet and the queue is empty: active or standby shows once messages arrive)"
}

// streamText is a stream subscription's reader on /readyz: whether the
// broker delivers to it (a single active consumer may stand by) and how
// far its consumer name is behind the stream.
func streamText(sub *subscription, src *streamsrc.Source) string {
	st := sub.cfg.Queue.Stream
	if st.SuperStream {
		return superStreamText(sub, src)
	}
	role := "reading"
	switch {
	case !src.Connected():
		role = "not subscribed"
	case st.SingleActiveConsumer != nil && *st.SingleActiveConsumer && src.Active():
		role = "active (single active consumer: the broker delivers to this pod)"
	case st.SingleActiveConsumer != nil && *st.SingleActiveConsumer:
		role = "standing by (single active consumer: another pod reads; this one takes over when it goes)"
	}
	text := fmt.Sprintf("stream %s as %s: %s", st.Name, st.Consumer, role)
	if p, ok := src.Position(); ok {
		text += fmt.Sprintf(", lag %d (stored offset %d, last %d)", p.Lag, p.Stored, p.Last)
	}
	return text
}
