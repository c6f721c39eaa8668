package dlq

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// fakeQueue behaves like a classic queue owned by one tool: Next takes the
// head, Ack removes a message for good, and Close returns every unsettled
// message to its original place.
type fakeQueue struct {
	t  *testing.T
	mu sync.Mutex
	// ready is kept in seq order.
	ready []*fakeEntry
	seq   int
	taken map[int]*fakeEntry
	// nextErr, when set, is returned by Next after that many messages.
	failAfter int
	nextErr   error
	handed    int
	// onAck is called before an ack is applied (to check ordering).
	onAck func(*msg.Message)
}

type fakeEntry struct {
	seq int
	m   *msg.Message
}

type fakeDelivery struct {
	q       *fakeQueue
	e       *fakeEntry
	settled bool
}

func newFakeQueue(t *testing.T, ms ...*msg.Message) *fakeQueue {
	q := &fakeQueue{t: t, taken: map[int]*fakeEntry{}}
	for _, m := range ms {
		q.push(m)
	}
	return q
}

func (q *fakeQueue) push(m *msg.Message) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.seq++
	q.ready = append(q.ready, &fakeEntry{seq: q.seq, m: m})
}

func (q *fakeQueue) Next(ctx context.Context) (Delivery, bool, error) {
	q.mu.Lock()
	if q.nextErr != nil && q.handed >= q.failAfter {
		q.mu.Unlock()
		return nil, false, q.nextErr
	}
	if len(q.ready) == 0 {
		q.mu.Unlock()
		<-ctx.Done()
		return nil, false, nil
	}
	e := q.ready[0]
	q.ready = q.ready[1:]
	q.taken[e.seq] = e
	q.handed++
	q.mu.Unlock()
	return &fakeDelivery{q: q, e: e}, true, nil
}

func (d *fakeDelivery) Message() *msg.Message { return d.e.m }

func (d *fakeDelivery) Ack() error {
	if d.q.onAck != nil {
		d.q.onAck(d.e.m)
	}
	d.q.mu.Lock()
	defer d.q.mu.Unlock()
	if d.settled {
		d.q.t.Errorf("message %s settled twice", d.e.m.MessageID)
	}
	d.settled = true
	delete(d.q.taken, d.e.seq)
	return nil
}

func (d *fakeDelivery) Nack(requeue bool) error {
	d.q.mu.Lock()
	defer d.q.mu.Unlock()
	d.settled = true
	delete(d.q.taken, d.e.seq)
	if requeue {
		d.q.insert(d.e)
	}
	return nil
}

func (q *fakeQueue) insert(e *fakeEntry) {
	i, _ := slices.BinarySearchFunc(q.ready, e.seq, func(a *fakeEntry, s int) int { return a.seq - s })
	q.ready = slices.Insert(q.ready, i, e)
}

// Close returns every unsettled message to its place.
func (q *fakeQueue) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, e := range q.taken {
		q.insert(e)
	}
	clear(q.taken)
}

func (q *fakeQueue) ids() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []string
	for _, e := range q.ready {
		out = append(out, e.m.MessageID)
	}
	return out
}

// fakePub records confirmed copies per queue; fail decides failures.
type fakePub struct {
	mu        sync.Mutex
	confirmed map[string][]*msg.Message
	ids       map[string]bool
	fail      func(queue string, m *msg.Message) error
	delay     time.Duration
	// after is called after a confirm (e.g. to send the copy back).
	after func(queue string, m *msg.Message)
}

func newFakePub() *fakePub {
	return &fakePub{confirmed: map[string][]*msg.Message{}, ids: map[string]bool{}}
}

func (p *fakePub) PublishTo(ctx context.Context, exchange, key string, m *msg.Message) error {
	if exchange != "" {
		// Recorded under "exchange/key", where a redirect to an exchange
		// is looked for.
		key = exchange + "/" + key
	}
	if p.delay > 0 {
		time.Sleep(p.delay)
	}
	if p.fail != nil {
		if err := p.fail(key, m); err != nil {
			return err
		}
	}
	p.mu.Lock()
	p.confirmed[key] = append(p.confirmed[key], m)
	p.ids[m.MessageID] = true
	p.mu.Unlock()
	if p.after != nil {
		p.after(key, m)
	}
	return nil
}

// Send publishes at once; the wait only reports the outcome.
func (p *fakePub) Send(ctx context.Context, exchange, key string, m *msg.Message) func() error {
	err := p.PublishTo(ctx, exchange, key, m)
	return func() error { return err }
}

func (p *fakePub) confirmedID(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ids[id]
}

func (p *fakePub) idsIn(queue string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, m := range p.confirmed[queue] {
		out = append(out, m.MessageID)
	}
	return out
}

var errRefused = errors.New("refused")
