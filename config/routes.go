package config

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/route"
)

// Routed reports whether the config has routing rules: routes or a filter.
func (c *Config) Routed() bool { return len(c.Routes) > 0 || strings.TrimSpace(c.Filter) != "" }

// RouteTable compiles the routing rules of a one-queue config (or of one
// subscription's effective config). A route's retry block is its policy,
// built over the retry defaults; a route without one leaves the message to
// retry.policies. It returns nil without rules.
func (c *Config) RouteTable() (*route.Table, error) {
	if !c.Routed() {
		return nil, nil
	}
	return route.Compile(c.routeSpec(c.Selector().Default))
}

// RouteURLs is the app URL of each route that has a path of its own, by
// route name.
func (c *Config) RouteURLs() map[string]string {
	var out map[string]string
	for _, r := range c.Routes {
		if strings.HasPrefix(r.Path, "/") {
			if out == nil {
				out = map[string]string{}
			}
			out[strings.TrimSpace(r.Name)] = withPath(c.App.URL, r.Path)
		}
	}
	return out
}

func (c *Config) routeSpec(def *retry.Policy) route.Spec {
	s := route.Spec{Filter: c.Filter, OnFiltered: c.OnFiltered, OnBodyError: c.OnBodyError, OnFilterError: c.OnFilterError}
	for _, r := range c.Routes {
		rs := route.RouteSpec{Name: r.Name, Match: r.Match}
		if r.Retry != nil && def != nil {
			pol := *def
			pol.Name = "route:" + strings.TrimSpace(r.Name)
			if r.Retry.MaxAttempts != nil {
				pol.MaxAttempts = int(*r.Retry.MaxAttempts)
			}
			if r.Retry.Tiers != nil {
				pol.Tiers = durations(r.Retry.Tiers)
			}
			pol.Table = retry.Merge(def.Table, mustTable(r.Retry.Outcomes))
			if r.Retry.OnExpired != "" {
				pol.ExpiredAction = expiredAction(r.Retry.OnExpired)
			}
			rs.Policy = &pol
		}
		s.Routes = append(s.Routes, rs)
	}
	return s
}

// validateRoutes checks the routing rules: every expression compiles and
// has the right type (with the line and column of what is wrong), paths,
// route retry blocks, and the modes routes cannot be combined with.
func (c *Config) validateRoutes(add func(path, format string, a ...any)) {
	if _, err := route.Compile(c.routeSpec(nil)); err != nil {
		for _, e := range unjoin(err) {
			var re *route.Error
			if errors.As(e, &re) {
				msg := re.Msg
				if re.Line > 0 {
					msg = fmt.Sprintf("line %d, column %d: %s", re.Line, re.Column, re.Msg)
				}
				add(re.Key, "%s", msg)
				continue
			}
			add("routes", "%v", e)
		}
	}
	for i, r := range c.Routes {
		path := fmt.Sprintf("routes[%d]", i)
		if r.Path != "" && !strings.HasPrefix(r.Path, "/") {
			add(path+".path", "must start with /, got %q", r.Path)
		}
		if r.Retry == nil {
			continue
		}
		if r.Retry.Tiers != nil {
			validateTiers(path+".retry.tiers", r.Retry.Tiers, add)
		}
		if _, err := retry.ParseTable(r.Retry.Outcomes); err != nil {
			add(path+".retry.outcomes", "%v", err)
		}
		if r.Retry.OnExpired != "" && r.Retry.OnExpired != "dlq" && r.Retry.OnExpired != "drop" {
			add(path+".retry.onExpired", "must be dlq or drop, got %q", r.Retry.OnExpired)
		}
	}
	if c.Routed() && c.Consumer.Batch.On() {
		key := "routes"
		if len(c.Routes) == 0 {
			key = "filter"
		}
		add(key, "routes and filters cannot be combined with batch delivery (consumer.batch.maxMessages %d): a batch is one request to one path; turn batching off for this queue", c.Consumer.Batch.MaxMessages)
	}
}

// nameRoutes names each route the file left without one: after its path
// ("/orders/{routingKey}" is orders-routingKey), or its place without a
// path (route-3), with its place added when another route has the name
// already. Routes were not always named, and a config that was valid
// before stays valid.
func nameRoutes(routes []Route) {
	taken := map[string]bool{}
	for _, r := range routes {
		taken[strings.TrimSpace(r.Name)] = true
	}
	for i := range routes {
		if strings.TrimSpace(routes[i].Name) != "" {
			continue
		}
		name := nameFromPath(routes[i].Path)
		if name == "" {
			name = fmt.Sprintf("route-%d", i+1)
		}
		if taken[name] {
			name = fmt.Sprintf("%s-%d", name, i+1)
		}
		taken[name] = true
		routes[i].Name = name
	}
}

// nameFromPath is a path in the characters a route name may hold: each
// run of others becomes one '-'.
func nameFromPath(path string) string {
	var b strings.Builder
	dash := false
	for _, r := range path {
		if r < 0x80 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimRight(b.String(), "-")
}

// unjoin splits an errors.Join into its errors.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
