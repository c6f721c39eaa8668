package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hopper-sidecar/hopper/internal/redact"
	"github.com/hopper-sidecar/hopper/internal/signing"
	"github.com/hopper-sidecar/hopper/order"
	"github.com/hopper-sidecar/hopper/retry"
)

// brokerConsumerTimeout is RabbitMQ's default consumer_timeout: a delivery
// held longer makes the broker close the channel.
const brokerConsumerTimeout = 30 * time.Minute

// The bounds of consumer.batch. A batch is held unacked while it fills and
// while the app works on it, so neither may grow without end: a thousand
// messages is far past where the app's cost per message stops falling, and
// five minutes is AWS Lambda's longest batching window.
const (
	MaxBatchMessages = 1000
	MaxBatchWait     = 5 * time.Minute
)

// Validate reports every problem at once, each prefixed with its key path.
func (c *Config) Validate() error {
	errs := c.validateOne()
	top := make(map[string]bool, len(errs))
	for _, err := range errs {
		top[err.Error()] = true
	}
	c.validateSubscriptions(top, func(path, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, a...)))
	})
	return errors.Join(errs...)
}

// validateOne checks one config's own keys; with subscriptions the queue
// name is theirs, not the top level's.
func (c *Config) validateOne() []error {
	var errs []error
	add := func(path, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, a...)))
	}

	if len(c.Broker.URLs) == 0 {
		add("broker.urls", "at least one broker URL is required")
	}
	for i, u := range c.Broker.URLs {
		pu, err := url.Parse(u)
		switch {
		case err != nil:
			add(fmt.Sprintf("broker.urls[%d]", i), "not a URL: %v", redact.Error(err, u))
		case pu.Scheme != "amqp" && pu.Scheme != "amqps":
			add(fmt.Sprintf("broker.urls[%d]", i), "scheme must be amqp or amqps, got %q", pu.Scheme)
		case pu.Host == "":
			add(fmt.Sprintf("broker.urls[%d]", i), "missing host")
		}
	}
	for _, f := range []struct{ path, file string }{
		{"broker.passwordFile", c.Broker.PasswordFile}, {"broker.usernameFile", c.Broker.UsernameFile},
		{"broker.tls.caFile", c.Broker.TLS.CAFile}, {"broker.tls.certFile", c.Broker.TLS.CertFile},
		{"broker.tls.keyFile", c.Broker.TLS.KeyFile},
	} {
		if f.file != "" {
			if _, err := os.Stat(f.file); err != nil {
				add(f.path, "%v", err)
			}
		}
	}
	if (c.Broker.TLS.CertFile == "") != (c.Broker.TLS.KeyFile == "") {
		add("broker.tls", "certFile and keyFile must be given together")
	}
	positive := func(path string, d Duration) {
		if d <= 0 {
			add(path, "must be positive, got %s", d)
		}
	}
	positive("broker.heartbeat", c.Broker.Heartbeat)
	positive("broker.connectTimeout", c.Broker.ConnectTimeout)
	positive("broker.reconnectMin", c.Broker.ReconnectMin)
	positive("broker.reconnectMax", c.Broker.ReconnectMax)
	positive("broker.confirmTimeout", c.Broker.ConfirmTimeout)
	positive("broker.moveRetryMin", c.Broker.MoveRetryMin)
	positive("broker.moveRetryMax", c.Broker.MoveRetryMax)
	positive("broker.moveHoldMax", c.Broker.MoveHoldMax)
	if c.Broker.MoveRetryMax < c.Broker.MoveRetryMin {
		add("broker.moveRetryMax", "must be at least moveRetryMin (%s)", c.Broker.MoveRetryMin)
	}
	if c.Broker.MoveHoldMax >= Duration(30*time.Minute) {
		add("broker.moveHoldMax", "must stay under the broker's consumer_timeout (30m by default), got %s", c.Broker.MoveHoldMax)
	}
	if c.Broker.ReconnectMax < c.Broker.ReconnectMin {
		add("broker.reconnectMax", "must be at least reconnectMin (%s)", c.Broker.ReconnectMin)
	}
	if c.Broker.PublishChannels < 1 || c.Broker.PublishChannels > 256 {
		add("broker.publishChannels", "must be between 1 and 256, got %d", c.Broker.PublishChannels)
	}

	if c.Multi() {
		// Each subscription names its queue.
	} else if strings.TrimSpace(c.Queue.Name) == "" {
		add("queue.name", "required (the work queue to consume, or a list of subscriptions)")
	} else if len(c.Queue.Name) > 200 {
		add("queue.name", "longer than 200 bytes leaves no room for tier queue names")
	}
	stream := c.Queue.Type == QueueTypeStream
	if stream {
		validateStream(c, add)
	} else if c.Queue.Type != "classic" && c.Queue.Type != "quorum" {
		add("queue.type", "must be classic, quorum or stream, got %q", c.Queue.Type)
	} else if c.Queue.Stream.SuperStream {
		add("queue.stream.superStream", "only with queue.type stream: a super stream is read through the stream protocol")
	}
	switch c.Queue.TierType {
	case "", "quorum":
	case "classic":
		if c.Queue.Type == "quorum" || stream && c.Queue.Stream.QueueType == "quorum" {
			add("queue.tierType", "classic tiers would hand a quorum work queue's retries back at most once: a quorum work queue's tiers are quorum (leave tierType out)")
		}
	default:
		add("queue.tierType", "must be classic or quorum, got %q", c.Queue.TierType)
	}
	if c.Queue.DeliveryLimit < 0 || c.Queue.DeliveryLimit > math.MaxInt32 {
		add("queue.deliveryLimit", "must be between 0 and %d", math.MaxInt32)
	} else if c.Queue.DeliveryLimit > 0 && c.Queue.Type != "quorum" && !stream {
		// Accepted and dropped, it would promise a limit the queue never has.
		add("queue.deliveryLimit", "a %s queue has no delivery limit, so %d would do nothing: drop the key, or set queue.type: quorum", c.Queue.Type, c.Queue.DeliveryLimit)
	}
	if !stream {
		validateArguments(c.Queue, add)
	}

	if !strings.Contains(c.Topology.RetryQueue, "{delay}") {
		add("topology.retryQueue", "template must contain {delay} so each tier has its own queue, got %q", c.Topology.RetryQueue)
	}
	if strings.TrimSpace(c.Topology.DLQ) == "" {
		add("topology.dlq", "required")
	}
	validateBindings(c.Topology.Bindings, add)
	validatePartitions(c.Topology.Partitions, add)
	c.validateSchedule(add)
	if c.Topology.Partitions.On() && !strings.Contains(c.Topology.RetryQueue, "{queue}") {
		add("topology.retryQueue", "with topology.partitions each partition needs tier queues of its own (they dead-letter back to it): the template must contain {queue}, got %q", c.Topology.RetryQueue)
	}
	if c.Topology.DLQMaxLength < 0 || c.Topology.DLQMaxLength > math.MaxInt32 {
		add("topology.dlqMaxLength", "must be between 0 and %d", math.MaxInt32)
	}

	if u, err := url.Parse(c.App.URL); err != nil {
		add("app.url", "not a URL: %v", redact.Error(err, c.App.URL))
	} else if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		add("app.url", "must be an absolute http:// or https:// URL, got %q", redact.URL(c.App.URL))
	}
	positive("app.timeout", c.App.Timeout)
	if c.App.Timeout.D() >= brokerConsumerTimeout/2 {
		add("app.timeout", "must stay well under the broker's 30m consumer_timeout, got %s", c.App.Timeout)
	}
	if c.App.HealthPath != "" && !strings.HasPrefix(c.App.HealthPath, "/") {
		add("app.healthPath", "must start with /, got %q", c.App.HealthPath)
	}
	if c.App.UnavailableBackoff < 0 {
		add("app.unavailableBackoff", "must not be negative")
	}
	if c.App.MaxBodyBytes < 0 {
		add("app.maxBodyBytes", "must not be negative")
	}
	if f := c.App.Forward; f.MaxHeaders < MinForwardHeaders {
		add("app.forward.maxHeaders", "must be at least %d (Hopper's own headers take up to 27), got %d", MinForwardHeaders, f.MaxHeaders)
	}
	if f := c.App.Forward; f.MaxHeaderBytes < MinForwardHeaderBytes {
		add("app.forward.maxHeaderBytes", "must be at least %d, got %d", MinForwardHeaderBytes, f.MaxHeaderBytes)
	}
	if f := c.App.Forward; f.MaxValueBytes < 1 || f.MaxValueBytes > f.MaxHeaderBytes {
		add("app.forward.maxValueBytes", "must be between 1 and app.forward.maxHeaderBytes (%d), got %d", f.MaxHeaderBytes, f.MaxValueBytes)
	}
	validateAuth(c.App.Auth, add)
	if c.App.Auth.MaxRefused < 0 {
		add("app.auth.maxRefused", "must not be negative, got %s", c.App.Auth.MaxRefused)
	}
	if c.App.BasicAuth() && c.App.Auth.Token.File != "" && strings.EqualFold(c.App.Auth.Token.Header, "Authorization") {
		add("app.auth.token.header", "app.url holds user info, sent as Authorization: Basic on every request in place of the token: send the token in another header, or drop the user info")
	}
	validateAppTLS(c.App, add)

	if c.Consumer.Prefetch < 0 || c.Consumer.Prefetch > 65535 {
		add("consumer.prefetch", "must be between 1 and 65535, or 0 to follow the concurrency limit; got %d", c.Consumer.Prefetch)
	}
	if c.Consumer.PrefetchBytes < 0 {
		add("consumer.prefetchBytes", "must not be negative (0 bounds nothing), got %d", c.Consumer.PrefetchBytes)
	}
	if c.Consumer.Workers < 0 || c.Consumer.Workers > 32767 {
		add("consumer.workers", "must be between 1 and 32767, or 0 for the default; got %d", c.Consumer.Workers)
	}
	if c.Consumer.Workers > c.Consumer.Prefetch && c.Consumer.Prefetch > 0 && !c.Consumer.Ordered {
		add("consumer.workers", "more workers (%d) than prefetch (%d) would sit idle", c.Consumer.Workers, c.Consumer.Prefetch)
	}

	if _, err := order.Parse(c.Consumer.OrderingKey); err != nil {
		add("consumer.orderingKey", "%v", err)
	} else if c.Consumer.OrderingKey != "" && c.Consumer.Ordered {
		add("consumer.orderingKey", "consumer.ordered already orders the whole queue as one key: set one of the two")
	} else if c.Consumer.OrderingKey != "" && c.Consumer.Batch.On() {
		add("consumer.orderingKey", "ordering keys and batch delivery (consumer.batch.maxMessages %d) cannot be combined: a batch would hold several messages of one key at once", c.Consumer.Batch.MaxMessages)
	}

	if b := c.Consumer.Batch; b.MaxMessages < 1 || b.MaxMessages > MaxBatchMessages {
		add("consumer.batch.maxMessages", "must be between 1 (batching off) and %d, got %d", MaxBatchMessages, b.MaxMessages)
	} else if b.On() && c.Consumer.Prefetch > 0 && b.MaxMessages > c.Consumer.Prefetch {
		add("consumer.batch.maxMessages", "a batch of %d can never fill with a prefetch of %d: raise consumer.prefetch or lower the batch", b.MaxMessages, c.Consumer.Prefetch)
	}
	if b := c.Consumer.Batch; b.On() && strings.Contains(c.App.URL, "{routingKey}") {
		add("consumer.batch.maxMessages", "a batch holds messages of many routing keys, so the app URL cannot hold {routingKey}: turn batching off or drop it from app.url")
	}
	if b := c.Consumer.Batch; b.MaxBytes < 1 {
		add("consumer.batch.maxBytes", "must be at least 1 byte (a larger message goes alone), got %d", b.MaxBytes)
	}
	if b := c.Consumer.Batch; b.MaxWait < 0 || b.MaxWait.D() > MaxBatchWait {
		add("consumer.batch.maxWait", "must be between 0s and %s, got %s", MaxBatchWait, b.MaxWait.D())
	}

	validateTiers("retry.tiers", c.Retry.Tiers, add)
	if _, err := retry.ParseTable(c.Retry.Outcomes); err != nil {
		add("retry.outcomes", "%v", err)
	}
	if c.Retry.OnExpired != "dlq" && c.Retry.OnExpired != "drop" {
		add("retry.onExpired", "must be dlq or drop, got %q", c.Retry.OnExpired)
	}
	names := map[string]bool{}
	for i, p := range c.Retry.Policies {
		path := fmt.Sprintf("retry.policies[%d]", i)
		if p.Name == "" {
			add(path+".name", "required")
		} else if names[p.Name] {
			add(path+".name", "duplicate policy name %q", p.Name)
		}
		names[p.Name] = true
		if p.Match == (Match{}) {
			add(path+".match", "must set routingKey, type or header (a policy matching everything hides the defaults)")
		}
		if p.Match.Header != "" && strings.HasPrefix(p.Match.Header, "=") {
			add(path+".match.header", "want name or name=value, got %q", p.Match.Header)
		}
		if p.Tiers != nil {
			validateTiers(path+".tiers", p.Tiers, add)
		}
		if _, err := retry.ParseTable(p.Outcomes); err != nil {
			add(path+".outcomes", "%v", err)
		}
		if p.OnExpired != "" && p.OnExpired != "dlq" && p.OnExpired != "drop" {
			add(path+".onExpired", "must be dlq or drop, got %q", p.OnExpired)
		}
	}

	c.validateRoutes(add)

	positive("requeue.maxHold", c.Requeue.MaxHold)
	if c.Requeue.MinHold < 0 || c.Requeue.MinHold > c.Requeue.MaxHold {
		add("requeue.minHold", "must be between 0 and maxHold (%s), got %s", c.Requeue.MaxHold, c.Requeue.MinHold)
	}
	if c.Requeue.MaxRequeues < 1 {
		add("requeue.maxRequeues", "must be at least 1, got %d", c.Requeue.MaxRequeues)
	}
	if c.Breaker.Failures < 1 {
		add("breaker.failures", "must be at least 1, got %d", c.Breaker.Failures)
	}
	if c.Retry.MaxCrashes < 0 {
		add("retry.maxCrashes", "must be 0 (never) or more, got %d", c.Retry.MaxCrashes)
	}
	if c.Limiter.LatencyTolerance < 1 {
		add("limiter.latencyTolerance", "must be at least 1 (a multiple of the app's usual latency), got %g", c.Limiter.LatencyTolerance)
	}
	positive("breaker.openTimeout", c.Breaker.OpenTimeout)
	positive("breaker.probeInterval", c.Breaker.ProbeInterval)
	positive("shutdown.grace", c.Shutdown.Grace)
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.Log.Level) {
		add("log.level", "must be debug, info, warn or error, got %q", c.Log.Level)
	}
	if c.Log.Format != "json" && c.Log.Format != "text" {
		add("log.format", "must be json or text, got %q", c.Log.Format)
	}
	return errs
}

// validateAuth checks the secret files as Hopper will read them at start:
// present, readable and not empty once a trailing newline is dropped.
func validateAuth(a AppAuth, add func(path, format string, a ...any)) {
	if a.Token.File != "" {
		if tok, err := readSecret(a.Token.File); err != nil {
			add("app.auth.token.file", "%v", err)
		} else if strings.ContainsFunc(tok, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }) {
			add("app.auth.token.file", "%s: the token holds a control character (a line break inside it?)", a.Token.File)
		}
	}
	h := a.Token.Header
	lower := strings.ToLower(h)
	switch {
	case !isToken(h):
		add("app.auth.token.header", "must be an HTTP header name, got %q", h)
	case strings.HasPrefix(lower, "hopper-") || strings.HasPrefix(lower, "ce-") ||
		slices.Contains([]string{"host", "content-type", "content-length", "user-agent", "traceparent", "tracestate", "connection", "transfer-encoding",
			"webhook-id", "webhook-timestamp", "webhook-signature"}, lower):
		add("app.auth.token.header", "%q is a header Hopper or HTTP itself sets: pick another name", h)
	}
	if a.HMAC.KeyFile != "" {
		if _, err := readSecret(a.HMAC.KeyFile); err != nil {
			add("app.auth.hmac.keyFile", "%v", err)
		}
	}
	if f := a.StandardWebhooks.SecretFile; f != "" {
		if s, err := readSecret(f); err != nil {
			add("app.auth.standardWebhooks.secretFile", "%v", err)
		} else if _, err := signing.ParseSecrets(s); err != nil {
			add("app.auth.standardWebhooks.secretFile", "%s: %v", f, err)
		}
	}
}

// validateAppTLS loads the CA and the client certificate as Hopper will at
// start, so a wrong file is reported before anything connects.
func validateAppTLS(a App, add func(path, format string, a ...any)) {
	t := a.TLS
	if t == (AppTLS{}) {
		return
	}
	if u, err := url.Parse(a.URL); err == nil && u.Scheme != "https" {
		add("app.tls", "applies to an https:// app.url, got %q", redact.URL(a.URL))
	}
	if t.CAFile != "" {
		if b, err := os.ReadFile(t.CAFile); err != nil {
			add("app.tls.caFile", "%v", err)
		} else if !x509.NewCertPool().AppendCertsFromPEM(b) {
			add("app.tls.caFile", "%s holds no PEM certificate", t.CAFile)
		}
	}
	switch {
	case (t.CertFile == "") != (t.KeyFile == ""):
		add("app.tls", "certFile and keyFile must be given together")
	case t.CertFile != "":
		if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
			add("app.tls.certFile", "with keyFile %s: %v", t.KeyFile, err)
		}
	}
}

// readSecret reads a secret file without its trailing newline; empty is
// an error.
func readSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// isToken reports whether s is an HTTP header name (an RFC 9110 token).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func validateTiers(path string, tiers []Duration, add func(string, string, ...any)) {
	if len(tiers) == 0 {
		add(path, "at least one delay tier is required")
	}
	for i, d := range tiers {
		if d < Duration(time.Millisecond) {
			add(fmt.Sprintf("%s[%d]", path, i), "must be at least 1ms, got %s", d)
		}
		if d.D()/time.Millisecond > math.MaxInt32 {
			// x-message-ttl is a 32-bit count of milliseconds.
			add(fmt.Sprintf("%s[%d]", path, i), "must be at most 596h (RabbitMQ's largest message TTL), got %s", d)
		}
		if i > 0 && d <= tiers[i-1] {
			add(fmt.Sprintf("%s[%d]", path, i), "tiers must be in increasing order (%s after %s)", d, tiers[i-1])
		}
	}
}

// exchangeTypes are the exchange types a binding may name.
var exchangeTypes = []string{"topic", "direct", "fanout", "headers"}

// brokerExchanges are the exchanges every RabbitMQ vhost has, with their
// types: they cannot be declared, only bound to.
var brokerExchanges = map[string]string{
	"amq.direct": "direct", "amq.fanout": "fanout", "amq.topic": "topic",
	"amq.headers": "headers", "amq.match": "headers",
}

func validateBindings(bs []Binding, add func(path, format string, a ...any)) {
	types := map[string]string{}
	for i, b := range bs {
		path := fmt.Sprintf("topology.bindings[%d]", i)
		switch {
		case strings.TrimSpace(b.Exchange) == "":
			add(path+".exchange", "required (the default exchange \"\" already routes by queue name and takes no bindings)")
		case strings.HasPrefix(b.Exchange, "amq.") && brokerExchanges[b.Exchange] == "":
			add(path+".exchange", "%q: names starting with amq. are reserved for the broker's own exchanges (%s)", b.Exchange, strings.Join(slices.Sorted(maps.Keys(brokerExchanges)), ", "))
		}
		if !slices.Contains(exchangeTypes, b.Type) {
			add(path+".type", "must be one of %s, got %q", strings.Join(exchangeTypes, ", "), b.Type)
			continue
		}
		if want := brokerExchanges[b.Exchange]; want != "" && want != b.Type {
			add(path+".type", "%s is the broker's %s exchange, got %q", b.Exchange, want, b.Type)
		}
		if prev, ok := types[b.Exchange]; ok && prev != b.Type {
			add(path+".type", "exchange %q is bound twice with different types (%s, %s)", b.Exchange, prev, b.Type)
		}
		types[b.Exchange] = b.Type
		switch b.Type {
		case "topic", "direct":
			if len(b.RoutingKeys) == 0 {
				add(path+".routingKeys", "a %s exchange routes by key: give at least one (topic patterns may use * and #)", b.Type)
			}
			if len(b.Headers) > 0 || b.Match != "" {
				add(path+".headers", "only a headers exchange matches on headers")
			}
		case "fanout":
			if len(b.RoutingKeys) > 0 || len(b.Headers) > 0 || b.Match != "" {
				add(path, "a fanout exchange routes every message to every bound queue: remove routingKeys/headers/match")
			}
		case "headers":
			if len(b.Headers) == 0 {
				add(path+".headers", "a headers exchange needs the headers to match")
			}
			if len(b.RoutingKeys) > 0 {
				add(path+".routingKeys", "a headers exchange ignores routing keys: remove them")
			}
			if b.Match != "" && b.Match != "all" && b.Match != "any" {
				add(path+".match", "must be all or any, got %q", b.Match)
			}
			for k := range b.Headers {
				if strings.HasPrefix(k, "x-") {
					add(path+".headers", "%q: headers starting with x- are not matched by a headers exchange", k)
				}
			}
		}
	}
}

// ownedArguments are the queue arguments Hopper sets itself, each with the
// key that models it: given in queue.arguments as well, one would silently
// undo the other.
var ownedArguments = map[string]string{
	"x-queue-type":              "set queue.type instead",
	"x-dead-letter-exchange":    "Hopper dead-letters the work queue to its DLQ itself: set topology.dlq instead",
	"x-dead-letter-routing-key": "Hopper dead-letters the work queue to its DLQ itself: set topology.dlq instead",
	"x-dead-letter-strategy":    "Hopper sets at-least-once on quorum queues itself (queue.type)",
	"x-delivery-limit":          "set queue.deliveryLimit instead",
	"x-single-active-consumer":  "set queue.singleActiveConsumer instead",
	"x-expires":                 "a work queue that deletes itself when unused takes the way back from its delay tiers with it: Hopper's queues never expire",
}

// validateArguments checks queue.arguments: the keys Hopper models are
// refused with the key that does, the well-known ones are checked for the
// type and range the broker takes, and any other x- key passes as it is.
func validateArguments(q Queue, add func(path, format string, a ...any)) {
	quorum := q.Type == "quorum"
	for _, k := range slices.Sorted(maps.Keys(q.Arguments)) {
		a := q.Arguments[k]
		path := "queue.arguments." + k
		intIn := func(lo, hi int64) {
			if n, ok := a.Int(); !ok || n < lo || n > hi {
				add(path, "must be an integer %d..%d, got %v", lo, hi, describeArgument(a))
			}
		}
		oneOf := func(values ...string) {
			if s, ok := a.Str(); !ok || !slices.Contains(values, s) {
				add(path, "must be one of %s, got %v", strings.Join(values, ", "), describeArgument(a))
			}
		}
		classicOnly := func() {
			if quorum {
				add(path, "applies to classic queues only; a quorum queue (queue.type) refuses it")
			}
		}
		if why, ok := ownedArguments[k]; ok {
			add(path, "is set by Hopper: %s", why)
			continue
		}
		switch k {
		case "x-max-priority":
			intIn(1, 255)
			if quorum {
				add(path, "quorum queues do not support priorities and RabbitMQ refuses the argument: use a classic queue (queue.type) or leave it out")
			}
		case "x-queue-leader-locator":
			oneOf("client-local", "balanced")
		case "x-queue-master-locator":
			oneOf("client-local", "balanced", "min-masters", "random")
			classicOnly()
		case "x-max-length", "x-max-length-bytes":
			intIn(0, math.MaxInt64)
		case "x-message-ttl":
			// RabbitMQ's largest TTL is a 32-bit count of milliseconds.
			intIn(0, math.MaxInt32)
		case "x-overflow":
			oneOf("drop-head", "reject-publish", "reject-publish-dlx")
			if s, _ := a.Str(); quorum && s != "reject-publish" {
				add(path, "a quorum work queue dead-letters at-least-once, which needs reject-publish (Hopper sets it); got %v", describeArgument(a))
			}
		case "x-queue-mode":
			oneOf("default", "lazy")
			classicOnly()
		case "x-queue-version":
			intIn(1, 2)
			classicOnly()
		case "x-max-age", "x-stream-max-segment-size-bytes":
			add(path, "applies to streams only; Hopper consumes classic and quorum queues")
		default:
			if !strings.HasPrefix(k, "x-") {
				add(path, "queue arguments start with x- (RabbitMQ ignores any other), got %q", k)
			}
		}
	}
}

// describeArgument shows a value with its type, so that "10" (a string)
// and 10 (an integer) read differently in an error.
func describeArgument(a Argument) string {
	if s, ok := a.Str(); ok {
		return fmt.Sprintf("the string %q", s)
	}
	return a.String()
}

// validatePartitions checks topology.partitions: the count's range and
// what the exchange hashes.
func validatePartitions(p Partitions, add func(path, format string, a ...any)) {
	if p.Count < 0 || p.Count > MaxPartitions {
		add("topology.partitions.count", "must be between 0 (off) and %d, got %d", MaxPartitions, p.Count)
	}
	switch name, isHeader := strings.CutPrefix(p.HashOn, "header:"); {
	case p.HashOn == "routingKey":
	case isHeader && strings.TrimSpace(name) == "":
		add("topology.partitions.hashOn", "header: needs the header's name, like header:customer-id")
	case isHeader && strings.TrimSpace(name) != name:
		add("topology.partitions.hashOn", "header name %q has spaces around it", name)
	case !isHeader:
		add("topology.partitions.hashOn", "must be routingKey or header:NAME, got %q", p.HashOn)
	}
}

// MaxParkQueues bounds the ladder of parking queues a schedule declares
// per work queue: each is a quorum queue, a Raft group on the broker.
const MaxParkQueues = 24

// validateSchedule checks schedule and the parking queues' names.
func (c *Config) validateSchedule(add func(path, format string, a ...any)) {
	s := c.Schedule
	if s.PastMax != "dlq" && s.PastMax != "longest" {
		add("schedule.pastMax", "must be dlq or longest, got %q", s.PastMax)
	}
	if !s.Enabled {
		return
	}
	if s.Step.D() < time.Millisecond {
		add("schedule.step", "must be at least 1ms, got %s", s.Step.D())
	}
	if s.MaxDelay.D() < s.Step.D() {
		add("schedule.maxDelay", "must be at least schedule.step (%s), got %s", s.Step.D(), s.MaxDelay.D())
	}
	if s.Step.D() >= time.Millisecond && s.MaxDelay.D() >= s.Step.D() {
		if n := len(c.ParkSteps()); n > MaxParkQueues {
			add("schedule.maxDelay", "from a step of %s to %s takes %d parking queues, more than %d: raise schedule.step or lower schedule.maxDelay",
				s.Step.D(), s.MaxDelay.D(), n, MaxParkQueues)
		}
	}
	// A parking queue's TTL is an x-message-ttl, a 32-bit count of
	// milliseconds.
	if s.MaxDelay.D() > math.MaxInt32*time.Millisecond {
		add("schedule.maxDelay", "must be at most %s (a queue's message TTL is 32-bit milliseconds), got %s",
			FormatDuration(math.MaxInt32*time.Millisecond), s.MaxDelay.D())
	}
	if !strings.Contains(c.Topology.ParkQueue, "{delay}") {
		add("topology.parkQueue", "template must contain {delay} so each parking delay has its own queue, got %q", c.Topology.ParkQueue)
	}
	if c.Topology.Partitions.On() && !strings.Contains(c.Topology.ParkQueue, "{queue}") {
		add("topology.parkQueue", "with topology.partitions each partition needs parking queues of its own (they dead-letter back to it): the template must contain {queue}, got %q", c.Topology.ParkQueue)
	}
	if c.Topology.ParkQueue == c.Topology.RetryQueue {
		add("topology.parkQueue", "must differ from topology.retryQueue (%q): a parking queue and a delay tier of the same delay would be one queue", c.Topology.RetryQueue)
	}
}

// ParkSteps are the parking delays of schedule, shortest first: step,
// 2×step, 4×step and so on up to maxDelay.
func (c *Config) ParkSteps() []time.Duration {
	var out []time.Duration
	for d := c.Schedule.Step.D(); d > 0 && d <= c.Schedule.MaxDelay.D(); d *= 2 {
		out = append(out, d)
	}
	return out
}
