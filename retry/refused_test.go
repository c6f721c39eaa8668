package retry

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// 401 says Hopper's credentials are refused, the same for every message:
// the message goes back untouched (no attempt, whatever its count) and the
// decision says to pause consuming. 403 stays the message's own answer.
// The table is data: a config that makes 401 a message outcome again, or
// makes another 4xx status pause, is honoured.
func TestDecideAppRefusesHopper(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	resp := func(code int) Outcome {
		return Outcome{Kind: Response, Status: code, Error: "HTTP " + strconv.Itoa(code)}
	}
	with := func(over Table) Table { return Merge(DefaultTable(), over) }
	cases := []struct {
		name  string
		table Table
		st    State
		o     Outcome
		want  Decision
	}{
		{"401 gives back and pauses", DefaultTable(), State{}, resp(401),
			Decision{Action: Return, Pause: true}},
		{"401 spends no attempt, counters kept", DefaultTable(), State{Retries: 4, Requeues: 2, Crashes: 1}, resp(401),
			Decision{Action: Return, Pause: true, Retries: 4, Requeues: 2, Crashes: 1}},
		{"401 on the last attempt is still no attempt", DefaultTable(), State{Retries: 9}, resp(401),
			Decision{Action: Return, Pause: true, Retries: 9}},
		{"401 keeps a crash suspect's mark: the app never ran it", DefaultTable(), State{Suspect: true}, resp(401),
			Decision{Action: Return, Pause: true, Suspect: true}},
		{"401 past a deadline still only pauses (expiry is decided before delivery)", DefaultTable(), State{Deadline: now.Add(time.Millisecond)}, resp(401),
			Decision{Action: Return, Pause: true}},
		{"401 keeps its own row when every 4xx is retried", with(Table{"4xx": Retry}), State{}, resp(401),
			Decision{Action: Return, Pause: true}},
		{"401 made a message outcome: dlq", with(Table{"401": DLQ}), State{}, resp(401),
			Decision{Action: DLQ, Reason: ReasonNonRetriable, Retries: 1}},
		{"401 made a message outcome: retry", with(Table{"401": Retry}), State{Retries: 1}, resp(401),
			Decision{Action: Retry, Tier: 5 * time.Second, Retries: 2}},
		{"403 stays a message outcome", DefaultTable(), State{}, resp(403),
			Decision{Action: DLQ, Reason: ReasonNonRetriable, Retries: 1}},
		{"403 made to pause", with(Table{"403": Pause}), State{Retries: 3}, resp(403),
			Decision{Action: Return, Pause: true, Retries: 3}},
		{"the app's own Hopper-Action wins over the row", DefaultTable(), State{}, Outcome{Kind: Response, Status: 401, Override: "dlq"},
			Decision{Action: DLQ, Reason: ReasonAppAction, Retries: 1}},
		{"Hopper-Action: pause is not an action the app can ask for", DefaultTable(), State{}, Outcome{Kind: Response, Status: 200, Override: "pause"},
			Decision{Action: Ack}},
		{"a breaker refusal of a 401-paused app returns without pausing again", DefaultTable(), State{Retries: 2}, Outcome{Kind: Unavailable, Refused: true},
			Decision{Action: Return, Retries: 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := defaultPolicy()
			p.Table = tc.table
			if got := Decide(p, tc.st, tc.o, now, half); got != tc.want {
				t.Fatalf("Decide = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDefaultTablePausesOn401(t *testing.T) {
	if a := DefaultTable()["401"]; a != Pause {
		t.Fatalf(`DefaultTable()["401"] = %v, want pause`, a)
	}
	if a := DefaultTable().Lookup(Outcome{Kind: Response, Status: 403}); a != DLQ {
		t.Fatalf("403 looks up %v, want dlq", a)
	}
}

// pause names one 4xx status: a class or another outcome would stall the
// whole queue on what one message's answer says.
func TestParseTablePause(t *testing.T) {
	tbl, err := ParseTable(map[string]string{"403": "PAUSE", "401": "dlq"})
	if err != nil {
		t.Fatal(err)
	}
	if tbl["403"] != Pause || tbl["401"] != DLQ {
		t.Fatalf("got %v", tbl)
	}
	for _, k := range []string{"4xx", "5xx", "503", "200", "timeout", "cut", "unavailable"} {
		_, err := ParseTable(map[string]string{k: "pause"})
		if err == nil {
			t.Errorf("%s: pause accepted", k)
			continue
		}
		if !strings.Contains(err.Error(), `"`+k+`"`) {
			t.Errorf("%s: error %q does not name the key", k, err)
		}
	}
	if a, err := ParseAction("pause"); err != nil || a != Pause || a.String() != "pause" {
		t.Fatalf("ParseAction(pause) = %v, %v", a, err)
	}
}
