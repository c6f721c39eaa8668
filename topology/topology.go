// Package topology computes the queues Hopper uses around a work queue
// (see the README's "Queues Hopper uses"): one delay queue per tier that dead-letters back to the work
// queue only, a dead-letter queue, and the exchanges and bindings that
// route messages to the work queue. It is pure; the broker package
// declares or verifies what it computes.
package topology

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hopper-sidecar/hopper/config"
)

// Queue is one queue with its declare arguments.
type Queue struct {
	Name string
	// Role is work, tier or dlq.
	Role string
	// Delay is the tier's delay (tier queues only).
	Delay time.Duration
	// Args are the x-arguments it is declared with.
	Args map[string]any
	// Owned queues are Hopper's; the work queue is the operator's unless
	// topology.declare is true, and is then only checked for existence.
	Owned bool
	// Unbounded marks a quorum queue whose messages no delivery limit may
	// drop: a tier and the DLQ, which nothing consumes but the operator's
	// tools. RabbitMQ 4.x gives every quorum queue a delivery limit of 20
	// unless x-delivery-limit says otherwise, and reads a negative one as
	// no limit; RabbitMQ 3.x has no limit unless one is set, and drops a
	// message at its first return under a negative one. So the broker
	// package adds x-delivery-limit -1 when the broker is 4.x or later,
	// and nothing on 3.x. A policy's delivery-limit still wins over -1
	// (the broker takes the larger when either is negative).
	Unbounded bool
	// Checked are the arguments of an operator's work queue that the
	// config asks for (queue.arguments, queue.singleActiveConsumer): with
	// topology.declare false they are verified against the queue, which
	// is otherwise only checked to exist.
	Checked []string
	// Successor is the name a tier takes when a queue of another type
	// already holds its name: a classic tier declared by an earlier
	// Hopper, whose type cannot change while it exists. The old tier
	// still hands what it holds back to the work queue as each delay runs
	// out; new retries go to the successor. Tier queues only.
	Successor string
}

// Stream is the stream a stream subscription reads, and what it is
// declared with when Hopper declares it.
type Stream struct {
	Name     string
	Consumer string
	// Args are x-max-age, x-max-length-bytes and
	// x-stream-max-segment-size-bytes, where set.
	Args map[string]any
	// Partitions is, for a super stream, the partition count it is
	// declared with (each partition gets Args); 0 for a stream.
	Partitions int
}

// ArgSingleActiveConsumer is the argument of a single-active-consumer queue.
const ArgSingleActiveConsumer = "x-single-active-consumer"

// Exchange is an exchange the work queue is bound to.
type Exchange struct {
	Name    string
	Type    string
	Durable bool
	// Owned exchanges are declared (topology.declare true) or checked for
	// their type; the broker's own amq.* exchanges are only checked to exist.
	Owned bool
	// Args are the exchange's arguments: hash-header on a partitions
	// exchange that hashes a header.
	Args map[string]any
}

// ConsistentHash is the type of the exchange in front of partitions; the
// broker knows it only with the rabbitmq_consistent_hash_exchange plugin
// enabled.
const ConsistentHash = "x-consistent-hash"

// Binding binds the work queue to an exchange with one routing key (or
// header match); or, with ToExchange set, binds the exchange ToExchange
// instead (an operator's exchange feeding the partitions exchange).
type Binding struct {
	Exchange   string
	Queue      string
	ToExchange string
	RoutingKey string
	// Args are the binding arguments: x-match and the headers of a headers
	// exchange.
	Args map[string]any
}

// Plan is the whole topology for one work queue.
type Plan struct {
	// Stream is the stream a stream subscription reads, Work being the
	// queue beside it; nil for a queue. It is not one of Queues: the
	// stream reader declares or checks it, through the stream protocol.
	Stream *Stream
	Work   Queue
	Tiers  []Queue
	// Parking are the parking queues of scheduled messages, shortest
	// delay first; none unless schedule.enabled.
	Parking   []Queue
	DLQ       Queue
	Exchanges []Exchange
	Bindings  []Binding
	// Declare says whether run declares (true) or only verifies.
	Declare bool
	// TierTypeChosen is true when the config names the tiers' type
	// (queue.tierType): a tier of another type is then refused. Left to
	// the default, an existing tier of the other type is kept working
	// (see Queue.Successor).
	TierTypeChosen bool

	// inUse holds the tier names the broker package settled on, which
	// differ from Tiers' names only where a tier was succeeded. It is
	// shared by copies of the plan and read by every move to a tier while
	// a reconnect may write it.
	inUse *tierNames
}

type tierNames struct {
	mu    sync.RWMutex
	names map[time.Duration]string
	notes map[string]string // by tier name
}

// NoteTier records what an operator should know about the tier named
// name (it was succeeded, or kept although of another type); one note per
// tier, the latest kept.
func (p *Plan) NoteTier(name, note string) {
	if p.inUse == nil {
		return
	}
	p.inUse.mu.Lock()
	defer p.inUse.mu.Unlock()
	if p.inUse.notes == nil {
		p.inUse.notes = map[string]string{}
	}
	p.inUse.notes[name] = note
}

// TierNotes returns the notes NoteTier recorded, in tier name order.
func (p *Plan) TierNotes() []string {
	if p.inUse == nil {
		return nil
	}
	p.inUse.mu.RLock()
	defer p.inUse.mu.RUnlock()
	var out []string
	for _, k := range slices.Sorted(maps.Keys(p.inUse.notes)) {
		out = append(out, p.inUse.notes[k])
	}
	return out
}

// UseTier records the queue that takes the retries of delay d: its own
// name or its successor, as found on the broker.
func (p *Plan) UseTier(d time.Duration, name string) {
	if p.inUse == nil {
		return // a plan not made by FromConfig: its names are final
	}
	p.inUse.mu.Lock()
	defer p.inUse.mu.Unlock()
	if p.inUse.names == nil {
		p.inUse.names = map[time.Duration]string{}
	}
	p.inUse.names[d] = name
}

// Roles.
const (
	RoleWork = "work"
	RoleTier = "tier"
	RoleDLQ  = "dlq"
	RolePark = "park"
)

// Name expands a name template: {queue} and {delay}.
func Name(tmpl, queue string, delay time.Duration) string {
	r := strings.NewReplacer("{queue}", queue, "{delay}", config.FormatDuration(delay))
	return r.Replace(tmpl)
}

// FromConfig computes the plan for a validated config.
func FromConfig(c *config.Config) Plan {
	if c.Queue.Type == config.QueueTypeStream {
		// The queues around a stream are those of the subscription's own
		// queue, where its retries come back.
		e := c.ForStream()
		c = &e
	}
	var stream *Stream
	if st := c.Queue.Stream; st.Name != "" {
		stream = &Stream{Name: st.Name, Consumer: st.Consumer, Args: map[string]any{}}
		if st.SuperStream {
			stream.Partitions = st.Partitions
		}
		if st.MaxAge > 0 {
			stream.Args["x-max-age"] = strconv.FormatInt(int64(st.MaxAge.D().Seconds()), 10) + "s"
		}
		if st.MaxLengthBytes > 0 {
			stream.Args["x-max-length-bytes"] = int64(st.MaxLengthBytes)
		}
		if st.MaxSegmentSizeBytes > 0 {
			stream.Args["x-stream-max-segment-size-bytes"] = int64(st.MaxSegmentSizeBytes)
		}
	}
	q := c.Queue.Name
	typeArgs := func() map[string]any {
		if c.Queue.Type == "quorum" {
			return map[string]any{"x-queue-type": "quorum"}
		}
		return map[string]any{"x-queue-type": "classic", "x-queue-version": int32(2)}
	}
	p := Plan{Stream: stream, Declare: c.Topology.Declare, TierTypeChosen: c.Queue.TierType != "", inUse: &tierNames{}}
	p.Work = Queue{Name: q, Role: RoleWork, Args: typeArgs(), Owned: c.Topology.Declare}
	if c.Queue.Type == "quorum" && c.Queue.DeliveryLimit > 0 {
		p.Work.Args["x-delivery-limit"] = int32(c.Queue.DeliveryLimit)
	}
	// The operator's further arguments and single active consumer are
	// what the work queue must have whether Hopper declares it or only
	// verifies it: Checked names them for the verify.
	for k, a := range c.Queue.Arguments {
		p.Work.Args[k] = a.Value()
		p.Work.Checked = append(p.Work.Checked, k)
	}
	if c.Queue.SAC() {
		p.Work.Args[ArgSingleActiveConsumer] = true
		p.Work.Checked = append(p.Work.Checked, ArgSingleActiveConsumer)
	}
	slices.Sort(p.Work.Checked)
	// A classic tier dead-letters at most once: a message whose delay
	// runs out while the broker stops can be dropped after Hopper acked
	// the original. A quorum tier with at-least-once dead-lettering
	// cannot drop it, so tiers are quorum unless the config opts in to
	// classic ones.
	tierQuorum := c.Queue.Type == "quorum" || c.Queue.TierType != "classic"
	tierType := "classic"
	if tierQuorum {
		tierType = "quorum"
	}
	for _, d := range c.AllTiers() {
		args := typeArgs()
		if tierQuorum {
			args = map[string]any{"x-queue-type": "quorum"}
		}
		// Expiry happens only at the head of a queue, so each delay has its
		// own queue; expired messages go back to the work queue alone, via
		// the default exchange, never fanned out again.
		args["x-message-ttl"] = int32(d / time.Millisecond)
		args["x-dead-letter-exchange"] = ""
		args["x-dead-letter-routing-key"] = q
		if tierQuorum {
			// Quorum queues dead-letter at-most-once by default; at-least-once
			// needs reject-publish overflow.
			args["x-dead-letter-strategy"] = "at-least-once"
			args["x-overflow"] = "reject-publish"
		}
		name := Name(c.Topology.RetryQueue, q, d)
		p.Tiers = append(p.Tiers, Queue{
			Name: name, Role: RoleTier, Delay: d, Args: args, Owned: true,
			Unbounded: tierQuorum, Successor: name + "." + tierType,
		})
	}
	if c.Schedule.Enabled {
		p.Parking = parking(c)
	}
	dargs := typeArgs()
	if c.Topology.DLQMaxLength > 0 {
		dargs["x-max-length"] = int32(c.Topology.DLQMaxLength)
		// Never drop the head silently: refuse the publish so the message
		// stays in the work queue.
		dargs["x-overflow"] = "reject-publish"
	}
	p.DLQ = Queue{Name: Name(c.Topology.DLQ, q, 0), Role: RoleDLQ, Args: dargs, Owned: true, Unbounded: c.Queue.Type == "quorum"}
	if p.Work.Owned {
		// What the broker itself drops from the work queue (a quorum queue's
		// delivery limit, a per-message TTL running out while consuming is
		// paused, a max-length overflow) lands in the DLQ instead of
		// vanishing. The DLQ tools read the broker's x-death reason on it.
		p.Work.Args["x-dead-letter-exchange"] = ""
		p.Work.Args["x-dead-letter-routing-key"] = p.DLQ.Name
		if c.Queue.Type == "quorum" {
			p.Work.Args["x-dead-letter-strategy"] = "at-least-once"
			p.Work.Args["x-overflow"] = "reject-publish"
		}
	}
	if base := c.Topology.PartitionOf; base != "" {
		partition(&p, c, base)
		return p
	}
	p.Exchanges, p.Bindings = bindings(c.Topology.Bindings, q, "")
	return p
}

// parking plans the ladder of parking queues: one per delay, since the
// broker expires messages only at a queue's head, each dead-lettering to
// the work queue alone. They are quorum queues with at-least-once
// dead-lettering on every work queue type, as the default tiers are: a
// parked message must survive a broker restart, and a classic queue
// dead-letters at most once.
func parking(c *config.Config) []Queue {
	var out []Queue
	for _, d := range c.ParkSteps() {
		out = append(out, Queue{
			Name: Name(c.Topology.ParkQueue, c.Queue.Name, d), Role: RolePark, Delay: d, Owned: true, Unbounded: true,
			Args: map[string]any{
				"x-queue-type":              "quorum",
				"x-message-ttl":             int32(d / time.Millisecond),
				"x-dead-letter-exchange":    "",
				"x-dead-letter-routing-key": c.Queue.Name,
				"x-dead-letter-strategy":    "at-least-once",
				"x-overflow":                "reject-publish",
			},
		})
	}
	return out
}

// ParkQueue returns the parking queue of delay d.
func (p *Plan) ParkQueue(d time.Duration) (string, bool) {
	for _, q := range p.Parking {
		if q.Delay == d {
			return q.Name, true
		}
	}
	return "", false
}

// partition makes p the plan of one partition queue of base: the queue has
// one active consumer at a time (the broker hands its messages to the next
// consumer, in order, when that one goes), it is bound with weight 1 to the
// consistent-hash exchange, and the operator's bindings feed that exchange
// rather than a queue, so a publisher's message reaches exactly one
// partition, always the same for one key.
func partition(p *Plan, c *config.Config, base string) {
	p.Work.Args[ArgSingleActiveConsumer] = true
	hash := Exchange{Name: config.PartitionExchange(base), Type: ConsistentHash, Durable: true, Owned: true}
	if h := c.Topology.Partitions.HashHeader(); h != "" {
		hash.Args = map[string]any{"hash-header": h}
	}
	exs, bs := bindings(c.Topology.Bindings, "", hash.Name)
	// The hash exchange first: the operator's exchanges are bound to it.
	p.Exchanges = append([]Exchange{hash}, exs...)
	// The binding key of a consistent-hash exchange is the partition's
	// weight: equal weights give each partition an equal share of keys.
	p.Bindings = append([]Binding{{Exchange: hash.Name, Queue: p.Work.Name, RoutingKey: "1"}}, bs...)
}

// Partitioned says whether the plan is one partition queue's.
func (p *Plan) Partitioned() bool {
	return len(p.Exchanges) > 0 && p.Exchanges[0].Type == ConsistentHash
}

// PartitionExchange is the consistent-hash exchange a message for a
// partition of queue base is published to, when queue names a partition
// queue (base.p<n>); ok is false for any other queue.
func PartitionExchange(queue string) (exchange string, ok bool) {
	i := strings.LastIndex(queue, ".p")
	if i <= 0 || i+2 == len(queue) {
		return "", false
	}
	n, err := strconv.Atoi(queue[i+2:])
	if err != nil || n < 0 || n >= config.MaxPartitions || strconv.Itoa(n) != queue[i+2:] {
		return "", false
	}
	return config.PartitionExchange(queue[:i]), true
}

// bindings turns the configured bindings into exchanges (each once, in
// order) and one binding per routing key or header match.
func bindings(bs []config.Binding, queue, toExchange string) ([]Exchange, []Binding) {
	var exs []Exchange
	var out []Binding
	for _, b := range bs {
		if !slices.ContainsFunc(exs, func(e Exchange) bool { return e.Name == b.Exchange }) {
			exs = append(exs, Exchange{Name: b.Exchange, Type: b.Type, Durable: b.IsDurable(), Owned: !strings.HasPrefix(b.Exchange, "amq.")})
		}
		switch b.Type {
		case "fanout":
			out = append(out, Binding{Exchange: b.Exchange, Queue: queue, ToExchange: toExchange})
		case "headers":
			match := b.Match
			if match == "" {
				match = "all"
			}
			args := map[string]any{"x-match": match}
			for k, v := range b.Headers {
				args[k] = v
			}
			out = append(out, Binding{Exchange: b.Exchange, Queue: queue, ToExchange: toExchange, Args: args})
		default:
			for _, k := range b.RoutingKeys {
				out = append(out, Binding{Exchange: b.Exchange, Queue: queue, ToExchange: toExchange, RoutingKey: k})
			}
		}
	}
	return exs, out
}

// TierQueue returns the queue name for a delay: the tier's own, or its
// successor's when the broker package found the tier's name held by a
// queue of another type.
func (p *Plan) TierQueue(d time.Duration) (string, bool) {
	if p.inUse != nil {
		p.inUse.mu.RLock()
		name, ok := p.inUse.names[d]
		p.inUse.mu.RUnlock()
		if ok {
			return name, true
		}
	}
	for _, t := range p.Tiers {
		if t.Delay == d {
			return t.Name, true
		}
	}
	return "", false
}

// Queues lists work, tiers, parking queues and DLQ in declare order.
func (p *Plan) Queues() []Queue {
	out := []Queue{p.Work}
	out = append(out, p.Tiers...)
	out = append(out, p.Parking...)
	return append(out, p.DLQ)
}

// Warnings lists risky but legal setups, for the operator to read.
func (p *Plan) Warnings() []string {
	var w []string
	if !p.Work.Owned {
		w = append(w, fmt.Sprintf("work queue %q is declared by the operator: give it x-dead-letter-exchange=\"\" and x-dead-letter-routing-key=%q, or whatever the broker drops from it (delivery limit, message TTL, max-length) is lost instead of landing in the DLQ", p.Work.Name, p.DLQ.Name))
	}
	if limit, ok := p.Work.Args["x-delivery-limit"]; ok && !p.Work.Owned {
		// Verified, never declared: the broker keeps the arguments the
		// queue was made with, and a policy's.
		w = append(w, fmt.Sprintf("queue.deliveryLimit %v is not applied: topology.declare is false, so work queue %q keeps the x-delivery-limit it was declared with (or a policy's delivery-limit); set it there, or let Hopper declare the queue", limit, p.Work.Name))
	}
	if p.Work.Args["x-queue-type"] == "quorum" {
		if _, ok := p.Work.Args["x-delivery-limit"]; !ok {
			w = append(w, fmt.Sprintf("quorum work queue %q has no x-delivery-limit: RabbitMQ 4.x applies a default of 20 returns; Hopper republishes messages it gives back instead of nacking them so the limit is not spent on messages the app never saw", p.Work.Name))
		}
	}
	if len(p.Tiers) > 0 && p.Tiers[0].Args["x-queue-type"] == "classic" {
		w = append(w, fmt.Sprintf("delay tiers of %q are classic queues (queue.tierType: classic): a classic tier hands a retry back at most once, and RabbitMQ can drop one whose delay runs out while the broker stops, after Hopper acked the original; quorum tiers (the default) cannot", p.Work.Name))
	}
	for _, q := range p.Queues() {
		for _, k := range sortedKeys(q.Args) {
			if why, ok := brokerVersionNotes[k]; ok && (k != "x-queue-version" || fmt.Sprint(q.Args[k]) == "1") {
				w = append(w, fmt.Sprintf("%s queue %q: %s=%v: %s", q.Role, q.Name, k, q.Args[k], why))
			}
		}
	}
	return w
}

// brokerVersionNotes are queue arguments that some supported RabbitMQ
// release refuses or ignores although another accepts them, so that a
// config valid against one broker fails, or quietly means nothing, on the
// next. (x-queue-version is noted for version 1 only.)
var brokerVersionNotes = map[string]string{
	"x-queue-version":        "RabbitMQ 4.x refuses it (\"unsupported queue version '1'\"): classic queues have only version 2 there; leave it out or set 2",
	"x-queue-mode":           "RabbitMQ 3.12 and later accept it and ignore it (every classic queue keeps its messages on disk as lazy ones did)",
	"x-queue-master-locator": "RabbitMQ 4.x refuses it as a deprecated feature (queue_master_locator) and closes the connection: use x-queue-leader-locator",
}

// String renders the plan for `hopper topology plan`.
func (p *Plan) String() string {
	var b strings.Builder
	mode := "verify (topology.declare=false)"
	if p.Declare {
		mode = "declare (topology.declare=true)"
	}
	fmt.Fprintf(&b, "mode: %s\n", mode)
	if st := p.Stream; st != nil {
		if st.Partitions > 0 {
			fmt.Fprintf(&b, "super stream %s (%d partitions %s-0…, when declared) read as consumer %s (stream protocol, by hopper run)",
				st.Name, st.Partitions, st.Name, st.Consumer)
		} else {
			fmt.Fprintf(&b, "stream %s read as consumer %s (stream protocol, by hopper run)", st.Name, st.Consumer)
		}
		for _, k := range sortedKeys(st.Args) {
			fmt.Fprintf(&b, " %s=%v", k, st.Args[k])
		}
		b.WriteByte('\n')
	}
	for _, q := range p.Queues() {
		fmt.Fprintf(&b, "%-5s %s durable=true", q.Role, q.Name)
		for _, k := range sortedKeys(q.Args) {
			fmt.Fprintf(&b, " %s=%v", k, q.Args[k])
		}
		if q.Unbounded {
			b.WriteString(" (and x-delivery-limit=-1 on RabbitMQ 4.x)")
		}
		if !q.Owned && len(q.Checked) > 0 {
			fmt.Fprintf(&b, " (checked: %s)", strings.Join(q.Checked, ", "))
		}
		b.WriteByte('\n')
	}
	for _, e := range p.Exchanges {
		fmt.Fprintf(&b, "exchange %s type=%s durable=%t", e.Name, e.Type, e.Durable)
		for _, k := range sortedKeys(e.Args) {
			fmt.Fprintf(&b, " %s=%v", k, e.Args[k])
		}
		if e.Type == ConsistentHash {
			b.WriteString(" (needs: rabbitmq-plugins enable rabbitmq_consistent_hash_exchange)")
		}
		if !e.Owned {
			b.WriteString(" (the broker's own: checked, not declared)")
		}
		b.WriteByte('\n')
	}
	for _, bd := range p.Bindings {
		if bd.ToExchange != "" {
			fmt.Fprintf(&b, "binding %s -> exchange %s", bd.Exchange, bd.ToExchange)
		} else {
			fmt.Fprintf(&b, "binding %s -> %s", bd.Exchange, bd.Queue)
		}
		if len(bd.Args) > 0 {
			for _, k := range sortedKeys(bd.Args) {
				fmt.Fprintf(&b, " %s=%v", k, bd.Args[k])
			}
		} else {
			fmt.Fprintf(&b, " routingKey=%q", bd.RoutingKey)
		}
		b.WriteByte('\n')
	}
	for _, w := range p.Warnings() {
		fmt.Fprintf(&b, "warning: %s\n", w)
	}
	return b.String()
}

// Document is the plan as data, for `hopper topology plan -o json`.
type Document struct {
	Declare bool `json:"declare"`
	// Stream is the stream a stream subscription reads; absent for a
	// queue.
	Stream    *DocStream    `json:"stream,omitempty"`
	Queues    []DocQueue    `json:"queues"`
	Exchanges []DocExchange `json:"exchanges"`
	Bindings  []DocBinding  `json:"bindings"`
	Warnings  []string      `json:"warnings"`
}

// DocStream is the stream of a Document.
type DocStream struct {
	Name      string         `json:"name"`
	Consumer  string         `json:"consumer"`
	Arguments map[string]any `json:"arguments,omitempty"`
	// Partitions is a super stream's partition count when declared.
	Partitions int `json:"partitions,omitempty"`
}

// DocExchange is one exchange of a Document.
type DocExchange struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Durable bool   `json:"durable"`
	Owned   bool   `json:"owned"`
	// Arguments: hash-header for a partitions exchange hashing a header.
	Arguments map[string]any `json:"arguments,omitempty"`
}

// DocBinding is one binding of a Document.
type DocBinding struct {
	Exchange   string         `json:"exchange"`
	Queue      string         `json:"queue,omitempty"`
	ToExchange string         `json:"toExchange,omitempty"`
	RoutingKey string         `json:"routingKey"`
	Arguments  map[string]any `json:"arguments,omitempty"`
}

// DocQueue is one queue of a Document.
type DocQueue struct {
	Role      string         `json:"role"`
	Name      string         `json:"name"`
	Durable   bool           `json:"durable"`
	Delay     string         `json:"delay,omitempty"`
	Owned     bool           `json:"owned"`
	Arguments map[string]any `json:"arguments"`
	// UnlimitedDeliveries: declared with x-delivery-limit -1 as well on
	// RabbitMQ 4.x (see Queue.Unbounded).
	UnlimitedDeliveries bool `json:"unlimitedDeliveries,omitempty"`
}

// Document returns the plan as data.
func (p *Plan) Document() Document {
	d := Document{Declare: p.Declare, Warnings: p.Warnings()}
	if st := p.Stream; st != nil {
		d.Stream = &DocStream{Name: st.Name, Consumer: st.Consumer, Arguments: st.Args, Partitions: st.Partitions}
	}
	if d.Warnings == nil {
		d.Warnings = []string{}
	}
	for _, q := range p.Queues() {
		dq := DocQueue{Role: q.Role, Name: q.Name, Durable: true, Owned: q.Owned, Arguments: q.Args, UnlimitedDeliveries: q.Unbounded}
		if q.Delay > 0 {
			dq.Delay = config.FormatDuration(q.Delay)
		}
		d.Queues = append(d.Queues, dq)
	}
	d.Exchanges, d.Bindings = []DocExchange{}, []DocBinding{}
	for _, e := range p.Exchanges {
		d.Exchanges = append(d.Exchanges, DocExchange{Name: e.Name, Type: e.Type, Durable: e.Durable, Owned: e.Owned, Arguments: e.Args})
	}
	for _, b := range p.Bindings {
		d.Bindings = append(d.Bindings, DocBinding{Exchange: b.Exchange, Queue: b.Queue, ToExchange: b.ToExchange, RoutingKey: b.RoutingKey, Arguments: b.Args})
	}
	return d
}

func sortedKeys(m map[string]any) []string {
	return slices.Sorted(maps.Keys(m))
}
