package telemetry

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/retry"
)

// Metrics are Hopper's Prometheus metrics. Labels are bounded: queue takes
// one value per consumed queue, and outcome, status class, tier, reason and
// state a handful each; no message ids or routing keys.
type Metrics struct {
	reg *prometheus.Registry
	// queue is the label of the first consumed queue: what the Observer
	// methods on Metrics itself record under.
	queue string

	deliveries   *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	inFlight     *prometheus.GaugeVec
	retries      *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	requeues     *prometheus.CounterVec
	returns      *prometheus.CounterVec
	movesFailed  *prometheus.CounterVec
	breaker      *prometheus.GaugeVec
	breakerOpens prometheus.Counter
	reconnects   prometheus.Counter
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
	Tiers          []time.Duration
	Connected      func() bool
	Paused         func() bool
	HeadersSkipped func() int64
	SpansDropped   func() int64
	MovesFailing   func() int64
	// ConcurrencyLimit is the adaptive limit on concurrent app requests.
	ConcurrencyLimit func() int64
}

// NewMetrics registers every metric on a fresh registry (one per sidecar,
// so tests can run several).
func NewMetrics(src Sources) *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &Metrics{
		reg: reg,
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hopper_deliveries_total",
			Help: "Deliveries by decision (ack, drop, requeue, retry, dlq, return) and app status class (2xx..5xx, timeout, unavailable, refused, expired).",
		}, []string{"queue", "outcome", "status_class"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hopper_delivery_duration_seconds",
			Help:    "Time from sending a message to the app to its answer (or failure).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"queue"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hopper_in_flight", Help: "Deliveries being processed now.",
		}, []string{"queue"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hopper_retries_total", Help: "Messages sent to a delay tier, by tier.",
		}, []string{"queue", "tier"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hopper_dead_lettered_total", Help: "Messages dead-lettered, by reason.",
		}, []string{"queue", "reason"}),
		requeues: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hopper_requeues_total", Help: "425 Too Early requeues.",
		}, []string{"queue"}),
		returns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hopper_returns_total", Help: "Messages returned to the work queue because the app could not take them.",
		}, []string{"queue"}),
		movesFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hopper_moves_failed_total", Help: "Move publishes that failed (each retry counts); the original is held and the move retried.",
		}, []string{"queue", "move"}),
		breaker: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hopper_breaker_state", Help: "1 for the circuit breaker's current state.",
		}, []string{"state"}),
		breakerOpens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hopper_breaker_opens_total", Help: "Times the circuit breaker opened (the app unavailable).",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hopper_broker_reconnects_total", Help: "Consumer reconnects after a lost connection, channel or consumer.",
		}),
	}
	version := src.Version
	if version == "" {
		version = "dev"
	}
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hopper_build_info", Help: "Always 1, labelled with the running binary's version.",
	}, []string{"version"})
	buildInfo.WithLabelValues(version).Set(1)
	reg.MustRegister(buildInfo)
	// Every label set a counter will take starts at 0, so that rate() and
	// increase() see a series from the first scrape, not from the first
	// event.
	queues := src.Queues
	if len(queues) == 0 {
		queues = []string{""}
	}
	m.queue = queues[0]
	for _, q := range queues {
		for _, a := range []retry.Action{retry.Ack, retry.Drop, retry.Requeue, retry.Retry, retry.DLQ, retry.Return} {
			for _, c := range []string{"2xx", "4xx", "5xx", "timeout", "unavailable", "refused"} {
				m.deliveries.WithLabelValues(q, a.String(), c)
			}
		}
		for _, r := range []string{retry.ReasonMaxAttempts, retry.ReasonNonRetriable, retry.ReasonExpired,
			retry.ReasonTooEarly, retry.ReasonAppAction, retry.ReasonAppCrash} {
			m.deadLettered.WithLabelValues(q, r)
		}
		for _, d := range src.Tiers {
			m.retries.WithLabelValues(q, tierLabel(d))
		}
		for _, mv := range []string{"retry", "requeue", "dlq", "return"} {
			m.movesFailed.WithLabelValues(q, mv)
		}
		m.requeues.WithLabelValues(q)
		m.returns.WithLabelValues(q)
		m.inFlight.WithLabelValues(q)
		m.latency.WithLabelValues(q)
	}
	reg.MustRegister(m.deliveries, m.latency, m.inFlight, m.retries, m.deadLettered, m.requeues,
		m.returns, m.movesFailed, m.breaker, m.breakerOpens, m.reconnects)
	m.SetBreaker("closed")
	boolGauge := func(name, help string, f func() bool) {
		if f == nil {
			return
		}
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			if f() {
				return 1
			}
			return 0
		}))
	}
	boolGauge("hopper_broker_connected", "1 while the consumer's broker connection is up.", src.Connected)
	boolGauge("hopper_consumer_paused", "1 while consuming is paused on purpose (breaker open, or moves failing).", src.Paused)
	if src.ConcurrencyLimit != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hopper_concurrency_limit",
			Help: "The adaptive limit on concurrent requests to the app (between 1 and consumer.workers; 0 when the limiter is off).",
		}, func() float64 { return float64(src.ConcurrencyLimit()) }))
	}
	if src.MovesFailing != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hopper_moves_failing",
			Help: "Deliveries held now because their move (to a tier, the DLQ or back to the work queue) keeps failing; consuming is paused while it is above 0.",
		}, func() float64 { return float64(src.MovesFailing()) }))
	}
	counterFunc := func(name, help string, f func() int64) {
		if f == nil {
			return
		}
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 {
			return float64(f())
		}))
	}
	counterFunc("hopper_header_values_dropped_total", "AMQP headers not forwarded to the app (invalid name or non-scalar value).", src.HeadersSkipped)
	counterFunc("hopper_spans_dropped_total", "Trace spans that could not be exported.", src.SpansDropped)
	return m
}

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Registry is the registry, for tests.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Queue records one consumed queue's deliveries; it implements
// proxy.Observer, one per delivery loop.
type Queue struct {
	m    *Metrics
	name string
}

// ForQueue is the observer of the queue named.
func (m *Metrics) ForQueue(name string) *Queue { return &Queue{m: m, name: name} }

// Decided implements proxy.Observer.
func (q *Queue) Decided(out retry.Outcome, called bool, dec retry.Decision, latency time.Duration) {
	m := q.m
	m.deliveries.WithLabelValues(q.name, dec.Action.String(), statusClass(out, called, dec)).Inc()
	if called {
		m.latency.WithLabelValues(q.name).Observe(latency.Seconds())
	}
	switch dec.Action {
	case retry.Retry:
		m.retries.WithLabelValues(q.name, tierLabel(dec.Tier)).Inc()
	case retry.DLQ:
		m.deadLettered.WithLabelValues(q.name, dec.Reason).Inc()
	case retry.Requeue:
		m.requeues.WithLabelValues(q.name).Inc()
	case retry.Return:
		m.returns.WithLabelValues(q.name).Inc()
	}
}

// MoveFailed implements proxy.Observer.
func (q *Queue) MoveFailed(move string) { q.m.movesFailed.WithLabelValues(q.name, move).Inc() }

// InFlight implements proxy.Observer.
func (q *Queue) InFlight(delta int) { q.m.inFlight.WithLabelValues(q.name).Add(float64(delta)) }

// Decided records a delivery of the first queue (see ForQueue).
func (m *Metrics) Decided(out retry.Outcome, called bool, dec retry.Decision, latency time.Duration) {
	m.ForQueue(m.queue).Decided(out, called, dec, latency)
}

// MoveFailed records a failed move of the first queue.
func (m *Metrics) MoveFailed(move string) { m.ForQueue(m.queue).MoveFailed(move) }

// InFlight tracks the first queue's deliveries in flight.
func (m *Metrics) InFlight(delta int) { m.ForQueue(m.queue).InFlight(delta) }

// BreakerOpened counts the breaker opening.
func (m *Metrics) BreakerOpened() { m.breakerOpens.Inc() }

// SetBreaker records the breaker's state.
func (m *Metrics) SetBreaker(state string) {
	for _, s := range []string{"closed", "open", "half-open"} {
		v := 0.0
		if s == state {
			v = 1
		}
		m.breaker.WithLabelValues(s).Set(v)
	}
}

// Reconnected counts a consumer reconnect.
func (m *Metrics) Reconnected() { m.reconnects.Inc() }

func statusClass(o retry.Outcome, called bool, dec retry.Decision) string {
	switch {
	case !called && dec.Reason == retry.ReasonExpired:
		return "expired"
	case o.Refused:
		return "refused"
	case o.Kind == retry.Timeout:
		return "timeout"
	case o.Kind == retry.Unavailable:
		return "unavailable"
	case o.Status >= 100 && o.Status < 600:
		return strconv.Itoa(o.Status/100) + "xx"
	}
	return "invalid"
}

// tierLabel is written as in the tier queue's name ("2m", not "2m0s").
func tierLabel(d time.Duration) string {
	if d <= 0 {
		return "none"
	}
	return config.FormatDuration(d)
}
