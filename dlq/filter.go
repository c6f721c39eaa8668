package dlq

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// Filter selects the DLQ messages a replay (or export) applies to. Empty
// fields match everything; every non-empty field must match. Within one
// field any listed value matches.
type Filter struct {
	// MessageIDs match the AMQP message id exactly.
	MessageIDs []string
	// Queues match x-original-queue exactly.
	Queues []string
	// Reasons match x-dead-letter-reason exactly.
	Reasons []string
	// Statuses match x-final-status-code: an exact code ("503") or a class
	// ("5xx"). A message without a status matches none.
	Statuses []string
	// RoutingKeys are AMQP topic patterns ("*" one word, "#" zero or more)
	// matched against the original routing key.
	RoutingKeys []string
	// Headers must all be present; a non-empty Value must equal the
	// header's string form.
	Headers []HeaderMatch
	// Groups match a message whose GroupOf is one of them, every field
	// exactly: the console's failure groups.
	Groups []GroupKey
	// OlderThan and NewerThan bound the time spent in the DLQ (from
	// x-dead-letter-time, else the AMQP timestamp). A message whose time is
	// unknown matches neither.
	OlderThan, NewerThan time.Duration
}

// HeaderMatch is one --header filter.
type HeaderMatch struct {
	Name, Value string
	// AnyValue is set for "--header name" (present with any value).
	AnyValue bool
}

// ParseHeaderMatch reads "name=value" or "name".
func ParseHeaderMatch(s string) (HeaderMatch, error) {
	name, value, hasValue := strings.Cut(s, "=")
	if name == "" {
		return HeaderMatch{}, fmt.Errorf("header filter %q: want name=value or name", s)
	}
	return HeaderMatch{Name: name, Value: value, AnyValue: !hasValue}, nil
}

// Validate reports malformed values at once, before anything is read.
func (f *Filter) Validate() error {
	var errs []error
	for _, id := range f.MessageIDs {
		if id == "" {
			// It would select the messages without an id, which no
			// one asks for by leaving a comma too many.
			errs = append(errs, fmt.Errorf("--message-id: empty id in %q", strings.Join(f.MessageIDs, ",")))
			break
		}
	}
	for _, s := range f.Statuses {
		if _, _, err := parseStatus(s); err != nil {
			errs = append(errs, fmt.Errorf("--status %q: %w", s, err))
		}
	}
	for _, r := range f.Reasons {
		if !knownReason(r) {
			// A typo would match nothing and look like an empty DLQ.
			errs = append(errs, fmt.Errorf("--reason %q: not a dead-letter reason (want one of %s)", r, strings.Join(Reasons(), ", ")))
		}
	}
	if f.OlderThan < 0 || f.NewerThan < 0 {
		errs = append(errs, fmt.Errorf("age filters must not be negative"))
	}
	if f.OlderThan > 0 && f.NewerThan > 0 && f.OlderThan >= f.NewerThan {
		errs = append(errs, fmt.Errorf("--older-than %s and --newer-than %s select nothing", f.OlderThan, f.NewerThan))
	}
	return errors.Join(errs...)
}

// errStatus says what a status filter accepts.
var errStatus = errors.New("not a final status: want a code (100-599), a class (1xx-5xx) or 0 for no response")

// parseStatus reads "503" (exact) or "5xx" (class): it returns the range
// [lo, hi].
func parseStatus(s string) (lo, hi int, err error) {
	s = strings.ToLower(strings.TrimSpace(s))
	bad := errStatus
	if len(s) == 3 && strings.HasSuffix(s, "xx") {
		if s[0] < '1' || s[0] > '5' {
			return 0, 0, bad
		}
		c := int(s[0]-'0') * 100
		return c, c + 99, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n != 0 && (n < 100 || n > 599) {
		return 0, 0, bad
	}
	return n, n, nil
}

// Match reports whether m is selected, and if not, why (for --dry-run and
// logs).
func (f *Filter) Match(m *msg.Message, now time.Time) (bool, string) {
	if len(f.MessageIDs) > 0 && !slices.Contains(f.MessageIDs, m.MessageID) {
		return false, "message-id"
	}
	if len(f.Queues) > 0 && !slices.Contains(f.Queues, msg.OriginalQueue(m)) {
		return false, "queue"
	}
	if len(f.Reasons) > 0 && !slices.Contains(f.Reasons, msg.DeadLetterReason(m)) {
		return false, "reason"
	}
	if len(f.Statuses) > 0 {
		code, ok := msg.FinalStatus(m)
		if !ok || !slices.ContainsFunc(f.Statuses, func(s string) bool {
			lo, hi, err := parseStatus(s)
			return err == nil && code >= lo && code <= hi
		}) {
			return false, "status"
		}
	}
	if len(f.RoutingKeys) > 0 {
		rk := msg.OriginalRoutingKey(m)
		if !slices.ContainsFunc(f.RoutingKeys, func(p string) bool { return retry.TopicMatch(p, rk) }) {
			return false, "routing-key"
		}
	}
	for _, h := range f.Headers {
		v, ok := m.Headers[h.Name]
		if !ok {
			return false, "header " + h.Name
		}
		if !h.AnyValue {
			s, scalar := headerString(v)
			if !scalar || s != h.Value {
				return false, "header " + h.Name
			}
		}
	}
	if len(f.Groups) > 0 && !slices.Contains(f.Groups, GroupOf(m)) {
		return false, "group"
	}
	if f.OlderThan > 0 || f.NewerThan > 0 {
		t, ok := msg.DeadLetterTime(m)
		if !ok {
			return false, "age unknown"
		}
		age := now.Sub(t)
		if f.OlderThan > 0 && age < f.OlderThan {
			return false, "older-than"
		}
		if f.NewerThan > 0 && age > f.NewerThan {
			return false, "newer-than"
		}
	}
	return true, ""
}
