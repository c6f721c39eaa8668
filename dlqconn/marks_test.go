package dlqconn_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/topology"
)

func (e *env) classicDLQ() string {
	e.t.Helper()
	name := fmt.Sprintf("marks%d.dlq", seq.Add(1))
	plan := topology.Plan{Work: topology.Queue{Name: name, Role: topology.RoleWork, Args: map[string]any{"x-queue-type": "classic"}, Owned: true}, Declare: true}
	plan.DLQ = plan.Work
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := broker.Apply(ctx, e.opts, &plan, true); err != nil {
		e.t.Fatal(err)
	}
	return name
}

// depth is a queue's ready count, or the error of asking it.
func (e *env) depth(queue string) (int, error) {
	in, err := broker.OpenInspector(context.Background(), e.opts)
	if err != nil {
		e.t.Fatal(err)
	}
	defer in.Close()
	return in.Depth(queue)
}

// TestMarksBesideTheDLQ: reading marks that were never stored finds none
// and creates nothing; a change stores one set in a classic
// <dlq>.console-marks, whatever the DLQ's type, which a read hands back
// in place; the DLQ is not touched.
func TestMarksBesideTheDLQ(t *testing.T) {
	e := newEnv(t)
	for _, d := range []string{e.classicDLQ(), e.quorumDLQ(20)} {
		ids := e.fill(d, "m", 0, 5)
		o := e.opener()
		ctx := context.Background()
		m, err := o.Marks(ctx, d)
		if err != nil || m.Seq != 0 || len(m.Ignored) != 0 {
			t.Fatalf("%s: marks never stored: %+v %v", d, m, err)
		}
		if _, err := e.depth(dlq.MarksQueue(d)); err == nil {
			t.Fatalf("%s: a read created the marks queue", d)
		}
		stored, err := o.ChangeMarks(ctx, d, "oncall", func(m *dlq.Marks) { m.Ignored["g1"] = dlq.Mark{By: "oncall", Messages: 3} })
		if err != nil || stored.Seq != 1 {
			t.Fatalf("%s: change: %+v %v", d, stored, err)
		}
		if typ, err := broker.QueueTypeOf(ctx, e.opts, dlq.MarksQueue(d)); err != nil || typ != broker.Classic {
			t.Errorf("%s: marks queue type %q (%v), want classic", d, typ, err)
		}
		for range 3 {
			m, err = o.Marks(ctx, d)
			if err != nil || m.Seq != 1 || m.Ignored["g1"].Messages != 3 {
				t.Fatalf("%s: read back %+v %v", d, m, err)
			}
		}
		if n, err := e.depth(dlq.MarksQueue(d)); err != nil || n != 1 {
			t.Errorf("%s: marks queue holds %d (%v), want 1", d, n, err)
		}
		e.check(d, ids)
	}
}

// TestMarksChangedTogether: two consoles changing the marks of one DLQ at
// once lose none of each other's changes (each change is made under the
// marks queue's lock, from the latest set), and leave one set behind.
func TestMarksChangedTogether(t *testing.T) {
	e := newEnv(t)
	d := e.classicDLQ()
	const each = 6
	var wg sync.WaitGroup
	errs := make(chan error, 2*each)
	for c := range 2 {
		o := e.opener()
		wg.Go(func() {
			for i := range each {
				id := "c" + strconv.Itoa(c) + "-" + strconv.Itoa(i)
				if _, err := o.ChangeMarks(context.Background(), d, "console "+strconv.Itoa(c), func(m *dlq.Marks) { m.Ignored[id] = dlq.Mark{} }); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	m, err := e.opener().Marks(context.Background(), d)
	if err != nil || len(m.Ignored) != 2*each || m.Seq != 2*each {
		t.Fatalf("marks after two consoles' changes: %d marks, seq %d (%v), want %d", len(m.Ignored), m.Seq, err, 2*each)
	}
	if n, err := e.depth(dlq.MarksQueue(d)); err != nil || n != 1 {
		t.Errorf("marks queue holds %d (%v), want 1", n, err)
	}
}

// TestMarksOutdatedSetPassedOver: a set left beside a newer one (a change
// whose removal of the old set did not reach the broker) is passed over
// by reads and removed by the next change. A message that is not a set
// of marks stops both, and stays.
func TestMarksOutdatedSetPassedOver(t *testing.T) {
	e := newEnv(t)
	d := e.classicDLQ()
	o := e.opener()
	ctx := context.Background()
	if _, err := o.ChangeMarks(ctx, d, "a", func(m *dlq.Marks) { m.Ignored["new"] = dlq.Mark{} }); err != nil {
		t.Fatal(err)
	}
	old, err := dlq.EncodeMarks(dlq.Marks{DLQ: d, Seq: 0, Updated: time.Now().Add(time.Hour), Ignored: map[string]dlq.Mark{"old": {}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.pub.Publish(ctx, dlq.MarksQueue(d), old); err != nil {
		t.Fatal(err)
	}
	m, err := o.Marks(ctx, d)
	if err != nil || m.Seq != 1 || len(m.Ignored) != 1 || m.Ignored["new"] != (dlq.Mark{}) {
		t.Fatalf("read past an outdated set: %+v %v", m, err)
	}
	if _, ok := m.Ignored["new"]; !ok {
		t.Fatalf("read %+v, want the newer set", m)
	}
	if m, err = o.ChangeMarks(ctx, d, "a", func(m *dlq.Marks) { m.Ignored["more"] = dlq.Mark{} }); err != nil || m.Seq != 2 || len(m.Ignored) != 2 {
		t.Fatalf("change: %+v %v", m, err)
	}
	if n, err := e.depth(dlq.MarksQueue(d)); err != nil || n != 1 {
		t.Errorf("marks queue holds %d (%v) after a change, want 1", n, err)
	}

	stranger, _ := dlq.EncodeMarks(dlq.Marks{DLQ: "another.dlq", Seq: 5})
	if err := e.pub.Publish(ctx, dlq.MarksQueue(d), stranger); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Marks(ctx, d); !errors.Is(err, dlq.ErrNotMarks) {
		t.Errorf("read over a stranger's message: %v, want ErrNotMarks", err)
	}
	if _, err := o.ChangeMarks(ctx, d, "a", func(m *dlq.Marks) { clear(m.Ignored) }); !errors.Is(err, dlq.ErrNotMarks) {
		t.Errorf("change over a stranger's message: %v, want ErrNotMarks", err)
	}
	if n, err := e.depth(dlq.MarksQueue(d)); err != nil || n != 2 {
		t.Errorf("marks queue holds %d (%v), want the set and the stranger", n, err)
	}
}
