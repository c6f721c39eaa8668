package config

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
)

// Multi reports whether the config lists subscriptions (several queues)
// rather than the single top-level queue.
func (c *Config) Multi() bool { return len(c.Subscriptions) > 0 }

// SubscriptionConfigs returns one complete config per consumed queue: the
// top-level config with the subscription's keys laid over it. Without
// subscriptions it is the config itself, so the single-queue form and a
// list of one behave the same everywhere downstream (topology, retry
// policies, the delivery loop). The results share nothing mutable with c.
func (c *Config) SubscriptionConfigs() []Config {
	if !c.Multi() {
		return []Config{c.clone()}
	}
	out := make([]Config, len(c.Subscriptions))
	for i, s := range c.Subscriptions {
		out[i] = c.subscription(s)
	}
	return out
}

// Consumed returns one complete config per queue the sidecar consumes:
// SubscriptionConfigs, with each partitioned subscription expanded into
// its partition queues. A partition's config is its subscription's with
// queue.name the partition queue's, topology.dlq the one DLQ named from the
// partitioned queue, Topology.PartitionOf that queue's name and
// queue.singleActiveConsumer on; consumer
// and retry settings are the subscription's, so every partition is
// delivered and retried alike. A stream subscription's config is
// ForStream's: the queue it names is the subscription's own, beside the
// stream.
func (c *Config) Consumed() []Config {
	var out []Config
	for _, e := range c.SubscriptionConfigs() {
		p := e.Topology.Partitions
		if e.Queue.Type == QueueTypeStream {
			// Validate refuses partitions of a stream.
			out = append(out, e.ForStream())
			continue
		}
		if !p.On() {
			out = append(out, e)
			continue
		}
		dlq := nameFor(e.Topology.DLQ, e.Queue.Name, "")
		for i := range p.Count {
			pc := e.clone()
			pc.Queue.Name = PartitionQueue(e.Queue.Name, i)
			pc.Topology.DLQ = dlq
			pc.Topology.PartitionOf = e.Queue.Name
			// Each partition has one active consumer: the broker's, and
			// Hopper's own view of it (verify, roles, a fixed prefetch).
			yes := true
			pc.Queue.SingleActiveConsumer = &yes
			out = append(out, pc)
		}
	}
	return out
}

// subscription is the effective config of one subscription.
func (c *Config) subscription(s Subscription) Config {
	e := c.clone()
	e.Subscriptions = nil
	e.Queue.Name = s.Queue.Name
	if s.Queue.Type != "" {
		e.Queue.Type = s.Queue.Type
	}
	if s.Queue.TierType != "" {
		e.Queue.TierType = s.Queue.TierType
	}
	mergeStream(&e.Queue.Stream, s.Queue.Stream)
	if s.Queue.DeliveryLimit != 0 {
		e.Queue.DeliveryLimit = s.Queue.DeliveryLimit
	}
	if s.Queue.Arguments != nil {
		e.Queue.Arguments = maps.Clone(s.Queue.Arguments)
	}
	if s.Queue.SingleActiveConsumer != nil {
		e.Queue.SingleActiveConsumer = s.Queue.SingleActiveConsumer
	}
	if s.Bindings != nil {
		e.Topology.Bindings = slices.Clone(s.Bindings)
	}
	e.Routes = slices.Clone(s.Routes)
	e.Filter, e.OnFiltered, e.OnBodyError, e.OnFilterError = s.Filter, s.OnFiltered, s.OnBodyError, s.OnFilterError
	if s.Partitions != nil {
		e.Topology.Partitions.Count = s.Partitions.Count
		if s.Partitions.HashOn != "" {
			e.Topology.Partitions.HashOn = s.Partitions.HashOn
		}
	}
	if strings.HasPrefix(s.Path, "/") { // anything else is reported by Validate
		e.App.URL = withPath(c.App.URL, s.Path)
	}
	if s.Consumer.Prefetch != nil {
		e.Consumer.Prefetch = *s.Consumer.Prefetch
	}
	if s.Consumer.Workers != nil {
		e.Consumer.Workers = *s.Consumer.Workers
	}
	if s.Consumer.Ordered != nil {
		e.Consumer.Ordered = *s.Consumer.Ordered
	}
	if s.Consumer.OrderingKey != nil {
		e.Consumer.OrderingKey = *s.Consumer.OrderingKey
	}
	if s.Consumer.PrefetchBytes != nil {
		e.Consumer.PrefetchBytes = *s.Consumer.PrefetchBytes
	}
	if b := s.Consumer.Batch; b.MaxMessages != nil {
		e.Consumer.Batch.MaxMessages = *b.MaxMessages
	}
	if b := s.Consumer.Batch; b.MaxBytes != nil {
		e.Consumer.Batch.MaxBytes = *b.MaxBytes
	}
	if b := s.Consumer.Batch; b.MaxWait != nil {
		e.Consumer.Batch.MaxWait = *b.MaxWait
	}
	r := s.Retry
	if r.MaxAttempts != nil {
		e.Retry.MaxAttempts = *r.MaxAttempts
	}
	if r.Tiers != nil {
		e.Retry.Tiers = slices.Clone(r.Tiers)
	}
	if r.Outcomes != nil {
		merged := maps.Clone(e.Retry.Outcomes)
		if merged == nil {
			merged = map[string]string{}
		}
		maps.Copy(merged, r.Outcomes)
		e.Retry.Outcomes = merged
	}
	if r.OnExpired != "" {
		e.Retry.OnExpired = r.OnExpired
	}
	if r.DeadlineHeader != nil {
		e.Retry.DeadlineHeader = *r.DeadlineHeader
	}
	if r.Policies != nil {
		e.Retry.Policies = slices.Clone(r.Policies)
	}
	if r.MaxCrashes != nil {
		e.Retry.MaxCrashes = *r.MaxCrashes
	}
	return e
}

// clone copies the config deeply enough that changing the copy's lists and
// maps leaves c alone.
func (c *Config) clone() Config {
	e := *c
	e.Broker.URLs = slices.Clone(c.Broker.URLs)
	e.Queue.Arguments = maps.Clone(c.Queue.Arguments)
	e.Topology.Bindings = slices.Clone(c.Topology.Bindings)
	e.Retry.Tiers = slices.Clone(c.Retry.Tiers)
	e.Retry.Outcomes = maps.Clone(c.Retry.Outcomes)
	e.Retry.Policies = slices.Clone(c.Retry.Policies)
	e.Subscriptions = slices.Clone(c.Subscriptions)
	e.Routes = slices.Clone(c.Routes)
	return e
}

// withPath replaces the path and query of base with path, keeping scheme,
// user info, host and port. The path's {routingKey} and {queue} stay as
// they are for the client to fill in.
func withPath(base, path string) string {
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		return base // reported by Validate as a bad app.url
	}
	u.Path, u.RawPath, u.RawQuery, u.Fragment = "", "", "", ""
	return strings.TrimSuffix(u.String(), "/") + path
}

// validateSubscriptions checks what is particular to the subscriptions: the
// list itself, each subscription's own keys (by validating its effective
// config and keeping what the top level did not already report), and that
// no two subscriptions share a queue, since a tier queue dead-letters back
// to one work queue only.
func (c *Config) validateSubscriptions(topErrs map[string]bool, add func(path, format string, a ...any)) {
	if !c.Multi() {
		return
	}
	if strings.TrimSpace(c.Queue.Name) != "" {
		add("queue.name", "set either queue.name (one queue) or subscriptions (several), not both")
	}
	for _, k := range []struct {
		key string
		set bool
	}{{"routes", len(c.Routes) > 0}, {"filter", c.Filter != ""}, {"onFiltered", c.OnFiltered != ""}, {"onBodyError", c.OnBodyError != ""}, {"onFilterError", c.OnFilterError != ""}} {
		if k.set {
			add(k.key, "with subscriptions, set %s on each subscription that needs it, not at the top level", k.key)
		}
	}
	owner := map[string]string{} // queue name → the subscription key that uses it
	claim := func(name, path, what string) bool {
		if prev, ok := owner[name]; ok {
			add(path, "%s %q is already used by %s: each subscription needs queues of its own (check topology.retryQueue and topology.dlq hold {queue})", what, name, prev)
			return false
		}
		owner[name] = path
		return true
	}
	// The broker holds one exchange of one type under a name: subscriptions
	// sharing an exchange must declare it alike, or the second declare fails
	// after the first subscription's topology is already in place.
	type binder struct {
		b    Binding
		path string
	}
	exchanges := map[string]binder{}
	effs := c.SubscriptionConfigs()
	for i := range effs {
		path := fmt.Sprintf("subscriptions[%d]", i)
		for _, b := range effs[i].Topology.Bindings {
			prev, ok := exchanges[b.Exchange]
			if !ok {
				exchanges[b.Exchange] = binder{b, path}
				continue
			}
			if prev.path != path && (prev.b.Type != b.Type || prev.b.IsDurable() != b.IsDurable()) {
				add(path+".bindings", "exchange %q is bound as type=%s durable=%t, but %s binds it as type=%s durable=%t: subscriptions sharing an exchange must give it the same type and durability",
					b.Exchange, b.Type, b.IsDurable(), prev.path, prev.b.Type, prev.b.IsDurable())
			}
		}
	}
subs:
	for i, s := range c.Subscriptions {
		path := fmt.Sprintf("subscriptions[%d]", i)
		if s.Path != "" && !strings.HasPrefix(s.Path, "/") {
			add(path+".path", "must start with /, got %q", s.Path)
		}
		e := effs[i]
		for _, err := range e.validateOne() {
			if topErrs[err.Error()] {
				continue // inherited: already reported under its top-level key
			}
			key, rest, _ := strings.Cut(err.Error(), ": ")
			add(path+"."+subscriptionKey(key), "%s", rest)
		}
		if strings.TrimSpace(s.Queue.Name) == "" {
			continue
		}
		if e.Queue.Type == QueueTypeStream {
			// Its queues are those of its own queue beside the stream:
			// two consumer names may read one stream.
			e = e.ForStream()
		}
		if !claim(e.Queue.Name, path+".queue.name", "queue") ||
			!claim(nameFor(e.Topology.DLQ, e.Queue.Name, ""), path+".queue.name", "its DLQ") {
			continue
		}
		queues := []string{e.Queue.Name}
		if p := e.Topology.Partitions; p.On() && p.Count <= MaxPartitions {
			queues = queues[:0]
			for j := range p.Count {
				if !claim(PartitionQueue(e.Queue.Name, j), path+".queue.name", "its partition queue") {
					continue subs
				}
				queues = append(queues, PartitionQueue(e.Queue.Name, j))
			}
		}
	tiers:
		for _, q := range queues {
			for _, d := range e.AllTiers() {
				if !claim(nameFor(e.Topology.RetryQueue, q, FormatDuration(d)), path+".queue.name", "its tier queue") {
					break tiers
				}
			}
		}
	}
}

// subscriptionKey maps a key of the effective config to where a
// subscription sets it.
func subscriptionKey(key string) string {
	switch {
	case strings.HasPrefix(key, "topology.bindings"):
		return strings.TrimPrefix(key, "topology.")
	case strings.HasPrefix(key, "topology.partitions"):
		return strings.TrimPrefix(key, "topology.")
	case key == "app.url":
		return "path"
	}
	return key
}

// nameFor expands a queue name template as the topology does.
func nameFor(tmpl, queue, delay string) string {
	return strings.NewReplacer("{queue}", queue, "{delay}", delay).Replace(tmpl)
}
