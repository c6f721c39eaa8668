package config

import (
	"slices"
	"strings"
	"time"

	"github.com/hopper-sidecar/hopper/retry"
)

// Selector builds the retry policies from a validated config.
func (c *Config) Selector() *retry.Selector {
	base := retry.Merge(c.defaultTable(), mustTable(c.Retry.Outcomes))
	def := &retry.Policy{
		Name:          "default",
		MaxAttempts:   int(c.Retry.MaxAttempts),
		Tiers:         durations(c.Retry.Tiers),
		Table:         base,
		ExpiredAction: expiredAction(c.Retry.OnExpired),
		MaxRequeues:   c.Requeue.MaxRequeues,
		MaxHold:       c.Requeue.MaxHold.D(),
		MinHold:       c.Requeue.MinHold.D(),
		MaxCrashes:    c.Retry.MaxCrashes,
	}
	s := &retry.Selector{Default: def}
	for _, p := range c.Retry.Policies {
		pol := *def
		pol.Name = p.Name
		if p.MaxAttempts != nil {
			pol.MaxAttempts = int(*p.MaxAttempts)
		}
		if p.Tiers != nil {
			pol.Tiers = durations(p.Tiers)
		}
		pol.Table = retry.Merge(base, mustTable(p.Outcomes))
		if p.OnExpired != "" {
			pol.ExpiredAction = expiredAction(p.OnExpired)
		}
		m := retry.Match{RoutingKey: p.Match.RoutingKey, Type: p.Match.Type}
		m.Header, m.HeaderValue, _ = strings.Cut(p.Match.Header, "=")
		s.Rules = append(s.Rules, retry.Rule{Match: m, Policy: &pol})
	}
	return s
}

// defaultTable is the outcome table before retry.outcomes. Its 401 pause
// is for an app refusing the credentials Hopper sends; when Hopper sends
// none, the 401 cannot be about them, and pausing every queue for it would
// stall them all on one message's answer: it is then the 4xx it is
// (retry.outcomes {"401": pause} asks for the pause anyway, for a proxy in
// front of the app that authenticates the pod, say).
func (c *Config) defaultTable() retry.Table {
	t := retry.DefaultTable()
	if !c.App.SendsCredentials() {
		delete(t, "401")
	}
	return t
}

// AllTiers is every delay any policy or route uses, sorted: one tier queue
// each.
func (c *Config) AllTiers() []time.Duration {
	all := durations(c.Retry.Tiers)
	for _, p := range c.Retry.Policies {
		all = append(all, durations(p.Tiers)...)
	}
	for _, r := range c.Routes {
		if r.Retry != nil {
			all = append(all, durations(r.Retry.Tiers)...)
		}
	}
	slices.Sort(all)
	return slices.Compact(all)
}

func durations(ds []Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.D()
	}
	return out
}

func expiredAction(s string) retry.Action {
	if s == "drop" {
		return retry.Drop
	}
	return retry.DLQ
}

// mustTable parses a table that Validate already accepted.
func mustTable(raw map[string]string) retry.Table {
	t, _ := retry.ParseTable(raw)
	return t
}
