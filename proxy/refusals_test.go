package proxy

import (
	"context"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/topology"
)

// refusalLog records what the loop told its Refusals, in the journal the
// settles go to, so the order of the two shows.
type refusalLog struct{ j *journal }

func (r refusalLog) Judged(out retry.Outcome, pause bool) {
	if pause {
		r.j.add("judged pause")
		return
	}
	r.j.add("judged probe accepted")
}

// A 401 is the app refusing Hopper: the loop says so before it settles
// (so consuming pauses before the message goes back), and gives the
// message back as a refusal would, never to the DLQ, spending nothing. A
// config that makes 401 a message outcome dead-letters it and says
// nothing. A probe's decision is told either way.
func TestLoopTellsRefusals(t *testing.T) {
	unauthorized := retry.Outcome{Kind: retry.Response, Status: 401, Error: "HTTP 401: bad token"}
	cases := []struct {
		name     string
		quorum   bool
		outcomes map[string]string
		out      retry.Outcome
		want     []string
	}{
		{"401 classic", false, nil, unauthorized, []string{"judged pause", "nack-requeue"}},
		{"401 quorum republishes", true, nil, unauthorized, []string{"judged pause", "publish orders", "ack"}},
		{"401 made a message outcome", false, map[string]string{"401": "dlq"}, unauthorized, []string{"publish orders.dlq", "ack"}},
		{"403 stays a message outcome", false, nil, retry.Outcome{Kind: retry.Response, Status: 403}, []string{"publish orders.dlq", "ack"}},
		{"probe refused again", false, nil, with(unauthorized, true), []string{"judged pause", "nack-requeue"}},
		{"probe accepted", false, nil, with(retry.Outcome{Kind: retry.Response, Status: 200}, true), []string{"judged probe accepted", "ack"}},
		{"probe judged on its merits", false, nil, with(retry.Outcome{Kind: retry.Response, Status: 404}, true), []string{"judged probe accepted", "publish orders.dlq", "ack"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Queue.Name = "orders"
			// Hopper sends credentials (app.url's user info): only then is
			// a 401 about them.
			cfg.App.URL = "http://hopper:secret@127.0.0.1:8080/"
			cfg.Retry.Outcomes = tc.outcomes
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			plan := topology.FromConfig(&cfg)
			j := &journal{}
			pub := &fakePub{j: j}
			p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: fakeApp{out: tc.out}, Pub: pub, Quorum: tc.quorum,
				Workers: 1, UnavailableBackoff: time.Millisecond, Refusals: refusalLog{j}})
			run(p, &fakeDelivery{m: msgWith(map[string]any{msg.HeaderRetryCount: int64(9)}), j: j, alive: true})
			if got := j.all(); !equal(got, tc.want) {
				t.Fatalf("calls %v, want %v", got, tc.want)
			}
			if tc.quorum {
				if n := msg.Counter(pub.got[0].Headers[msg.HeaderRetryCount]); n != 9 {
					t.Fatalf("given back with x-retry-count %d, want 9: a refusal spends no attempt", n)
				}
			}
		})
	}
}

func with(o retry.Outcome, probe bool) retry.Outcome { o.Probe = probe; return o }

// A batch answered 401 as a whole: every entry goes back, none to the
// DLQ, and the loop says the app refused Hopper.
func TestBatchRefusedGoesBack(t *testing.T) {
	app := &batchApp{answer: func(ids []string) batch.Answer {
		return each(ids, retry.Outcome{Kind: retry.Response, Status: 401, Error: "HTTP 401"})
	}}
	cfg := config.Default()
	cfg.Queue.Name = "orders"
	cfg.App.URL = "http://hopper:secret@127.0.0.1:8080/" // credentials the 401 refuses
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := topology.FromConfig(&cfg)
	j := &journal{}
	pub := &fakePub{j: j}
	p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: app, Pub: pub, Workers: 1, Queue: 64,
		Batch: batch.Limits{MaxMessages: 4, MaxBytes: 1 << 20}, BatchWait: time.Hour, MoveHoldMax: time.Hour,
		UnavailableBackoff: time.Millisecond, Refusals: refusalLog{j}})
	p.Start(context.Background())
	for i := range 4 {
		p.Handle(&fakeDelivery{m: &msg.Message{MessageID: "m" + string(rune('0'+i)), Headers: map[string]any{}}, j: j, alive: true})
	}
	settledAll(t, j, 4)
	paused, back := 0, 0
	for _, e := range j.all() {
		switch e {
		case "judged pause":
			paused++
		case "nack-requeue":
			back++
		default:
			t.Fatalf("journal %v: want only refusals and give-backs", j.all())
		}
	}
	if paused != 4 || back != 4 {
		t.Fatalf("journal %v: want 4 pauses told and 4 give-backs", j.all())
	}
}
