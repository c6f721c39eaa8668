// Package config is Hopper's one typed configuration: loaded from a YAML file,
// overridden by HOPPER_* environment variables and then by flags, and
// validated with every problem reported at once, each with its key path.
package config

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the whole configuration. Every key has a default (see Default)
// except the work queue's name: queue.name, or a name in each of
// subscriptions.
type Config struct {
	Broker   Broker   `yaml:"broker"`
	Queue    Queue    `yaml:"queue"`
	Topology Topology `yaml:"topology"`
	App      App      `yaml:"app"`
	Consumer Consumer `yaml:"consumer"`
	Retry    Retry    `yaml:"retry"`
	Requeue  Requeue  `yaml:"requeue"`
	Schedule Schedule `yaml:"schedule"`
	Breaker  Breaker  `yaml:"breaker"`
	Limiter  Limiter  `yaml:"limiter"`
	Shutdown Shutdown `yaml:"shutdown"`
	Admin    Admin    `yaml:"admin"`
	Log      Log      `yaml:"log"`

	// Routes send the queue's messages to app paths (and retry policies)
	// of their own, chosen by expressions over routingKey, exchange,
	// headers, properties and body; the first route whose match is true
	// wins, and a message no route takes goes to app.url. Each route's
	// name labels its messages in metrics, traces and logs. With
	// subscriptions each subscription sets its own and this key stays
	// empty. Default none.
	Routes []Route `yaml:"routes,omitempty"`
	// Filter is an expression a message must make true to be delivered;
	// the messages it makes false are settled by onFiltered without
	// reaching the app (and counted in hopper_filtered_total), those it
	// cannot be evaluated for by onFilterError. With subscriptions each
	// subscription sets its own. Default "" (every message is delivered).
	Filter string `yaml:"filter,omitempty"`
	// OnFiltered is ack (the message is acked unseen) or dlq (it is
	// dead-lettered with reason filtered: publish, confirm, then ack). It
	// applies only to messages the filter makes false. Default "" (ack).
	OnFiltered string `yaml:"onFiltered,omitempty"`
	// OnBodyError says what a rule that reads a body which is not JSON
	// does: skip (the rule decides nothing: a route does not match, a
	// filter is settled by onFilterError) or dlq (the message is
	// dead-lettered with reason filter-error, whichever rule read the
	// body). Default "" (skip).
	OnBodyError string `yaml:"onBodyError,omitempty"`
	// OnFilterError says what becomes of a message the filter cannot be
	// evaluated for (a run-time error, such as a missing header ordered
	// against a number, or a body that is not JSON with onBodyError skip):
	// dlq (dead-lettered with reason filter-error and the cause in
	// x-final-error, to be replayed once the filter or the publisher is
	// fixed) or deliver (on to the routes, as if there were no filter).
	// Such a message is never filtered: a filter that fails on every
	// message would otherwise settle the whole stream unseen. dlq keeps
	// from the app what the filter may have been meant to keep out;
	// deliver suits a filter that only spares the app work. Default ""
	// (dlq).
	OnFilterError string `yaml:"onFilterError,omitempty"`

	// Subscriptions, when set, make one sidecar consume several queues,
	// each with its own bindings, app path, concurrency, retry policy and
	// routing rules; every key a subscription leaves unset is taken from
	// the top-level section of the same name (routes, filter and the on*
	// keys excepted: those are the subscription's own, and the top-level
	// ones must stay empty). queue.name must then be empty too. Default
	// none: the top-level queue is the one subscription.
	Subscriptions []Subscription `yaml:"subscriptions,omitempty"`
}

// Route sends the messages its match selects to a path of its own, with
// the retry policy of its own when it has one.
type Route struct {
	// Name labels the route in metrics (the route label), traces and logs;
	// unique within the subscription. Default: made from path
	// ("/orders/{routingKey}" is orders-routingKey), or route-<n> for the
	// n-th route without a path, with -<n> added when another route has
	// the name already.
	Name string `yaml:"name"`
	// Match is an expression over routingKey, exchange, headers,
	// properties and body that is true for the messages the route takes.
	// Required.
	Match string `yaml:"match"`
	// Path replaces the path of app.url for the route's messages; it may
	// hold {routingKey} and {queue}. Default: the subscription's path.
	Path string `yaml:"path,omitempty"`
	// Retry, when set, is the retry policy of the route's messages, laid
	// over the subscription's retry defaults (retry.policies are not
	// consulted for them). Default: retry.policies select as for any
	// message.
	Retry *RouteRetry `yaml:"retry,omitempty"`
}

// RouteRetry is a route's retry policy; a key left out is the
// subscription's retry key of the same name.
type RouteRetry struct {
	// MaxAttempts is the attempt at which the route's failing messages
	// are dead-lettered, or "unlimited". Default retry.maxAttempts.
	MaxAttempts *Attempts `yaml:"maxAttempts,omitempty"`
	// Tiers are the route's delay tiers, increasing; each delay has a tier
	// queue of its own. Default retry.tiers.
	Tiers []Duration `yaml:"tiers,omitempty"`
	// Outcomes override entries of the outcome table for the route's
	// messages, laid over retry.outcomes. Default none.
	Outcomes map[string]string `yaml:"outcomes,omitempty"`
	// OnExpired is dlq or drop for the route's messages past their
	// deadline. Default retry.onExpired.
	OnExpired string `yaml:"onExpired,omitempty"`
}

// Subscription is one queue consumed by the sidecar. Unset keys inherit the
// top-level ones: queue.type, queue.tierType and queue.deliveryLimit from queue, bindings
// from topology.bindings, consumer.* from consumer, retry.* from retry.
type Subscription struct {
	// Queue names the subscription's work queue, with the keys of the
	// top-level queue section. name is required and unique across
	// subscriptions; type "", tierType "" and deliveryLimit 0 inherit
	// queue.type, queue.tierType and queue.deliveryLimit, arguments given
	// replace queue.arguments whole.
	Queue Queue `yaml:"queue,omitempty"`
	// Bindings route messages from exchanges to this queue, as
	// topology.bindings do for the top-level queue. Default
	// topology.bindings.
	Bindings []Binding `yaml:"bindings,omitempty"`
	// Path replaces the path (and query) of app.url for this queue's
	// messages; it may hold {routingKey} and {queue}. The scheme, host and
	// port stay app.url's: one sidecar serves one app. Default app.url's own
	// path.
	Path string `yaml:"path,omitempty"`
	// Consumer sets this queue's concurrency; a key left out inherits the
	// consumer key of the same name.
	Consumer SubscriptionConsumer `yaml:"consumer,omitempty"`
	// Retry sets this queue's retry policy; a key left out inherits the
	// retry key of the same name.
	Retry SubscriptionRetry `yaml:"retry,omitempty"`
	// Partitions split this queue into partitions, as
	// topology.partitions does for the top-level queue: count is taken as
	// given, a hashOn left out inherits. Default topology.partitions.
	Partitions *Partitions `yaml:"partitions,omitempty"`
	// Routes are this queue's routes, as the top-level routes are for the
	// one-queue form. Default none.
	Routes []Route `yaml:"routes,omitempty"`
	// Filter is this queue's filter, as the top-level filter is for the
	// one-queue form. Default "" (every message is delivered).
	Filter string `yaml:"filter,omitempty"`
	// OnFiltered is ack or dlq for the messages this queue's filter makes
	// false, as the top-level onFiltered. Default "" (ack).
	OnFiltered string `yaml:"onFiltered,omitempty"`
	// OnBodyError is skip or dlq for this queue's rules that read a body
	// which is not JSON, as the top-level onBodyError. Default "" (skip).
	OnBodyError string `yaml:"onBodyError,omitempty"`
	// OnFilterError is dlq or deliver for the messages this queue's filter
	// cannot be evaluated for, as the top-level onFilterError. Default ""
	// (dlq).
	OnFilterError string `yaml:"onFilterError,omitempty"`
}

// SubscriptionConsumer overrides consumer.* for one subscription; a key left
// out inherits.
type SubscriptionConsumer struct {
	// Prefetch overrides consumer.prefetch.
	Prefetch *int `yaml:"prefetch,omitempty"`
	// Workers overrides consumer.workers.
	Workers *int `yaml:"workers,omitempty"`
	// Ordered overrides consumer.ordered.
	Ordered *bool `yaml:"ordered,omitempty"`
	// OrderingKey overrides consumer.orderingKey.
	OrderingKey *string `yaml:"orderingKey,omitempty"`
	// PrefetchBytes overrides consumer.prefetchBytes.
	PrefetchBytes *int `yaml:"prefetchBytes,omitempty"`
	// Batch overrides consumer.batch, key by key.
	Batch SubscriptionBatch `yaml:"batch,omitempty"`
}

// SubscriptionBatch overrides consumer.batch for one subscription; a key
// left out inherits.
type SubscriptionBatch struct {
	// MaxMessages overrides consumer.batch.maxMessages.
	MaxMessages *int `yaml:"maxMessages,omitempty"`
	// MaxBytes overrides consumer.batch.maxBytes.
	MaxBytes *int `yaml:"maxBytes,omitempty"`
	// MaxWait overrides consumer.batch.maxWait.
	MaxWait *Duration `yaml:"maxWait,omitempty"`
}

// SubscriptionRetry overrides retry.* for one subscription; a key left out
// inherits. Outcomes are laid over the top-level retry.outcomes, as a
// policy's are.
type SubscriptionRetry struct {
	// MaxAttempts overrides retry.maxAttempts.
	MaxAttempts *Attempts `yaml:"maxAttempts,omitempty"`
	// Tiers override retry.tiers.
	Tiers []Duration `yaml:"tiers,omitempty"`
	// Outcomes are laid over retry.outcomes, entry by entry.
	Outcomes map[string]string `yaml:"outcomes,omitempty"`
	// OnExpired overrides retry.onExpired.
	OnExpired string `yaml:"onExpired,omitempty"`
	// DeadlineHeader overrides retry.deadlineHeader.
	DeadlineHeader *string `yaml:"deadlineHeader,omitempty"`
	// MaxCrashes overrides retry.maxCrashes.
	MaxCrashes *int `yaml:"maxCrashes,omitempty"`
	// Policies, when given, replace retry.policies whole.
	Policies []Policy `yaml:"policies,omitempty"`
}

// Broker is the RabbitMQ connection.
type Broker struct {
	// URLs are the broker's addresses, tried in turn on every connect and
	// reconnect (the nodes of a cluster); amqps:// connects with TLS
	// (broker.tls). Default [amqp://guest:guest@127.0.0.1:5672/].
	URLs []string `yaml:"urls"`
	// PasswordFile, when set, holds the password (a mounted secret); it
	// replaces the password in every URL so that URLs can live in plain
	// config. Passwords are never logged. Default "".
	PasswordFile string `yaml:"passwordFile"`
	// UsernameFile, when set, holds the user name (a mounted secret); it
	// replaces the user name in every URL. Default "".
	UsernameFile string `yaml:"usernameFile"`
	// Heartbeat is the AMQP heartbeat interval, which sets how soon a dead
	// connection is noticed, by the broker and by Hopper. Default 10s.
	Heartbeat Duration `yaml:"heartbeat"`
	// ConnectTimeout bounds one dial and AMQP handshake. Default 10s.
	ConnectTimeout Duration `yaml:"connectTimeout"`
	// ReconnectMin is the first step of the jittered exponential backoff
	// between connection attempts; the step doubles after each failed
	// attempt, up to reconnectMax. Default 500ms.
	ReconnectMin Duration `yaml:"reconnectMin"`
	// ReconnectMax is the largest step of the backoff between connection
	// attempts. Default 30s.
	ReconnectMax Duration `yaml:"reconnectMax"`
	// ConfirmTimeout bounds the wait for a publisher confirm when moving a
	// message; past it the move counts as failed and is retried. Default 15s.
	ConfirmTimeout Duration `yaml:"confirmTimeout"`
	// MoveRetryMin is the first step of the jittered exponential backoff
	// between attempts of a move that failed (refused, returned, not
	// confirmed); the step doubles after each failed attempt, up to
	// moveRetryMax. The delivery is held meanwhile and the app is not
	// called again. Default 1s.
	MoveRetryMin Duration `yaml:"moveRetryMin"`
	// MoveRetryMax is the largest step of the backoff between attempts of
	// a failed move. Default 30s.
	MoveRetryMax Duration `yaml:"moveRetryMax"`
	// MoveHoldMax is how long a delivery whose move keeps failing is held
	// before it is given back to the work queue; counted from a message's
	// receipt, it also bounds an ordered message's holds in place and its
	// wait behind its ordering key. It must stay under the broker's
	// consumer_timeout (30m by default), past which the broker takes back
	// everything the channel holds. Default 10m.
	MoveHoldMax Duration `yaml:"moveHoldMax"`
	// PublishChannels is the number of confirm-mode channels moves are
	// spread over, 1 to 256; each carries up to 256 publishes awaiting
	// their confirm. Default 8.
	PublishChannels int `yaml:"publishChannels"`
	// TLS applies to amqps:// URLs. Default: the system's roots, no client
	// certificate.
	TLS TLS `yaml:"tls"`
}

// TLS configures amqps:// connections.
type TLS struct {
	// CAFile holds the PEM certificates the broker's certificate must
	// chain to. Default "": the system's roots.
	CAFile string `yaml:"caFile"`
	// CertFile holds the PEM client certificate, for a broker that asks
	// for one; given with keyFile. Default "".
	CertFile string `yaml:"certFile"`
	// KeyFile holds the client certificate's PEM key. Default "".
	KeyFile string `yaml:"keyFile"`
	// ServerName is the name the broker's certificate must be valid for,
	// when it is not the URL's host. Default "": the URL's host.
	ServerName string `yaml:"serverName"`
	// InsecureSkipVerify disables the checks of the broker's certificate.
	// For tests only: anyone between Hopper and the broker could read and
	// change every message. Default false.
	InsecureSkipVerify bool `yaml:"insecureSkipVerify"`
}

// Queue names the work queue.
type Queue struct {
	// Name is the work queue's name, at most 200 bytes so that the tier
	// queue names made from it fit. Required, unless subscriptions are set
	// (then it stays empty).
	Name string `yaml:"name"`
	// Type is classic or quorum; it applies to the queues Hopper declares
	// and decides how a message the app could not take is returned: a
	// nack on a classic queue, a confirmed republish on a quorum queue.
	// stream reads the RabbitMQ stream named by name through the stream
	// protocol (queue.stream). Default classic.
	Type string `yaml:"type"`
	// Stream configures reading a stream, with type stream: the consumer
	// name the broker stores the offset under, where a new consumer
	// starts, the stream port, and the retention of a stream Hopper
	// declares.
	Stream Stream `yaml:"stream,omitempty"`
	// TierType is the type of the delay tier queues Hopper declares:
	// quorum or classic. A tier hands each message back to the work queue
	// when its delay runs out. A quorum tier does so at least once, into a
	// classic work queue too. A classic tier does so at most once: RabbitMQ
	// can drop a message whose delay runs out while the broker stops (a
	// restart, a rolling upgrade), after Hopper has acked the original, so
	// classic tiers are an opt-in that trades that risk for a lighter write
	// per retry. A quorum work queue's tiers are always quorum. Default ""
	// (quorum). Left to the default, a tier an earlier Hopper declared as
	// classic keeps handing back what it holds and new retries go to a
	// quorum tier named after it with ".quorum" appended (the old tier is
	// deleted once empty); naming a type makes a tier of the other type an
	// error at start.
	TierType string `yaml:"tierType,omitempty"`
	// DeliveryLimit is the x-delivery-limit of a declared quorum work
	// queue. A classic queue has none: config validation refuses it there.
	// With topology.declare false Hopper declares nothing, so the limit is
	// the one the queue was declared with, and config validate and run
	// warn that this one is not applied. Default 0 (not set: the broker's
	// own applies, 20 on RabbitMQ 4).
	DeliveryLimit int `yaml:"deliveryLimit"`
	// Arguments are further x-arguments of the work queue that Hopper does
	// not model itself (x-max-priority, 1 to 255 and classic queues only,
	// x-max-length, x-max-length-bytes, x-overflow, x-message-ttl,
	// x-queue-leader-locator, x-queue-mode, x-queue-version, or any other
	// x- key), passed to the broker as given: integers as 64-bit integers,
	// strings and booleans as they are. They apply when Hopper declares the
	// work queue and are checked against it when topology.declare is
	// false. The keys Hopper sets itself (x-queue-type, x-dead-letter-*,
	// x-delivery-limit, x-single-active-consumer, x-expires) are refused
	// here. In a subscription, a map given replaces the top-level one
	// whole. Default none.
	Arguments map[string]Argument `yaml:"arguments,omitempty"`
	// SingleActiveConsumer declares the work queue with
	// x-single-active-consumer: the broker delivers to one consumer at a
	// time, across every pod, and hands over to another only when that
	// one goes away, so messages are processed in queue order by one pod
	// while the others wait as standbys (each pod's role shows on /readyz
	// and in hopper_consumer_active). A new broker consumer joins the
	// back of the line, so on such a queue the prefetch never follows the
	// concurrency limit (consumer.prefetch, or twice the workers, fixes
	// it). Default false.
	SingleActiveConsumer *bool `yaml:"singleActiveConsumer,omitempty"`
}

// SAC says whether the work queue is a single-active-consumer queue.
func (q Queue) SAC() bool { return q.SingleActiveConsumer != nil && *q.SingleActiveConsumer }

// Argument is one queue argument as YAML gives it: a string, an integer or
// a boolean. Integers go to the broker as 64-bit integers (an AMQP long),
// never as floating point numbers or strings, which RabbitMQ would refuse
// or read otherwise.
type Argument struct {
	v any // string, int64 or bool
}

// StringArgument, IntArgument and BoolArgument make arguments (tests and
// flags).
func StringArgument(s string) Argument { return Argument{v: s} }

// IntArgument is an integer argument.
func IntArgument(n int64) Argument { return Argument{v: n} }

// BoolArgument is a boolean argument.
func BoolArgument(b bool) Argument { return Argument{v: b} }

// Value is the argument as the broker gets it: string, int64 or bool.
func (a Argument) Value() any { return a.v }

// Int is the argument's integer, if it is one.
func (a Argument) Int() (int64, bool) { n, ok := a.v.(int64); return n, ok }

// Str is the argument's string, if it is one.
func (a Argument) Str() (string, bool) { s, ok := a.v.(string); return s, ok }

func (a Argument) String() string { return fmt.Sprint(a.v) }

// UnmarshalYAML accepts a string, an integer or true/false.
func (a *Argument) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseArgument(n)
	if err != nil {
		return typeError(n, err)
	}
	*a = v
	return nil
}

// MarshalYAML writes the value as it is.
func (a Argument) MarshalYAML() (any, error) { return a.v, nil }

func parseArgument(n *yaml.Node) (Argument, error) {
	if n.Kind == yaml.ScalarNode {
		switch n.Tag {
		case "!!str":
			return Argument{v: n.Value}, nil
		case "!!int":
			v, err := strconv.ParseInt(n.Value, 0, 64)
			if err != nil {
				return Argument{}, fmt.Errorf("integer %s out of range", n.Value)
			}
			return Argument{v: v}, nil
		case "!!bool":
			var b bool
			if err := n.Decode(&b); err != nil {
				return Argument{}, fmt.Errorf("decode %q: %w", n.Value, err)
			}
			return Argument{v: b}, nil
		}
	}
	return Argument{}, fmt.Errorf("must be a string, an integer or true/false, got %s", describe(n))
}

// ParseArgument reads an argument from a string (an environment variable
// or flag): an integer when it is one, true or false, else the string.
func ParseArgument(s string) Argument {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return Argument{v: n}
	}
	if b, err := strconv.ParseBool(s); err == nil && (s == "true" || s == "false") {
		return Argument{v: b}
	}
	return Argument{v: s}
}

// Topology names the queues around the work queue: a delay tier queue per
// retry delay and the dead-letter queue, and the exchanges that feed it.
type Topology struct {
	// Declare makes hopper run declare the topology (work queue, delay
	// tiers, DLQ, exchanges and bindings) at start; when false run only
	// verifies it and fails on a mismatch. Default true.
	Declare bool `yaml:"declare"`
	// RetryQueue is the name template of the delay tier queues: {queue} is
	// the work queue's name, {delay} the tier's delay (5s, 2m). It must
	// hold {delay}, and {queue} when partitions are on. Default
	// "{queue}.retry.{delay}".
	RetryQueue string `yaml:"retryQueue"`
	// DLQ is the name template of the dead-letter queue; {queue} is the
	// work queue's name. Default "{queue}.dlq".
	DLQ string `yaml:"dlq"`
	// ParkQueue is the name template of the parking queues of scheduled
	// messages (schedule.enabled): {queue} is the work queue's name,
	// {delay} the queue's parking delay. It must hold {delay}, and {queue}
	// when partitions are on. Default "{queue}.park.{delay}".
	ParkQueue string `yaml:"parkQueue"`
	// DLQMaxLength caps the DLQ at this many messages (x-max-length with
	// overflow reject-publish): a full DLQ refuses a dead-lettering, which
	// leaves the message in the work queue. Default 0 (no cap).
	DLQMaxLength int `yaml:"dlqMaxLength"`
	// Bindings route messages from exchanges to the work queue. Hopper
	// declares the exchanges and bindings with the rest of the topology.
	// With partitions on they bind the exchanges to the partitions'
	// hash exchange instead, so publishers keep publishing where they did.
	// Default none.
	Bindings   []Binding  `yaml:"bindings"`
	Partitions Partitions `yaml:"partitions"`
	// PartitionOf is set only on the effective config of one partition
	// queue (see Config.Consumed): the work queue name the partitions
	// replace. It is no key of the file.
	PartitionOf string `yaml:"-"`
}

// Partitions split a work queue Q into count queues Q.p0, Q.p1 and so on,
// bound with equal weight to a consistent-hash exchange named Q.partitions
// (RabbitMQ's rabbitmq_consistent_hash_exchange plugin). The exchange sends
// every message of one key to the same partition; each partition is
// declared single-active-consumer, so one replica at a time delivers its
// messages, in order, while the partitions spread over the replicas. Every
// partition has its own delay tiers and all share the DLQ named from Q.
type Partitions struct {
	// Count is the number of partition queues, 1 to 64. Default 0: off,
	// the work queue is consumed as it is.
	Count int `yaml:"count"`
	// HashOn is what the exchange hashes to pick a partition: routingKey,
	// or header:NAME for the value of the message header NAME. Default
	// routingKey.
	HashOn string `yaml:"hashOn"`
}

// MaxPartitions bounds topology.partitions.count: each partition is a
// queue with its own tiers and a consumer channel in every replica.
const MaxPartitions = 64

// On says whether partitions are on.
func (p Partitions) On() bool { return p.Count > 0 }

// HashHeader is the header the exchange hashes ("" when it hashes the
// routing key).
func (p Partitions) HashHeader() string {
	name, ok := strings.CutPrefix(p.HashOn, "header:")
	if !ok {
		return ""
	}
	return name
}

// PartitionQueue is the name of partition i of work queue q.
func PartitionQueue(q string, i int) string { return q + ".p" + strconv.Itoa(i) }

// PartitionExchange is the name of the consistent-hash exchange in front of
// the partitions of work queue q.
func PartitionExchange(q string) string { return q + ".partitions" }

// Binding binds the work queue to one exchange.
type Binding struct {
	// Exchange is the exchange's name. Required; not the default exchange
	// "", which already routes by queue name. Names starting with amq. are
	// the broker's own exchanges: checked, never declared.
	Exchange string `yaml:"exchange"`
	// Type is the exchange's type: topic, direct, fanout or headers.
	// Required.
	Type string `yaml:"type"`
	// Durable exchanges survive a broker restart. Default true.
	Durable *bool `yaml:"durable"`
	// RoutingKeys bind a topic or direct exchange, one binding per key
	// (topic patterns may use * and #): at least one for those exchanges,
	// none for the others.
	RoutingKeys []string `yaml:"routingKeys"`
	// Headers bind a headers exchange: the message headers to match, by
	// name. Names starting with x- are never matched by the broker.
	Headers map[string]string `yaml:"headers"`
	// Match is all (every header must match) or any (one is enough), for
	// a headers exchange. Default all.
	Match string `yaml:"match"`
}

// IsDurable is Durable with its default.
func (b Binding) IsDurable() bool { return b.Durable == nil || *b.Durable }

// App is the application Hopper delivers to.
type App struct {
	// URL receives one POST per message; its path may hold {routingKey}
	// and {queue}, filled in for each message. An https:// URL is
	// configured by app.tls. User info in it (https://user:password@host/)
	// is sent as basic auth (Authorization: Basic) with every request and
	// health check, and shown nowhere: logs, errors, /readyz and spans
	// print the URL with REDACTED in its place. Default
	// http://127.0.0.1:8080/.
	URL string `yaml:"url"`
	// Timeout bounds one request. It must stay well under the broker's
	// consumer_timeout (30m): less than half of it. Default 30s.
	Timeout Duration `yaml:"timeout"`
	// HealthPath is the app's health check, a path Hopper GETs (2xx:
	// healthy) before consuming and while the breaker is open; when empty a
	// TCP connect to the app's address is the check. Default "".
	HealthPath string `yaml:"healthPath"`
	// UnavailableBackoff is how long a worker waits after the app could not
	// be reached before returning the message, so a down app is not spun on.
	// Default 1s.
	UnavailableBackoff Duration `yaml:"unavailableBackoff"`
	// MaxBodyBytes is the largest response body Hopper reads, in bytes; a
	// larger one does not change the outcome, which the status decides.
	// Default 65536.
	MaxBodyBytes int `yaml:"maxBodyBytes"`
	// CloudEvents adds CloudEvents binary-mode headers (ce-specversion,
	// ce-id, ce-source, ce-type, ce-subject, ce-time) for apps written for
	// Knative eventing. Default false.
	CloudEvents bool    `yaml:"cloudEvents"`
	Forward     Forward `yaml:"forward"`
	Auth        AppAuth `yaml:"auth"`
	TLS         AppTLS  `yaml:"tls"`
}

// AppTLS configures connections to an https:// app, deliveries and health
// checks alike: a private CA, and a client certificate for an app that
// asks for one (mutual TLS). The client certificate and key are read again
// when they change (looked at no more than once a second, when a
// connection is made), so a renewed certificate is used on the next new
// connection without a restart; the CA is read at start. Default: the
// system's roots, no client certificate.
type AppTLS struct {
	// CAFile holds the PEM certificates the app's certificate must chain
	// to. Default "": the system's roots.
	CAFile string `yaml:"caFile"`
	// CertFile holds the PEM client certificate; given with keyFile.
	// Default "".
	CertFile string `yaml:"certFile"`
	// KeyFile holds the client certificate's PEM key; given with certFile.
	// Default "".
	KeyFile string `yaml:"keyFile"`
}

// BasicAuth reports whether app.url holds user info: credentials sent as
// basic auth with every request.
func (a App) BasicAuth() bool {
	u, err := url.Parse(a.URL)
	return err == nil && u.User != nil
}

// SendsCredentials reports whether Hopper authenticates its requests to
// the app: a token, a signature, a TLS client certificate or app.url's
// user info. Only then can the app's 401 be about Hopper rather than a
// message.
func (a App) SendsCredentials() bool {
	return a.Auth.Token.File != "" || a.Auth.HMAC.KeyFile != "" || a.Auth.StandardWebhooks.SecretFile != "" ||
		a.TLS.CertFile != "" || a.BasicAuth()
}

// AppAuth lets the app tell Hopper's requests from anyone else's: a token,
// a signature of the body, or both, each from a file (a mounted Secret).
// Each file is read at start and again when it changes (looked at no more
// than once a second), so a rotated Secret is picked up without a restart;
// a trailing newline in a file is not part of its secret. Default: neither.
type AppAuth struct {
	Token            TokenAuth            `yaml:"token"`
	HMAC             HMACAuth             `yaml:"hmac"`
	StandardWebhooks StandardWebhooksAuth `yaml:"standardWebhooks"`
	// MaxRefused bounds how long the app may refuse Hopper's credentials
	// (answer 401 while Hopper sends some) with /readyz still answering
	// 200. Past it /readyz answers 503 until a probe is accepted, so that
	// a rollout that brought the wrong Secret stops before it replaces the
	// pods that still work, and the pod shows not ready. Consuming stays
	// paused and probes go on: the messages wait in the queue, none is
	// dead-lettered, and the pod is not restarted (it would read the same
	// Secret again). 0 keeps /readyz at 200 however long it lasts.
	// Default 5m.
	MaxRefused Duration `yaml:"maxRefused"`
}

// TokenAuth sends a token, read from a file, with every request.
type TokenAuth struct {
	// File holds the token. Default "": no token.
	File string `yaml:"file"`
	// Header carries the token: Authorization gets "Bearer <token>", any
	// other header the token as it is. It may not be a header Hopper or
	// HTTP itself sets. Default Authorization.
	Header string `yaml:"header"`
}

// HMACAuth signs every request (a batch's whole body) in Hopper's own
// Hopper-Signature header: "t=<unix seconds>,id=<delivery id>,v1=<hex
// HMAC-SHA256 of "<t>.<body>">,v2=<hex HMAC-SHA256 of "<t>.<id>.<body>">".
// The time lets the app refuse a request older than its window, and the id
// (in v2) one played again within it under another message id.
type HMACAuth struct {
	// KeyFile holds the key; its bytes are the HMAC key. Default "": no
	// signature.
	KeyFile string `yaml:"keyFile"`
}

// StandardWebhooksAuth signs every request in the public Standard Webhooks
// form, which verifier libraries in every common language check:
// webhook-id (the delivery id, the same on every attempt),
// webhook-timestamp (Unix seconds) and webhook-signature, one signature of
// "<id>.<timestamp>.<body>" per secret.
type StandardWebhooksAuth struct {
	// SecretFile holds one or more secrets, one a line: whsec_<base64 of
	// 24 to 64 bytes> signs with HMAC-SHA256 ("v1,<base64>"), whsk_<base64
	// Ed25519 secret key> with Ed25519 ("v1a,<base64>"). Each one signs
	// every request, so a key is rotated without a gap: add the new one,
	// let the app learn it, drop the old one. Default "": not signed.
	SecretFile string `yaml:"secretFile"`
}

// Forward bounds the head of each request to the app, so that every common
// app server accepts it. A server that refuses a head (431) refuses every
// attempt of the message the same way, so the bounds sit under the
// smallest common server limits: Python's http.server takes 100 headers,
// Node.js a 16 KiB head, Tomcat, Jetty and Netty 8 KiB. Hopper's own
// headers are always sent; the message's application headers fill what is
// left, in the order of their names, until one does not fit. Those left
// out are counted, and the app told how many in Hopper-Headers-Omitted.
type Forward struct {
	// MaxHeaders bounds the request's header lines, counting Hopper's own,
	// trace context, CloudEvents attributes, Host, User-Agent,
	// Content-Type and Content-Length with the application headers; at
	// least 32. Default 90.
	MaxHeaders int `yaml:"maxHeaders"`
	// MaxHeaderBytes bounds the request head in bytes: request line,
	// header lines and the blank line after them; at least 2048. Default
	// 7168 (7 KiB).
	MaxHeaderBytes int `yaml:"maxHeaderBytes"`
	// MaxValueBytes is the longest application header value, in bytes,
	// that is forwarded, at most maxHeaderBytes; a longer one is left out
	// whole rather than cut, so the app never takes a cut value for the
	// message's. Default 4096.
	MaxValueBytes int `yaml:"maxValueBytes"`
}

// MinForwardHeaders and MinForwardHeaderBytes are the smallest forwarding
// bounds accepted: Hopper's own headers and those the HTTP client writes
// take up to 27 header lines, and a few hundred bytes for the usual
// message.
const (
	MinForwardHeaders     = 32
	MinForwardHeaderBytes = 2048
)

// Consumer sets how many messages are taken from the broker ahead of the
// app and how many are at the app at once.
type Consumer struct {
	// Prefetch is the AMQP prefetch (QoS): how many unacked messages the
	// broker sends ahead. Default 0: it follows the concurrency limit,
	// about twice the limit and as much again (at most 64 more) for
	// settled messages whose acks are held to go out together, from 20
	// up to twice the workers plus 64. A number from 1 to 65535 fixes it.
	Prefetch int `yaml:"prefetch"`
	// Workers is the most deliveries at the app at once (with batching,
	// the most requests), at most 32767 and no more than a set prefetch.
	// Default 0: the prefetch when it is set (with batching, the prefetch
	// over consumer.batch.maxMessages); otherwise 512 while the limiter is
	// on, 64 with the limiter off or on a single-active-consumer queue.
	Workers int `yaml:"workers"`
	// PrefetchBytes bounds the message bytes a queue's unsettled
	// deliveries may take when Hopper picks the prefetch (it follows the
	// limit, or the queue is single-active-consumer): the consumer keeps
	// its prefetch at most prefetchBytes over the size of recent bodies (1
	// until it has seen one, at least 1), whatever prefetch the limit or
	// the breaker asks for, so an app that keeps up with large messages
	// does not draw hundreds of them into memory. In a container with a
	// memory limit, hopper run lowers it to a quarter of what the limit
	// leaves after 32 MiB, shared by the queues it bounds; the budgets'
	// sum plus 64 MiB, fitted under the container's limit, is the Go
	// runtime's soft memory limit unless GOMEMLIMIT is set. Default
	// 67108864 (64 MiB); 0 bounds nothing.
	PrefetchBytes int `yaml:"prefetchBytes"`
	// Ordered delivers one message at a time (prefetch 1, one worker), and
	// retries in place: a failed message is held and delivered again after
	// its tier's delay, so no later message overtakes it. With several
	// replicas it needs queue.singleActiveConsumer. Default false.
	Ordered bool `yaml:"ordered"`
	// OrderingKey names where a message's ordering key comes from:
	// routingKey, type, header:NAME, or messageId:SEP (the message id up to
	// the first SEP). Messages with the same key are delivered one at a
	// time, in queue order, and retried in place; different keys run in
	// parallel up to the workers. A message without the key is unordered.
	// Not with consumer.ordered or batching. Default "" (no key).
	OrderingKey string `yaml:"orderingKey"`
	Batch       Batch  `yaml:"batch"`
}

// Batch sets batch delivery: one request carries up to maxMessages
// messages and the app answers a result for each. A batch is sent when it
// holds maxMessages, or maxBytes of bodies, or its oldest message has
// waited maxWait, whichever comes first. With batching on, workers and the
// concurrency limit count requests, not messages, a prefetch Hopper picks
// is scaled by maxMessages so that full batches can form, and a fixed
// consumer.prefetch must be at least maxMessages. Off unless maxMessages
// is above 1.
type Batch struct {
	// MaxMessages is the most messages in one request, 1 to 1000; above 1
	// turns batch delivery on. The app URL may then not hold {routingKey}.
	// Default 1: every message goes in a request of its own (batching
	// off).
	MaxMessages int `yaml:"maxMessages"`
	// MaxBytes bounds the message bodies of one batch, in bytes. A single
	// message larger than it goes alone. Default 1048576 (1 MiB).
	MaxBytes int `yaml:"maxBytes"`
	// MaxWait is how long the oldest message of a batch may wait for the
	// batch to fill, up to 5m. Default 0s: a batch is sent with what is at
	// hand as soon as a worker is free, so batches grow only while the app
	// is busy.
	MaxWait Duration `yaml:"maxWait"`
}

// Size is the most messages in one request: 1 when batching is off.
func (b Batch) Size() int { return max(1, b.MaxMessages) }

// On says whether batching is on.
func (b Batch) On() bool { return b.MaxMessages > 1 }

// DefaultBatchMaxBytes is consumer.batch.maxBytes unless set.
const DefaultBatchMaxBytes = 1 << 20

// Retry is the default retry policy and the per-message policies.
type Retry struct {
	// MaxAttempts is the attempt at which a failing message is
	// dead-lettered (reason max-attempts) instead of retried again, or
	// "unlimited". Default 10.
	MaxAttempts Attempts `yaml:"maxAttempts"`
	// Tiers are the delay tiers, increasing, from 1ms to 596h: attempt n
	// waits out tier n, and every attempt past the last tier the last one.
	// Each delay has a tier queue of its own. Default [1s, 5s, 30s, 2m,
	// 10m, 30m].
	Tiers []Duration `yaml:"tiers"`
	// Outcomes override entries of the outcome table (the README's "The
	// outcome table"): an outcome (a status like 418, a class like 4xx,
	// timeout, unavailable or cut) to an action (ack, drop, requeue,
	// retry, dlq, return, or pause for one 4xx status), for example
	// {"4xx": retry}; from the environment, 4xx=retry. The built-in table
	// makes 401 pause (the app refusing Hopper's credentials) only when
	// Hopper sends some (app.auth, an app.tls client certificate, user
	// info in app.url); otherwise a 401 is a 4xx like the others. Default
	// none.
	Outcomes map[string]string `yaml:"outcomes"`
	// OnExpired is dlq or drop for messages past their deadline: the AMQP
	// expiration counted from first receipt, or the time in
	// deadlineHeader. A retry whose delay would end past the deadline
	// expires the message at once. Default dlq.
	OnExpired string `yaml:"onExpired"`
	// DeadlineHeader names an application header holding an absolute
	// deadline (RFC 3339 or Unix milliseconds). Default "": messages have
	// no deadline.
	DeadlineHeader string `yaml:"deadlineHeader"`
	// MaxCrashes is the number of times a message may be in flight when the
	// app dies (the request cut, then the health check failing) before it
	// goes to the DLQ as app-crash; 0 never does. Default 3.
	MaxCrashes int `yaml:"maxCrashes"`
	// Policies are retry policies for the messages their match selects,
	// tried in order; the first that matches wins over the retry keys
	// above, which are the default policy. Default none.
	Policies []Policy `yaml:"policies"`
}

// Policy is a retry policy for the messages its match selects. Unset fields
// inherit from the retry section.
type Policy struct {
	// Name names the policy. Required, unique.
	Name string `yaml:"name"`
	// Match selects the policy's messages. Required: at least one of
	// routingKey, type and header.
	Match Match `yaml:"match"`
	// MaxAttempts overrides retry.maxAttempts.
	MaxAttempts *Attempts `yaml:"maxAttempts,omitempty"`
	// Tiers override retry.tiers.
	Tiers []Duration `yaml:"tiers,omitempty"`
	// Outcomes are laid over retry.outcomes, entry by entry.
	Outcomes map[string]string `yaml:"outcomes,omitempty"`
	// OnExpired overrides retry.onExpired.
	OnExpired string `yaml:"onExpired,omitempty"`
}

// Match selects messages; every key set must match.
type Match struct {
	// RoutingKey is an AMQP topic pattern on the original routing key (*
	// one word, # zero or more).
	RoutingKey string `yaml:"routingKey,omitempty"`
	// Type is a glob on the AMQP type property.
	Type string `yaml:"type,omitempty"`
	// Header is "name" (the application header is present) or
	// "name=value" (its string form is value).
	Header string `yaml:"header,omitempty"`
}

// Requeue governs 425 Too Early: the app asks for the message again later,
// without spending an attempt.
type Requeue struct {
	// MinHold is the shortest hold before a requeue, when the app sends no
	// Retry-After: the hold is jittered between minHold and maxHold.
	// Default 1s.
	MinHold Duration `yaml:"minHold"`
	// MaxHold is the longest hold before a requeue; a longer Retry-After
	// goes through a delay tier instead. Default 5s.
	MaxHold Duration `yaml:"maxHold"`
	// MaxRequeues caps requeues; past it the message is dead-lettered with
	// reason too-early. Default 100.
	MaxRequeues int `yaml:"maxRequeues"`
}

// Schedule delivers a message no earlier than the time it names: the
// delayed-message exchange plugin's x-delay header (milliseconds, counted
// from when Hopper first receives the message) or the absolute
// Hopper-Not-Before header (RFC 3339, or Unix milliseconds). A message that
// is not due is parked, without a request to the app or an attempt spent,
// in a ladder of parking queues (durable quorum queues, one per delay,
// each twice the one before, from step up to maxDelay) whose message TTL
// hands it back to the work queue; it is delivered within step/2 of its
// due time. With it off, both headers are only forwarded to the app, and
// a message that carries them is delivered at once.
type Schedule struct {
	// Enabled turns scheduling on: Hopper declares (or verifies) the
	// parking queues and parks every message that is not due. Default
	// false.
	Enabled bool `yaml:"enabled"`
	// Step is the shortest parking delay: a message is delivered at most
	// step/2 before or after its due time (plus one hop through the
	// broker, a few milliseconds), and one due in less than step/2 goes at
	// once. From 1ms to maxDelay. Default 1s.
	Step Duration `yaml:"step"`
	// MaxDelay is the longest wait accepted, counted from when Hopper
	// first receives the message; the ladder of parking queues goes up to
	// it (17 queues for 24h with a step of 1s). Default 24h.
	MaxDelay Duration `yaml:"maxDelay"`
	// PastMax is what becomes of a message due further away than
	// maxDelay: "dlq" dead-letters it with reason schedule-too-far, so
	// nothing reaches the app before the time it asked for; "longest"
	// delivers it maxDelay after first receipt. Default "dlq".
	PastMax string `yaml:"pastMax"`
}

// Breaker is the circuit breaker in front of the app. It trips on the app
// being unavailable, never on messages failing.
type Breaker struct {
	// Enabled turns the breaker on. Default true.
	Enabled bool `yaml:"enabled"`
	// Failures is the number of consecutive app-unavailable results
	// (connection refused or reset, connect timeout) that open it, and the
	// number of consecutive failed messages (5xx, 429, timeout) after which
	// Hopper asks the health check, which alone then decides. Default 5.
	Failures int `yaml:"failures"`
	// OpenTimeout is the least time it stays open; after it, a passing
	// health check lets deliveries through again, the concurrency ramping
	// up. Default 5s.
	OpenTimeout Duration `yaml:"openTimeout"`
	// ProbeInterval is how often the app's health check runs while open,
	// and the least time between two checks asked for by failing messages.
	// Default 1s.
	ProbeInterval Duration `yaml:"probeInterval"`
}

// Limiter is the adaptive concurrency limit in front of the app: it shrinks
// when the app signals overload (429, 503, timeouts, latency well above its
// usual) and grows back on success, between 1 and consumer.workers.
type Limiter struct {
	// Enabled turns it on. Default true.
	Enabled bool `yaml:"enabled"`
	// LatencyTolerance is how many times its usual latency the app may take
	// before that counts as overload; at least 1. Default 3: at 2 a busy
	// machine's own queueing (app, broker and Hopper sharing its cores)
	// read as overload and held the limit below what the app could take.
	LatencyTolerance float64 `yaml:"latencyTolerance"`
}

// Shutdown governs SIGTERM and SIGINT: Hopper stops taking messages at
// once and lets those in flight finish.
type Shutdown struct {
	// Grace is how long in-flight deliveries may finish; the requests still
	// running then are cut off and their messages given back to the queue.
	// Default 25s.
	Grace Duration `yaml:"grace"`
}

// Admin is the HTTP admin endpoint: /livez (also /healthz), /readyz and
// /metrics.
type Admin struct {
	// Listen is the endpoint's address; "" disables it. Default ":9090".
	Listen string `yaml:"listen"`
}

// Log configures Hopper's log, written to standard error.
type Log struct {
	// Level is debug, info, warn or error; debug logs every delivery.
	// Default info.
	Level string `yaml:"level"`
	// Format is json or text. Default json.
	Format string `yaml:"format"`
}

// Default returns the configuration with every default filled in.
func Default() Config {
	return Config{
		Broker: Broker{
			URLs:            []string{"amqp://guest:guest@127.0.0.1:5672/"},
			Heartbeat:       Duration(10 * time.Second),
			ConnectTimeout:  Duration(10 * time.Second),
			ReconnectMin:    Duration(500 * time.Millisecond),
			ReconnectMax:    Duration(30 * time.Second),
			ConfirmTimeout:  Duration(15 * time.Second),
			MoveRetryMin:    Duration(time.Second),
			MoveRetryMax:    Duration(30 * time.Second),
			MoveHoldMax:     Duration(10 * time.Minute),
			PublishChannels: 8,
		},
		Queue: Queue{Type: "classic", Stream: Stream{
			Offset: "first", Port: 5552, QueueType: "quorum", StoreEvery: Duration(time.Second), Partitions: 3,
		}},
		Topology: Topology{Declare: true, RetryQueue: "{queue}.retry.{delay}", DLQ: "{queue}.dlq", ParkQueue: "{queue}.park.{delay}", Partitions: Partitions{HashOn: "routingKey"}},
		App: App{
			URL:                "http://127.0.0.1:8080/",
			Timeout:            Duration(30 * time.Second),
			UnavailableBackoff: Duration(time.Second),
			MaxBodyBytes:       64 << 10,
			Forward:            Forward{MaxHeaders: 90, MaxHeaderBytes: 7 << 10, MaxValueBytes: 4096},
			Auth:               AppAuth{Token: TokenAuth{Header: "Authorization"}, MaxRefused: Duration(5 * time.Minute)},
		},
		Consumer: Consumer{PrefetchBytes: DefaultPrefetchBytes, Batch: Batch{MaxMessages: 1, MaxBytes: DefaultBatchMaxBytes}},
		Retry: Retry{
			MaxAttempts: 10,
			Tiers: []Duration{Duration(time.Second), Duration(5 * time.Second), Duration(30 * time.Second),
				Duration(2 * time.Minute), Duration(10 * time.Minute), Duration(30 * time.Minute)},
			OnExpired:  "dlq",
			MaxCrashes: 3,
		},
		Requeue:  Requeue{MinHold: Duration(time.Second), MaxHold: Duration(5 * time.Second), MaxRequeues: 100},
		Schedule: Schedule{Step: Duration(time.Second), MaxDelay: Duration(24 * time.Hour), PastMax: "dlq"},
		Breaker:  Breaker{Enabled: true, Failures: 5, OpenTimeout: Duration(5 * time.Second), ProbeInterval: Duration(time.Second)},
		Limiter:  Limiter{Enabled: true, LatencyTolerance: 3},
		Shutdown: Shutdown{Grace: Duration(25 * time.Second)},
		Admin:    Admin{Listen: ":9090"},
		Log:      Log{Level: "info", Format: "json"},
	}
}

// Duration is a time.Duration written as a string with a unit ("5s") so a
// bare number can never be mistaken for seconds or nanoseconds.
type Duration time.Duration

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return FormatDuration(time.Duration(d)) }

// UnmarshalYAML accepts only strings with a unit.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return typeError(n, fmt.Errorf("duration must be a string with a unit, like \"5s\", got %q", n.Value))
	}
	v, err := ParseDuration(n.Value)
	if err != nil {
		return typeError(n, err)
	}
	*d = v
	return nil
}

// MarshalYAML writes the string form.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// ParseDuration parses "5s", "2m", "1h30m"; a unitless number (even "0")
// is an error.
func ParseDuration(s string) (Duration, error) {
	s = strings.TrimSpace(s)
	v, err := time.ParseDuration(s)
	if err == nil && strings.TrimLeft(s, "+-0123456789.") == "" {
		err = errors.New("no unit")
	}
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (want a number with a unit, like \"5s\")", s)
	}
	return Duration(v), nil
}

// FormatDuration is the short form used in queue names: 1s, 5s, 2m, 1h,
// 1h30m, 1m30s, 500ms (no zero components, unlike time.Duration.String).
// A negative duration keeps its sign, so that a validation message shows
// the value as it was given.
func FormatDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d == math.MinInt64:
		return d.String() // has no positive counterpart
	case d < 0:
		return "-" + FormatDuration(-d)
	}
	if d < time.Second && d%time.Millisecond == 0 {
		return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
	}
	if d%time.Second != 0 {
		return d.String()
	}
	var b strings.Builder
	for _, u := range []struct {
		unit time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if n := d / u.unit; n > 0 {
			b.WriteString(strconv.FormatInt(int64(n), 10) + u.name)
			d -= n * u.unit
		}
	}
	return b.String()
}

// Attempts is a positive attempt limit, or 0 meaning "unlimited" (written as
// the string "unlimited" so that a forgotten value never means for ever).
type Attempts int

// UnmarshalYAML accepts a positive integer or "unlimited".
func (a *Attempts) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseAttempts(n.Value)
	if err != nil {
		return typeError(n, err)
	}
	*a = v
	return nil
}

// MarshalYAML writes the number or "unlimited".
func (a Attempts) MarshalYAML() (any, error) {
	if a == 0 {
		return "unlimited", nil
	}
	return int(a), nil
}

// ParseAttempts reads a positive integer or "unlimited".
func ParseAttempts(s string) (Attempts, error) {
	s = strings.TrimSpace(s)
	if strings.EqualFold(s, "unlimited") {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("invalid attempt limit %q (want a positive integer or \"unlimited\")", s)
	}
	return Attempts(n), nil
}

// typeError lets the YAML decoder carry on after a bad value, so that every
// bad value is reported in one run.
func typeError(n *yaml.Node, err error) error {
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
}
