package retry

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Table maps outcome keys to actions. Keys are an exact status ("425"), a
// status class ("4xx"), "timeout" or "unavailable". An exact status wins over
// its class. The table is data so that a team whose apps expect every 4xx
// to be retried says so in one line of config, and one whose app answers
// 401 about a message (not about the caller) makes it a message outcome.
type Table map[string]Action

// Outcome keys that are not status codes.
const (
	KeyTimeout     = "timeout"
	KeyUnavailable = "unavailable"
	KeyCut         = "cut"
)

// DefaultTable is the outcome table the README documents.
func DefaultTable() Table {
	return Table{
		"1xx":          Retry,
		"2xx":          Ack,
		"3xx":          Retry,
		"4xx":          DLQ,
		"401":          Pause,
		"408":          Retry,
		"409":          Retry,
		"425":          Requeue,
		"429":          Retry,
		"5xx":          Retry,
		KeyTimeout:     Retry,
		KeyUnavailable: Return,
		KeyCut:         Retry,
	}
}

// Merge returns the default table with overrides applied on top.
func Merge(base, overrides Table) Table {
	t := maps.Clone(base)
	maps.Copy(t, overrides)
	return t
}

var keyPattern = regexp.MustCompile(`^([1-5][0-9][0-9]|[1-5]xx|timeout|unavailable|cut)$`)

// ParseTable reads a table from config strings and reports every bad entry.
func ParseTable(raw map[string]string) (Table, error) {
	t := Table{}
	var errs []error
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		key := strings.ToLower(strings.TrimSpace(k))
		if !keyPattern.MatchString(key) {
			errs = append(errs, fmt.Errorf("%q: not an outcome (want a status like 425, a class like 4xx, timeout, unavailable or cut)", k))
			continue
		}
		a, err := ParseAction(raw[k])
		if err != nil {
			errs = append(errs, fmt.Errorf("%q: %w", k, err))
			continue
		}
		if key == KeyUnavailable && a != Return {
			// An app that is down did not fail the message: retrying would spend
			// its attempts and dead-lettering would empty the queue into the DLQ
			// during an outage or a restart.
			errs = append(errs, fmt.Errorf("%q: must be return, never %s (an app that cannot be reached did not fail the message)", k, a))
			continue
		}
		if a == Pause && !pausable(key) {
			// Pausing stops every message for what one answer said: only a
			// status that speaks of the caller, never of a message, may do
			// it. A class would stall the queue on one message's 404, and a
			// 5xx or a timeout is a message outcome or the breaker's to judge.
			errs = append(errs, fmt.Errorf("%q: pause must name one 4xx status, such as 401 (the app refusing Hopper itself, the same for every message)", k))
			continue
		}
		if key == KeyCut && a != Retry && a != DLQ {
			// The app took the message and broke the connection while
			// healthy: returning it would send it again without limit.
			errs = append(errs, fmt.Errorf("%q: must be retry or dlq, never %s (a message that breaks its connection must spend attempts)", k, a))
			continue
		}
		t[key] = a
	}
	return t, errors.Join(errs...)
}

// pausable says whether a table key may pause consuming: an exact 4xx
// status.
func pausable(key string) bool {
	return len(key) == 3 && key[0] == '4' && key[1] >= '0' && key[1] <= '9' && key[2] >= '0' && key[2] <= '9'
}

// Lookup returns the action for an outcome.
func (t Table) Lookup(o Outcome) Action {
	switch o.Kind {
	case Timeout:
		return t[KeyTimeout]
	case Unavailable:
		if a, ok := t[KeyUnavailable]; ok {
			return a
		}
		return Return
	case Cut:
		if a, ok := t[KeyCut]; ok {
			return a
		}
		return Retry
	}
	if o.Status >= 100 && o.Status < 600 {
		if a, ok := t[statusKeys[o.Status]]; ok {
			return a
		}
		if a, ok := t[classKeys[o.Status/100]]; ok {
			return a
		}
	}
	// A status outside the table (for example 600+) is garbage from the app:
	// treat it as a failed attempt rather than guess that it succeeded.
	return Retry
}

// lookupClass is the action of a status's class, for a status whose own
// entry cannot apply (a pause for a message's answer); a class missing
// from the table dead-letters, as a 4xx does by default.
func (t Table) lookupClass(status int) Action {
	if status >= 100 && status < 600 {
		if a, ok := t[classKeys[status/100]]; ok && a != Pause {
			return a
		}
	}
	return DLQ
}

// statusKeys and classKeys are the table keys of every status, made once so
// a lookup on the delivery path allocates nothing.
var (
	statusKeys [600]string
	classKeys  = [6]string{"", "1xx", "2xx", "3xx", "4xx", "5xx"}
)

func init() {
	for i := 100; i < 600; i++ {
		statusKeys[i] = strconv.Itoa(i)
	}
}

// Match selects the messages a policy applies to. Empty fields match
// anything; every non-empty field must match.
type Match struct {
	// RoutingKey is an AMQP topic pattern ("*" one word, "#" zero or more).
	RoutingKey string
	// Type is a glob on the AMQP type property.
	Type string
	// Header and HeaderValue match an application header's string form.
	Header      string
	HeaderValue string
}

// Subject is what a Match is tested against.
type Subject struct {
	RoutingKey string
	Type       string
	Header     func(name string) (string, bool)
}

// Matches reports whether s is selected.
func (m Match) Matches(s Subject) bool {
	if m.RoutingKey != "" && !TopicMatch(m.RoutingKey, s.RoutingKey) {
		return false
	}
	if m.Type != "" {
		if ok, _ := path.Match(m.Type, s.Type); !ok {
			return false
		}
	}
	if m.Header != "" {
		v, ok := s.Header(m.Header)
		if !ok || (m.HeaderValue != "" && v != m.HeaderValue) {
			return false
		}
	}
	return true
}

// TopicMatch matches a routing key against an AMQP topic pattern.
func TopicMatch(pattern, key string) bool {
	return topicWords(strings.Split(pattern, "."), strings.Split(key, "."))
}

func topicWords(p, k []string) bool {
	for len(p) > 0 {
		switch p[0] {
		case "#":
			if len(p) == 1 {
				return true
			}
			for i := 0; i <= len(k); i++ {
				if topicWords(p[1:], k[i:]) {
					return true
				}
			}
			return false
		case "*":
			if len(k) == 0 {
				return false
			}
		default:
			if len(k) == 0 || k[0] != p[0] {
				return false
			}
		}
		p, k = p[1:], k[1:]
	}
	return len(k) == 0
}

// Selector picks the first policy whose Match selects a message, or the
// default policy.
type Selector struct {
	Rules   []Rule
	Default *Policy
}

// Rule pairs a Match with its Policy.
type Rule struct {
	Match  Match
	Policy *Policy
}

// Select returns the policy for a message.
func (s *Selector) Select(sub Subject) *Policy {
	for i := range s.Rules {
		if s.Rules[i].Match.Matches(sub) {
			return s.Rules[i].Policy
		}
	}
	return s.Default
}
