package telemetry

import (
	"bytes"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/retry"
)

// Metrics are Hopper's Prometheus metrics. Labels are bounded: queue takes
// one value per consumed queue, and outcome, status class, tier, reason and
// state a handful each, route one per route named in the config; no
// message ids or routing keys.
type Metrics struct {
	reg registry
	// first is the observer of the first consumed queue: what the
	// Observer methods on Metrics itself record under.
	first *Queue

	deliveries   *family
	latency      *family
	inFlight     *family
	retries      *family
	deadLettered *family
	requeues     *family
	returns      *family
	movesFailed  *family
	internal     *family
	orderBroken  *family
	routed       *family
	filtered     *family
	ruleFailed   *family
	batchSize    *family
	parked       *family
	lateness     *family
	breaker      *family
	breakerOpens *series
	refusals     *series
	reconnects   *series

	mu     sync.Mutex
	queues map[string]*Queue
}

// Sources are read when Prometheus scrapes, for state other packages own,
// plus what the metrics are labelled with from the start.
type Sources struct {
	// Version is the binary's version, for hopper_build_info. Default "dev".
	Version string
	// Queues are the consumed queues: every per-queue series exists for
	// each from the first scrape. Default one queue labelled "".
	Queues []string
	// Tiers are the configured delay tiers: every tier's retry series
	// exists (at 0) from the first scrape, so rate() alerts see it.
	Tiers     []time.Duration
	Connected func() bool
	Paused    func() bool
	// Refusing says whether the app refuses Hopper's credentials now
	// (consuming paused, or one delivery out as a probe).
	Refusing       func() bool
	HeadersSkipped func() int64
	// HeadersOmitted are the application headers the forwarding bounds
	// left out, by reason; every reason is present from the start.
	HeadersOmitted func() map[string]int64
	SpansDropped   func() int64
	MovesFailing   func() int64
	// ConcurrencyLimit is the adaptive limit on concurrent app requests.
	ConcurrencyLimit func() int64
	// ConsumerActive says, per queue, whether the broker delivers to this
	// sidecar's consumer (on a single-active-consumer queue, whether it
	// is the active one).
	ConsumerActive func() map[string]bool
	// Parked are, per queue with scheduling on, the messages in its
	// parking queues as last counted on the broker.
	Parked func() map[string]float64
	// NextDue are, per queue with scheduling on, the Unix time of the
	// earliest due time among the messages it parked (0: none known).
	NextDue func() map[string]float64
	// StreamPositions are, per stream subscription (labelled with its
	// own queue, <stream>.<consumer>), the offset stored for its consumer
	// name, the offset of the stream's last message and the lag between
	// them, as last looked up.
	StreamPositions func() map[string]StreamPosition
	// StreamPartitions are, per stream subscription and partition of its
	// super stream ([queue, partition]), the same, and whether this
	// Hopper is the partition's active reader.
	StreamPartitions func() map[[2]string]StreamPosition
	// ParkSteps are the parking delays of a schedule: every step's
	// hopper_parked_total series exists from the first scrape.
	ParkSteps []time.Duration
	// Routes are, per queue with routing rules, the names of its routes,
	// whose hopper_routed_total series start at 0 (with the route "" of
	// the messages no route takes).
	Routes map[string][]string
}

// StreamPosition is where a stream subscription's consumer name stands.
type StreamPosition struct {
	Stored, Last, Lag float64
	// Active is 1 while this Hopper reads the partition, 0 otherwise
	// (StreamPartitions only).
	Active float64
}

// NewMetrics registers every metric on a fresh registry (one per sidecar,
// so tests can run several).
func NewMetrics(src Sources) *Metrics {
	m := &Metrics{queues: map[string]*Queue{}}
	r := &m.reg
	r.extra = writeRuntime
	m.deliveries = r.counter("hopper_deliveries_total",
		"Deliveries by decision (ack, drop, requeue, retry, dlq, return) and app status class (2xx..5xx, timeout, unavailable, cut, refused, expired).",
		"queue", "outcome", "status_class")
	m.latency = r.histogram("hopper_delivery_duration_seconds",
		"Time from sending a message to the app to its answer (or failure).",
		[]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}, "queue")
	m.inFlight = r.gauge("hopper_in_flight", "Deliveries being processed now.", "queue")
	m.retries = r.counter("hopper_retries_total", "Messages sent to a delay tier, by tier.", "queue", "tier")
	m.deadLettered = r.counter("hopper_dead_lettered_total", "Messages dead-lettered, by reason.", "queue", "reason")
	m.requeues = r.counter("hopper_requeues_total", "425 Too Early requeues.", "queue")
	m.returns = r.counter("hopper_returns_total", "Messages returned to the work queue because the app could not take them.", "queue")
	m.movesFailed = r.counter("hopper_moves_failed_total",
		"Move publishes that failed (each retry counts); the original is held and the move retried.", "queue", "move")
	m.internal = r.counter("hopper_internal_errors_total",
		"Panics recovered while handling a message; each such message goes to the DLQ with reason hopper-error.", "queue")
	m.orderBroken = r.counter("hopper_order_broken_total",
		"Ordered messages that had to leave their place in line (held past moveHoldMax, or returned to the tail of a queue), by reason.",
		"queue", "reason")
	m.routed = r.counter("hopper_routed_total",
		"Messages the routing rules let through, by the route they took (\"\" for none: the queue's own path).", "queue", "route")
	m.filtered = r.counter("hopper_filtered_total",
		"Messages the filter left out, acked unseen or dead-lettered with reason filtered (onFiltered).", "queue")
	m.ruleFailed = r.counter("hopper_route_rule_errors_total",
		"Routing rules that could not be evaluated for a message, by kind: body (not JSON) or eval; a route that cannot be evaluated does not match, a filter that cannot be evaluated filters nothing (onFilterError).", "queue", "kind")
	m.batchSize = r.histogram("hopper_batch_size",
		"Messages per batch request to the app (batch delivery only).",
		[]float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000}, "queue")
	m.parked = r.counter("hopper_parked_total",
		"Messages moved to a parking queue because they were not due yet (x-delay, Hopper-Not-Before), by parking delay; a message waiting long hops several times.",
		"queue", "step")
	m.lateness = r.histogram("hopper_schedule_lateness_seconds",
		"How late a scheduled message came back from parking, in seconds from its due time (negative: early, by at most half of schedule.step), when Hopper took it to deliver: a batch it then waits to fill, or its ordering key's line, comes on top.",
		[]float64{-0.5, -0.25, -0.1, -0.01, 0, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}, "queue")
	m.breaker = r.gauge("hopper_breaker_state", "1 for the circuit breaker's current state.", "state")
	m.breakerOpens = r.counter("hopper_breaker_opens_total", "Times the circuit breaker opened (the app unavailable).").with()
	m.refusals = r.counter("hopper_app_credential_refusals_total",
		"Times the app started refusing Hopper's credentials (a 401, or another status retry.outcomes makes pause), pausing consuming.").with()
	m.reconnects = r.counter("hopper_broker_reconnects_total", "Consumer reconnects after a lost connection, channel or consumer.").with()

	version := src.Version
	if version == "" {
		version = "dev"
	}
	r.gauge("hopper_build_info", "Always 1, labelled with the running binary's version.", "version").with(version).set(1)
	// Every label set a counter will take starts at 0, so that rate() and
	// increase() see a series from the first scrape, not from the first
	// event.
	queues := src.Queues
	if len(queues) == 0 {
		queues = []string{""}
	}
	for _, q := range queues {
		for _, a := range []retry.Action{retry.Ack, retry.Drop, retry.Requeue, retry.Retry, retry.DLQ, retry.Return} {
			for _, c := range []string{"2xx", "4xx", "5xx", "timeout", "unavailable", "cut", "refused"} {
				m.deliveries.with(q, a.String(), c)
			}
		}
		for _, r := range []string{retry.ReasonMaxAttempts, retry.ReasonNonRetriable, retry.ReasonExpired,
			retry.ReasonTooEarly, retry.ReasonAppAction, retry.ReasonAppCrash, retry.ReasonHopperError,
			retry.ReasonFiltered, retry.ReasonFilterError, retry.ReasonScheduleTooFar} {
			m.deadLettered.with(q, r)
		}
		for _, d := range src.Tiers {
			m.retries.with(q, tierLabel(d))
		}
		for _, mv := range []string{"retry", "requeue", "dlq", "return"} {
			m.movesFailed.with(q, mv)
		}
		m.requeues.with(q)
		m.returns.with(q)
		m.internal.with(q)
		m.filtered.with(q)
		for _, k := range []string{"body", "eval"} {
			m.ruleFailed.with(q, k)
		}
		if routes, ok := src.Routes[q]; ok {
			m.routed.with(q, "")
			for _, r := range routes {
				m.routed.with(q, r)
			}
		}
		for _, r := range []string{OrderBrokenHoldExhausted, OrderBrokenReturned} {
			m.orderBroken.with(q, r)
		}
		for _, d := range src.ParkSteps {
			m.parked.with(q, tierLabel(d))
		}
		m.ForQueue(q)
	}
	m.first = m.ForQueue(queues[0])
	m.SetBreaker("closed")
	boolGauge := func(name, help string, f func() bool) {
		if f == nil {
			return
		}
		r.gaugeFunc(name, help, func() float64 {
			if f() {
				return 1
			}
			return 0
		})
	}
	boolGauge("hopper_broker_connected", "1 while the consumer's broker connection is up.", src.Connected)
	boolGauge("hopper_consumer_paused", "1 while consuming is paused on purpose (breaker open, moves failing, or the app refusing Hopper's credentials).", src.Paused)
	boolGauge("hopper_app_credentials_refused",
		"1 while the app refuses Hopper's credentials: consuming is paused and messages wait in the queue, one delivery at a time going as a probe.", src.Refusing)
	if src.ConsumerActive != nil {
		r.labelledGaugeFunc("hopper_consumer_active",
			"1 while the broker delivers to this pod's consumer of the queue: on a queue with a single active consumer, while this pod is the active one (0 on a standby); on any other, while a consumer is registered.",
			"queue", func() map[string]float64 {
				out := map[string]float64{}
				for q, on := range src.ConsumerActive() {
					out[q] = 0
					if on {
						out[q] = 1
					}
				}
				return out
			})
	}
	if src.Parked != nil {
		r.labelledGaugeFunc("hopper_parked_messages",
			"Messages in the queue's parking queues, waiting for their due time, as last counted on the broker.",
			"queue", src.Parked)
	}
	if src.NextDue != nil {
		r.labelledGaugeFunc("hopper_schedule_next_due_timestamp_seconds",
			"Unix time of the earliest due time among the messages this Hopper parked that are not due yet (0: none known).",
			"queue", src.NextDue)
	}
	if src.StreamPositions != nil {
		pick := func(f func(StreamPosition) float64) func() map[string]float64 {
			return func() map[string]float64 {
				out := map[string]float64{}
				for q, p := range src.StreamPositions() {
					out[q] = f(p)
				}
				return out
			}
		}
		r.labelledGaugeFunc("hopper_stream_stored_offset",
			"The offset stored on the broker for a stream subscription's consumer name (-1: none yet), as last looked up (every 5 s).",
			"queue", pick(func(p StreamPosition) float64 { return p.Stored }))
		r.labelledGaugeFunc("hopper_stream_last_offset",
			"The offset of the last message of a stream subscription's stream (-1: none), as last looked up (every 5 s).",
			"queue", pick(func(p StreamPosition) float64 { return p.Last }))
		r.labelledGaugeFunc("hopper_stream_lag_messages",
			"Offsets of a stream subscription's stream after the one stored for its consumer name: the messages still to read (and the few offset-tracking entries among them).",
			"queue", pick(func(p StreamPosition) float64 { return p.Lag }))
	}
	if src.StreamPartitions != nil {
		pick := func(f func(StreamPosition) float64) func() map[[2]string]float64 {
			return func() map[[2]string]float64 {
				out := map[[2]string]float64{}
				for k, p := range src.StreamPartitions() {
					out[k] = f(p)
				}
				return out
			}
		}
		for _, g := range []struct {
			name, help string
			of         func(StreamPosition) float64
		}{
			{"hopper_stream_partition_stored_offset",
				"The offset stored on the broker for a super stream subscription's consumer name on one partition (-1: none yet), as last looked up (every 5 s).",
				func(p StreamPosition) float64 { return p.Stored }},
			{"hopper_stream_partition_last_offset",
				"The offset of the last message of one partition of a super stream subscription's super stream (-1: none), as last looked up (every 5 s).",
				func(p StreamPosition) float64 { return p.Last }},
			{"hopper_stream_partition_lag_messages",
				"Offsets of one partition of a super stream after the one stored for the subscription's consumer name: the messages of the partition still to read.",
				func(p StreamPosition) float64 { return p.Lag }},
			{"hopper_stream_partition_active",
				"1 while this Hopper is the reader of the partition of a super stream subscription (the broker gives each partition to one reader of the consumer name), 0 otherwise.",
				func(p StreamPosition) float64 { return p.Active }},
		} {
			r.pairGaugeFunc(g.name, g.help, [2]string{"queue", "partition"}, pick(g.of))
		}
	}
	if src.ConcurrencyLimit != nil {
		r.gaugeFunc("hopper_concurrency_limit",
			"The adaptive limit on concurrent requests to the app (between 1 and consumer.workers; 0 when the limiter is off).",
			func() float64 { return float64(src.ConcurrencyLimit()) })
	}
	if src.MovesFailing != nil {
		r.gaugeFunc("hopper_moves_failing",
			"Deliveries held now because their move (to a tier, the DLQ or back to the work queue) keeps failing; consuming is paused while it is above 0.",
			func() float64 { return float64(src.MovesFailing()) })
	}
	counterFunc := func(name, help string, f func() int64) {
		if f == nil {
			return
		}
		r.counterFunc(name, help, func() float64 { return float64(f()) })
	}
	counterFunc("hopper_header_values_dropped_total", "AMQP headers not forwarded to the app (invalid name or non-scalar value).", src.HeadersSkipped)
	if src.HeadersOmitted != nil {
		r.labelledCounterFunc("hopper_headers_omitted_total",
			"AMQP application headers the forwarding bounds left out of requests to the app, by reason (value-too-long, max-headers, max-header-bytes).",
			"reason", src.HeadersOmitted)
	}
	counterFunc("hopper_spans_dropped_total", "Trace spans that could not be exported, or that the collector rejected.", src.SpansDropped)
	return m
}

// Handler serves /metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var buf bytes.Buffer
		if err := m.reg.write(&buf); err != nil {
			http.Error(w, "write metrics: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write(buf.Bytes()) //nolint:errcheck // the scraper went away
	})
}

// Value is the current value of the first series of the metric name
// whose labels include every one given (a histogram's is its count of
// observations); ok is false when there is none.
func (m *Metrics) Value(name string, labels map[string]string) (v float64, ok bool) {
	return m.reg.lookup(name, labels)
}

// Queue records one consumed queue's deliveries; it implements
// proxy.Observer, one per delivery loop. The series every delivery
// touches are kept here, so recording one takes no lookup by label.
type Queue struct {
	m        *Metrics
	name     string
	latency  *series
	inFlight *series
	// batchSize is created on the first batch: a queue that never batches
	// shows no histogram.
	batchSize *series
	batchOnce sync.Once
	// deliveries is indexed by action and status class; a cell is filled
	// the first time that pair happens.
	deliveries [retry.Return + 1][len(classNames)]atomic.Pointer[series]
	// routed holds the hopper_routed_total series by route name.
	routed sync.Map
}

// ForQueue is the observer of the queue named.
func (m *Metrics) ForQueue(name string) *Queue {
	m.mu.Lock()
	defer m.mu.Unlock()
	if q := m.queues[name]; q != nil {
		return q
	}
	q := &Queue{m: m, name: name, latency: m.latency.with(name), inFlight: m.inFlight.with(name)}
	m.queues[name] = q
	return q
}

// Decided implements proxy.Observer.
func (q *Queue) Decided(out retry.Outcome, called bool, dec retry.Decision, latency time.Duration) {
	m := q.m
	q.delivery(dec.Action, statusClass(out, called, dec)).inc()
	if called {
		m.latency.observe(q.latency, latency.Seconds())
	}
	if dec.Reason == retry.ReasonFiltered {
		m.filtered.with(q.name).inc()
	}
	switch dec.Action {
	case retry.Retry:
		m.retries.with(q.name, tierLabel(dec.Tier)).inc()
	case retry.DLQ:
		m.deadLettered.with(q.name, dec.Reason).inc()
	case retry.Requeue:
		m.requeues.with(q.name).inc()
	case retry.Return:
		m.returns.with(q.name).inc()
	}
}

func (q *Queue) delivery(a retry.Action, class int) *series {
	if a < 0 || int(a) >= len(q.deliveries) {
		return q.m.deliveries.with(q.name, a.String(), classNames[class])
	}
	cell := &q.deliveries[a][class]
	if s := cell.Load(); s != nil {
		return s
	}
	s := q.m.deliveries.with(q.name, a.String(), classNames[class])
	cell.Store(s)
	return s
}

// MoveFailed implements proxy.Observer.
func (q *Queue) MoveFailed(move string) { q.m.movesFailed.with(q.name, move).inc() }

// InternalError counts a panic recovered while handling a message.
func (q *Queue) InternalError() { q.m.internal.with(q.name).inc() }

// The reasons hopper_order_broken_total is labelled with, as the proxy
// reports them.
const (
	OrderBrokenHoldExhausted = "hold-exhausted"
	OrderBrokenReturned      = "returned"
)

// OrderBroken counts an ordered message that left its place in line.
func (q *Queue) OrderBroken(reason string) { q.m.orderBroken.with(q.name, reason).inc() }

// Routed counts a message the routing rules let through, by its route.
func (q *Queue) Routed(route string) {
	if s, ok := q.routed.Load(route); ok {
		s.(*series).inc()
		return
	}
	s := q.m.routed.with(q.name, route)
	q.routed.Store(route, s)
	s.inc()
}

// RuleFailed counts a routing rule that could not be evaluated.
func (q *Queue) RuleFailed(kind string) { q.m.ruleFailed.with(q.name, kind).inc() }

// Parked counts a message moved to the parking queue of step.
func (q *Queue) Parked(step time.Duration) { q.m.parked.with(q.name, tierLabel(step)).inc() }

// Due records how late a message back from parking reached the app.
func (q *Queue) Due(late time.Duration) {
	q.m.lateness.observe(q.m.lateness.with(q.name), late.Seconds())
}

// Batch records the size of a batch request.
func (q *Queue) Batch(size int) {
	q.batchOnce.Do(func() { q.batchSize = q.m.batchSize.with(q.name) })
	q.m.batchSize.observe(q.batchSize, float64(size))
}

// InFlight implements proxy.Observer.
func (q *Queue) InFlight(delta int) { q.inFlight.add(float64(delta)) }

// Decided records a delivery of the first queue (see ForQueue).
func (m *Metrics) Decided(out retry.Outcome, called bool, dec retry.Decision, latency time.Duration) {
	m.first.Decided(out, called, dec, latency)
}

// MoveFailed records a failed move of the first queue.
func (m *Metrics) MoveFailed(move string) { m.first.MoveFailed(move) }

// InFlight tracks the first queue's deliveries in flight.
func (m *Metrics) InFlight(delta int) { m.first.InFlight(delta) }

// OrderBroken counts an ordered message of the first queue that left its
// place in line.
func (m *Metrics) OrderBroken(reason string) { m.first.OrderBroken(reason) }

// Batch records a batch request of the first queue.
func (m *Metrics) Batch(size int) { m.first.Batch(size) }

// Routed counts a routed message of the first queue.
func (m *Metrics) Routed(route string) { m.first.Routed(route) }

// RuleFailed counts a routing rule of the first queue that could not be
// evaluated.
func (m *Metrics) RuleFailed(kind string) { m.first.RuleFailed(kind) }

// Parked counts a parked message of the first queue.
func (m *Metrics) Parked(step time.Duration) { m.first.Parked(step) }

// Due records how late a message of the first queue came back from parking.
func (m *Metrics) Due(late time.Duration) { m.first.Due(late) }

// BreakerOpened counts the breaker opening.
func (m *Metrics) BreakerOpened() { m.breakerOpens.inc() }

// SetBreaker records the breaker's state.
func (m *Metrics) SetBreaker(state string) {
	for _, s := range []string{"closed", "open", "half-open"} {
		v := 0.0
		if s == state {
			v = 1
		}
		m.breaker.with(s).set(v)
	}
}

// CredentialsRefused counts the app starting to refuse Hopper's
// credentials.
func (m *Metrics) CredentialsRefused() { m.refusals.inc() }

// Reconnected counts a consumer reconnect.
func (m *Metrics) Reconnected() { m.reconnects.inc() }

// classNames are the status_class label values, indexed as statusClass
// returns them.
var classNames = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx", "timeout", "unavailable", "refused", "expired", "invalid", "cut", "filtered"}

const (
	classTimeout = 5 + iota
	classUnavailable
	classRefused
	classExpired
	classInvalid
	classCut
	classFiltered
)

func statusClass(o retry.Outcome, called bool, dec retry.Decision) int {
	switch {
	case !called && dec.Reason == retry.ReasonExpired:
		return classExpired
	case !called && (dec.Reason == retry.ReasonFiltered || dec.Reason == retry.ReasonFilterError):
		return classFiltered
	case o.Refused:
		return classRefused
	case o.Kind == retry.Timeout:
		return classTimeout
	case o.Kind == retry.Unavailable:
		return classUnavailable
	case o.Kind == retry.Cut:
		return classCut
	case o.Status >= 100 && o.Status < 600:
		return o.Status/100 - 1
	}
	return classInvalid
}

// tierLabel is written as in the tier queue's name ("2m", not "2m0s").
func tierLabel(d time.Duration) string {
	if d <= 0 {
		return "none"
	}
	return config.FormatDuration(d)
}
