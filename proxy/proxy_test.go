package proxy

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
	"github.com/hopper-sidecar/hopper/topology"
)

// journal records the order of settle and publish calls across fakes.
type journal struct {
	mu  sync.Mutex
	log []string
}

func (j *journal) add(s string) { j.mu.Lock(); j.log = append(j.log, s); j.mu.Unlock() }
func (j *journal) all() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.log...)
}

type fakeDelivery struct {
	m     *msg.Message
	j     *journal
	alive bool
}

func (d *fakeDelivery) Message() *msg.Message { return d.m }
func (d *fakeDelivery) Ack() error            { d.j.add("ack"); return nil }
func (d *fakeDelivery) Nack(requeue bool) error {
	if requeue {
		d.j.add("nack-requeue")
	} else {
		d.j.add("nack-drop")
	}
	return nil
}
func (d *fakeDelivery) Alive() bool { return d.alive }

type fakePub struct {
	j   *journal
	err error
	got []*msg.Message
	to  []string
}

func (p *fakePub) Publish(_ context.Context, queue string, m *msg.Message) error {
	p.j.add("publish " + queue)
	p.got, p.to = append(p.got, m), append(p.to, queue)
	return p.err
}

type fakeApp struct{ out retry.Outcome }

func (a fakeApp) Deliver(context.Context, *msg.Message, RequestInfo) retry.Outcome { return a.out }

func newTestProxy(t *testing.T, out retry.Outcome, pubErr error) (*Proxy, *fakePub, *journal) {
	t.Helper()
	cfg := config.Default()
	cfg.Queue.Name = "orders"
	cfg.Requeue.MinHold = config.Duration(time.Millisecond)
	cfg.Requeue.MaxHold = config.Duration(2 * time.Millisecond)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	plan := topology.FromConfig(&cfg)
	j := &journal{}
	pub := &fakePub{j: j, err: pubErr}
	p := New(Options{Plan: &plan, Selector: cfg.Selector(), App: fakeApp{out}, Pub: pub,
		Workers: 1, MoveFailureBackoff: time.Millisecond, UnavailableBackoff: time.Millisecond})
	return p, pub, j
}

func run(p *Proxy, d Delivery) {
	p.handle(context.Background(), d)
}

func msgWith(h map[string]any) *msg.Message {
	if h == nil {
		h = map[string]any{}
	}
	return &msg.Message{MessageID: "m", Headers: h, RoutingKey: "orders", Body: []byte("b")}
}

// TestMoveAcksOnlyAfterConfirm: every move publishes first and acks after;
// a failed publish nacks with requeue and never acks.
func TestMoveAcksOnlyAfterConfirm(t *testing.T) {
	cases := []struct {
		name   string
		out    retry.Outcome
		pubErr error
		want   []string
	}{
		{"retry", retry.Outcome{Kind: retry.Response, Status: 503}, nil, []string{"publish orders.retry.1s", "ack"}},
		{"dlq", retry.Outcome{Kind: retry.Response, Status: 400}, nil, []string{"publish orders.dlq", "ack"}},
		{"requeue", retry.Outcome{Kind: retry.Response, Status: 425}, nil, []string{"publish orders", "ack"}},
		{"retry refused", retry.Outcome{Kind: retry.Response, Status: 503}, errors.New("nacked"), []string{"publish orders.retry.1s", "nack-requeue"}},
		{"dlq refused", retry.Outcome{Kind: retry.Response, Status: 400}, errors.New("returned"), []string{"publish orders.dlq", "nack-requeue"}},
		{"requeue refused", retry.Outcome{Kind: retry.Response, Status: 425}, errors.New("timeout"), []string{"publish orders", "nack-requeue"}},
		{"ack", retry.Outcome{Kind: retry.Response, Status: 200}, nil, []string{"ack"}},
		{"unavailable classic", retry.Outcome{Kind: retry.Unavailable}, nil, []string{"nack-requeue"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, _, j := newTestProxy(t, tc.out, tc.pubErr)
			run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
			got := j.all()
			if len(got) != len(tc.want) {
				t.Fatalf("calls %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("calls %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// TestQuorumReturnRepublishes: on a quorum queue a message the app could
// not take is republished (publish, then ack), never nacked.
func TestQuorumReturnRepublishes(t *testing.T) {
	p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Unavailable}, nil)
	p.o.Quorum = true
	m := msgWith(map[string]any{msg.HeaderRetryCount: int32(2)})
	run(p, &fakeDelivery{m: m, j: j, alive: true})
	if got := j.all(); len(got) != 2 || got[0] != "publish orders" || got[1] != "ack" {
		t.Fatalf("calls %v", got)
	}
	if n, _ := pub.got[0].Int(msg.HeaderRetryCount); n != 2 {
		t.Fatalf("a return spent an attempt: x-retry-count %d", n)
	}
}

// TestRetryCopyCarriesCounters: the moved copy has x-retry-count+1, the
// original routing key and the first failure time; the original message is
// not modified.
func TestRetryCopyCarriesCounters(t *testing.T) {
	p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 500}, nil)
	m := msgWith(map[string]any{msg.HeaderRetryCount: int32(1)})
	m.Exchange, m.RoutingKey = "shop", "order.created"
	run(p, &fakeDelivery{m: m, j: j, alive: true})
	cp := pub.got[0]
	if n, _ := cp.Int(msg.HeaderRetryCount); n != 2 {
		t.Errorf("x-retry-count %d, want 2", n)
	}
	if pub.to[0] != "orders.retry.5s" {
		t.Errorf("attempt 2 went to %s, want the 5s tier", pub.to[0])
	}
	if cp.String(msg.HeaderOriginalRoutingKey) != "order.created" || cp.String(msg.HeaderOriginalExchange) != "shop" {
		t.Errorf("original routing not pinned: %v", cp.Headers)
	}
	if cp.String(msg.HeaderFirstFailureTime) == "" {
		t.Error("no first failure time")
	}
	if n, _ := m.Int(msg.HeaderRetryCount); n != 1 {
		t.Error("the original's headers were modified")
	}
}

// TestDeadDeliveryNotDelivered: a delivery whose channel died while it
// waited is neither delivered nor settled (the broker requeued it).
func TestDeadDeliveryNotDelivered(t *testing.T) {
	p, pub, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 200}, nil)
	run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: false})
	if len(j.all()) != 0 || len(pub.got) != 0 {
		t.Fatalf("dead delivery handled: %v", j.all())
	}
}

// TestShutdownReturnsQueued: after Shutdown starts, queued deliveries are
// nacked back, not delivered.
func TestShutdownReturnsQueued(t *testing.T) {
	p, _, j := newTestProxy(t, retry.Outcome{Kind: retry.Response, Status: 200}, nil)
	close(p.stopping)
	run(p, &fakeDelivery{m: msgWith(nil), j: j, alive: true})
	if got := j.all(); len(got) != 1 || got[0] != "nack-requeue" {
		t.Fatalf("calls %v", got)
	}
}
