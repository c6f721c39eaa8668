package retry

import (
	"strings"
	"testing"
	"time"
)

var tiers = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute, 30 * time.Minute}

func defaultPolicy() *Policy {
	return &Policy{
		Name:          "default",
		MaxAttempts:   10,
		Tiers:         tiers,
		Table:         DefaultTable(),
		ExpiredAction: DLQ,
		MaxRequeues:   100,
		MaxHold:       5 * time.Second,
		MinHold:       time.Second,
	}
}

func half() float64 { return 0.5 }

func TestDecideOutcomeTable(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	resp := func(code int) Outcome { return Outcome{Kind: Response, Status: code} }
	cases := []struct {
		name string
		st   State
		o    Outcome
		want Decision
	}{
		{"200 acks", State{}, resp(200), Decision{Action: Ack}},
		{"204 acks and keeps counters", State{Retries: 3, Requeues: 2}, resp(204), Decision{Action: Ack, Retries: 3, Requeues: 2}},
		{"425 requeues with jittered hold", State{}, resp(425), Decision{Action: Requeue, Hold: 3 * time.Second, Requeues: 1}},
		{"425 with short Retry-After holds that long", State{Retries: 2}, Outcome{Kind: Response, Status: 425, RetryAfter: 2 * time.Second, HasRetryAfter: true}, Decision{Action: Requeue, Hold: 2 * time.Second, Retries: 2, Requeues: 1}},
		{"425 with long Retry-After goes through the smallest tier >= it", State{}, Outcome{Kind: Response, Status: 425, RetryAfter: 20 * time.Second, HasRetryAfter: true}, Decision{Action: Requeue, Tier: 30 * time.Second, Requeues: 1}},
		{"425 past the requeue cap dead-letters", State{Requeues: 100}, resp(425), Decision{Action: DLQ, Reason: ReasonTooEarly, Requeues: 100}},
		{"429 retries on tier 1", State{}, resp(429), Decision{Action: Retry, Tier: time.Second, Retries: 1}},
		{"409 retries", State{Retries: 1}, resp(409), Decision{Action: Retry, Tier: 5 * time.Second, Retries: 2}},
		{"408 retries", State{}, resp(408), Decision{Action: Retry, Tier: time.Second, Retries: 1}},
		{"500 retries", State{Retries: 2}, resp(500), Decision{Action: Retry, Tier: 30 * time.Second, Retries: 3}},
		{"503 on attempt 9 uses the last tier", State{Retries: 8}, resp(503), Decision{Action: Retry, Tier: 30 * time.Minute, Retries: 9}},
		{"503 on attempt 10 dead-letters", State{Retries: 9}, resp(503), Decision{Action: DLQ, Reason: ReasonMaxAttempts, Retries: 10}},
		{"503 with Retry-After picks its tier", State{}, Outcome{Kind: Response, Status: 503, RetryAfter: 90 * time.Second, HasRetryAfter: true}, Decision{Action: Retry, Tier: 2 * time.Minute, Retries: 1}},
		{"Retry-After beyond the last tier uses the last", State{}, Outcome{Kind: Response, Status: 429, RetryAfter: 5 * time.Hour, HasRetryAfter: true}, Decision{Action: Retry, Tier: 30 * time.Minute, Retries: 1}},
		{"timeout counts as an attempt", State{}, Outcome{Kind: Timeout}, Decision{Action: Retry, Tier: time.Second, Retries: 1}},
		{"unavailable returns without an attempt", State{Retries: 4}, Outcome{Kind: Unavailable}, Decision{Action: Return, Retries: 4}},
		{"breaker refusal returns without an attempt", State{Retries: 9}, Outcome{Kind: Unavailable, Refused: true}, Decision{Action: Return, Retries: 9}},
		{"shutdown cut-off returns without an attempt", State{Retries: 9, Requeues: 3}, Outcome{Kind: Unavailable, CutOff: true}, Decision{Action: Return, Retries: 9, Requeues: 3}},
		{"425 at the requeue cap still requeues", State{Requeues: 99}, resp(425), Decision{Action: Requeue, Hold: 3 * time.Second, Requeues: 100}},
		{"400 dead-letters at once, counting the failed attempt", State{}, resp(400), Decision{Action: DLQ, Reason: ReasonNonRetriable, Retries: 1}},
		{"404 dead-letters", State{}, resp(404), Decision{Action: DLQ, Reason: ReasonNonRetriable, Retries: 1}},
		{"410 dead-letters", State{}, resp(410), Decision{Action: DLQ, Reason: ReasonNonRetriable, Retries: 1}},
		{"422 dead-letters", State{Retries: 1}, resp(422), Decision{Action: DLQ, Reason: ReasonNonRetriable, Retries: 2}},
		{"garbage status retries", State{}, resp(799), Decision{Action: Retry, Tier: time.Second, Retries: 1}},
		{"override dlq", State{}, Outcome{Kind: Response, Status: 200, Override: "dlq"}, Decision{Action: DLQ, Reason: ReasonAppAction, Retries: 1}},
		{"override drop", State{}, Outcome{Kind: Response, Status: 500, Override: "DROP"}, Decision{Action: Drop, Reason: ReasonAppAction}},
		{"override retry still counts", State{Retries: 9}, Outcome{Kind: Response, Status: 200, Override: "retry"}, Decision{Action: DLQ, Reason: ReasonMaxAttempts, Retries: 10}},
		{"override ack", State{}, Outcome{Kind: Response, Status: 500, Override: "ack"}, Decision{Action: Ack}},
		{"override requeue", State{}, Outcome{Kind: Response, Status: 200, Override: "requeue", RetryAfter: time.Second, HasRetryAfter: true}, Decision{Action: Requeue, Hold: time.Second, Requeues: 1}},
		{"unknown override is ignored", State{}, Outcome{Kind: Response, Status: 200, Override: "explode"}, Decision{Action: Ack}},
		{"retry that would outlive the deadline expires now", State{Retries: 2, Deadline: now.Add(10 * time.Second)}, resp(503), Decision{Action: DLQ, Reason: ReasonExpired, Retries: 3}},
		{"retry within the deadline", State{Deadline: now.Add(10 * time.Second)}, resp(503), Decision{Action: Retry, Tier: time.Second, Retries: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(defaultPolicy(), tc.st, tc.o, now, half)
			if got != tc.want {
				t.Fatalf("Decide = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDecideUnlimitedNeverDeadLetters(t *testing.T) {
	p := defaultPolicy()
	p.MaxAttempts = Unlimited
	d := Decide(p, State{Retries: 100000}, Outcome{Kind: Response, Status: 500}, time.Now(), half)
	if d.Action != Retry || d.Tier != 30*time.Minute || d.Retries != 100001 {
		t.Fatalf("got %+v", d)
	}
}

func TestDecideEvery4xxRetried(t *testing.T) {
	p := defaultPolicy()
	p.Table = Merge(DefaultTable(), Table{"4xx": Retry})
	d := Decide(p, State{}, Outcome{Kind: Response, Status: 404}, time.Now(), half)
	if d.Action != Retry {
		t.Fatalf("404 with 4xx=retry: got %v", d.Action)
	}
	d = Decide(p, State{}, Outcome{Kind: Response, Status: 425}, time.Now(), half)
	if d.Action != Requeue {
		t.Fatalf("exact 425 must win over 4xx: got %v", d.Action)
	}
}

func TestExpiredDropPolicy(t *testing.T) {
	p := defaultPolicy()
	p.ExpiredAction = Drop
	if d := Expired(p, State{Retries: 1}); d.Action != Drop || d.Reason != ReasonExpired || d.Retries != 1 {
		t.Fatalf("got %+v", d)
	}
	p.ExpiredAction = Ack // not allowed: falls back to DLQ
	if d := Expired(p, State{}); d.Action != DLQ {
		t.Fatalf("got %+v", d)
	}
}

func TestJitterStaysInRange(t *testing.T) {
	p := defaultPolicy()
	for _, r := range []float64{0, 0.25, 0.999999} {
		d := Decide(p, State{}, Outcome{Kind: Response, Status: 425}, time.Now(), func() float64 { return r })
		if d.Hold < time.Second || d.Hold > 5*time.Second {
			t.Fatalf("hold %v out of 1s..5s", d.Hold)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"3", 3 * time.Second, true},
		{" 1.5 ", 1500 * time.Millisecond, true},
		{"-1", 0, false},
		{"abc", 0, false},
		{"99999999999", 0, false},
		// The three date formats HTTP allows, all in GMT.
		{now.Add(42 * time.Second).Format("Mon, 02 Jan 2006 15:04:05 GMT"), 42 * time.Second, true},
		{now.Add(42 * time.Second).Format("Monday, 02-Jan-06 15:04:05 GMT"), 42 * time.Second, true},
		{now.Add(42 * time.Second).Format(time.ANSIC), 42 * time.Second, true},
		{now.Add(-time.Hour).Format("Mon, 02 Jan 2006 15:04:05 GMT"), 0, true},
		{now.Add(42 * time.Second).Format(time.RFC1123), 42 * time.Second, true}, // "UTC", not "GMT"
		{"Fri, 32 Jan 2026 00:00:00 GMT", 0, false},
	}
	for _, tc := range cases {
		got, ok := ParseRetryAfter(tc.in, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseRetryAfter(%q) = %v,%v want %v,%v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseTable(t *testing.T) {
	tbl, err := ParseTable(map[string]string{"4XX": "retry", "418": "ack", "timeout": "dlq"})
	if err != nil {
		t.Fatal(err)
	}
	if tbl["4xx"] != Retry || tbl["418"] != Ack || tbl["timeout"] != DLQ {
		t.Fatalf("got %v", tbl)
	}
	_, err = ParseTable(map[string]string{"600": "ack", "2xx": "maybe", "unavailable": "dlq", "abc": "ack"})
	if err == nil {
		t.Fatal("want errors")
	}
	for _, want := range []string{`"600"`, `"2xx"`, `"unavailable"`, `"abc"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestTopicMatch(t *testing.T) {
	cases := []struct {
		p, k string
		want bool
	}{
		{"a.b", "a.b", true},
		{"a.*", "a.b", true},
		{"a.*", "a.b.c", false},
		{"a.#", "a", true},
		{"a.#", "a.b.c", true},
		{"#", "", true},
		{"#.c", "a.b.c", true},
		{"*.b.#", "x.b", true},
		{"*.b.#", "x.c", false},
		{"reminder.*", "status.changed", false},
	}
	for _, tc := range cases {
		if got := TopicMatch(tc.p, tc.k); got != tc.want {
			t.Errorf("TopicMatch(%q,%q)=%v", tc.p, tc.k, got)
		}
	}
}

func TestSelector(t *testing.T) {
	reminders := &Policy{Name: "reminders"}
	status := &Policy{Name: "status"}
	byHeader := &Policy{Name: "tenant"}
	def := &Policy{Name: "default"}
	s := &Selector{Default: def, Rules: []Rule{
		{Match{RoutingKey: "game.reminder.#"}, reminders},
		{Match{Type: "STATUS_*"}, status},
		{Match{Header: "tenant", HeaderValue: "gold"}, byHeader},
	}}
	hdr := func(v string) func(string) (string, bool) {
		return func(n string) (string, bool) { return v, v != "" && n == "tenant" }
	}
	cases := []struct {
		sub  Subject
		want string
	}{
		{Subject{RoutingKey: "game.reminder.due", Header: hdr("")}, "reminders"},
		{Subject{RoutingKey: "game.status", Type: "STATUS_TRANSITION_DUE", Header: hdr("")}, "status"},
		{Subject{RoutingKey: "x", Header: hdr("gold")}, "tenant"},
		{Subject{RoutingKey: "x", Header: hdr("silver")}, "default"},
	}
	for _, tc := range cases {
		if got := s.Select(tc.sub).Name; got != tc.want {
			t.Errorf("Select(%+v) = %s want %s", tc.sub, got, tc.want)
		}
	}
}

// A refusal or a shutdown cut-off never spends an attempt, even with a table
// that would retry an unreachable app (one built in code, since config
// rejects it).
func TestGivenBackIgnoresTheTable(t *testing.T) {
	p := defaultPolicy()
	p.Table = Merge(DefaultTable(), Table{KeyUnavailable: Retry})
	for _, o := range []Outcome{{Kind: Unavailable, Refused: true}, {Kind: Unavailable, CutOff: true}} {
		d := Decide(p, State{Retries: 9}, o, time.Now(), half)
		if d.Action != Return || d.Retries != 9 {
			t.Fatalf("Decide(%+v) = %+v, want return with 9 retries", o, d)
		}
	}
	if d := Decide(p, State{Retries: 9}, Outcome{Kind: Unavailable}, time.Now(), half); d.Action != DLQ {
		t.Fatalf("the table itself is still honoured for a plain unavailable outcome: %+v", d)
	}
}

func TestParseTableRejectsRetryingAnUnreachableApp(t *testing.T) {
	for _, a := range []string{"retry", "dlq", "ack", "requeue", "drop"} {
		if _, err := ParseTable(map[string]string{"unavailable": a}); err == nil || !strings.Contains(err.Error(), "must be return") {
			t.Fatalf("unavailable: %s accepted (err %v)", a, err)
		}
	}
	if _, err := ParseTable(map[string]string{"unavailable": "return"}); err != nil {
		t.Fatal(err)
	}
}

func TestEventNames(t *testing.T) {
	if Event(ReasonMaxAttempts) != "RABBITMQ_MESSAGE_MAX_RETRIES_EXCEEDED" {
		t.Fatal("max-attempts must log RABBITMQ_MESSAGE_MAX_RETRIES_EXCEEDED, the name existing dashboards search for")
	}
	seen := map[string]bool{}
	for _, r := range []string{ReasonMaxAttempts, ReasonNonRetriable, ReasonExpired, ReasonTooEarly, ReasonAppAction} {
		if seen[Event(r)] {
			t.Fatalf("event for %s not distinct", r)
		}
		seen[Event(r)] = true
	}
}

// A request cut by the app dying counts a crash, not an attempt; the crash
// that reaches MaxCrashes dead-letters as app-crash. A plain refusal (the
// app already down) counts nothing.
func TestDecideCrashes(t *testing.T) {
	p := defaultPolicy()
	p.MaxCrashes = 3
	crash := Outcome{Kind: Unavailable, Cut: true, Crashed: true}
	cases := []struct {
		name string
		st   State
		o    Outcome
		want Decision
	}{
		{"first crash returns", State{Retries: 2}, crash, Decision{Action: Return, Retries: 2, Crashes: 1, Suspect: true}},
		{"second crash returns", State{Crashes: 1}, crash, Decision{Action: Return, Crashes: 2, Suspect: true}},
		{"third crash dead-letters", State{Retries: 4, Crashes: 2}, crash, Decision{Action: DLQ, Reason: ReasonAppCrash, Retries: 4, Crashes: 3, Suspect: true}},
		{"a crash shared with others charges nothing", State{Crashes: 2}, Outcome{Kind: Unavailable, Cut: true, CrashSuspect: true}, Decision{Action: Return, Crashes: 2, Suspect: true}},
		{"a suspect the app answers is cleared", State{Crashes: 1, Suspect: true}, Outcome{Kind: Response, Status: 200}, Decision{Action: Ack, Crashes: 1}},
		{"a suspect refused stays a suspect", State{Suspect: true}, Outcome{Kind: Unavailable, Refused: true}, Decision{Action: Return, Suspect: true}},
		{"refused while down counts nothing", State{Crashes: 2}, Outcome{Kind: Unavailable}, Decision{Action: Return, Crashes: 2}},
		{"cut with the app still healthy counts nothing", State{Crashes: 2}, Outcome{Kind: Unavailable, Cut: true}, Decision{Action: Return, Crashes: 2}},
		{"a success keeps the count", State{Crashes: 2}, Outcome{Kind: Response, Status: 200}, Decision{Action: Ack, Crashes: 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Decide(p, tc.st, tc.o, time.Now(), half); got != tc.want {
				t.Fatalf("Decide = %+v, want %+v", got, tc.want)
			}
		})
	}
	p.MaxCrashes = 0
	if got := Decide(p, State{Crashes: 100}, crash, time.Now(), half); got.Action != Return {
		t.Fatalf("MaxCrashes 0 must never dead-letter for crashes: %+v", got)
	}
}
