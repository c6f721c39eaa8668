package dlq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// syncFile records what was written and what was synced.
type syncFile struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	synced  int // bytes durable
	syncs   int
	failAt  int // fail the write that would pass this many bytes (0: never)
	syncErr error
}

func (f *syncFile) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAt > 0 && f.buf.Len()+len(p) > f.failAt {
		return 0, errors.New("no space left on device")
	}
	return f.buf.Write(p)
}

func (f *syncFile) Sync() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.syncErr != nil {
		return f.syncErr
	}
	f.synced = f.buf.Len()
	f.syncs++
	return nil
}

// durableHas reports whether a line for id is in the synced part.
func (f *syncFile) durableHas(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, line := range bytes.Split(f.buf.Bytes()[:f.synced], []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		m, err := UnmarshalLine(line)
		if err == nil && m.MessageID == id {
			return true
		}
	}
	return false
}

func numbered(n int) []*msg.Message {
	var ms []*msg.Message
	for i := range n {
		ms = append(ms, dead(fmt.Sprint(i), "orders", "k", "max-attempts", 500, time.Duration(i)*time.Minute))
	}
	return ms
}

func exportOpts(bound int) ExportOptions {
	return ExportOptions{DLQ: "orders.dlq", Bound: bound, IdleTimeout: 50 * time.Millisecond, Now: func() time.Time { return t0 }}
}

func TestExportLeavesDLQAsItWas(t *testing.T) {
	q := newFakeQueue(t, numbered(5)...)
	q.onAck = func(m *msg.Message) { t.Errorf("export without --remove acked %s", m.MessageID) }
	var f syncFile
	res, err := Export(context.Background(), q, &f, exportOpts(5))
	q.Close()
	if err != nil || res.Exported != 5 || res.Removed != 0 {
		t.Fatalf("err=%v %+v", err, res)
	}
	if ids := q.ids(); !slices.Equal(ids, []string{"0", "1", "2", "3", "4"}) {
		t.Errorf("DLQ after = %v", ids)
	}
	lines := strings.Split(strings.TrimSuffix(f.buf.String(), "\n"), "\n")
	if len(lines) != 5 || f.synced != f.buf.Len() {
		t.Fatalf("%d lines, synced %d of %d bytes", len(lines), f.synced, f.buf.Len())
	}
	for i, line := range lines {
		m, err := UnmarshalLine([]byte(line))
		if err != nil || m.MessageID != fmt.Sprint(i) {
			t.Errorf("line %d: %v %v", i, m, err)
		}
	}
	if res.Bytes != int64(f.buf.Len()) {
		t.Errorf("bytes %d, file %d", res.Bytes, f.buf.Len())
	}
}

func TestExportRemoveAcksOnlyWhatIsOnDisk(t *testing.T) {
	q := newFakeQueue(t, numbered(7)...)
	var f syncFile
	q.onAck = func(m *msg.Message) {
		if !f.durableHas(m.MessageID) {
			t.Errorf("message %s acked before its line was synced", m.MessageID)
		}
	}
	o := exportOpts(7)
	o.Remove, o.SyncEvery = true, 3
	res, err := Export(context.Background(), q, &f, o)
	q.Close()
	if err != nil || res.Exported != 7 || res.Removed != 7 {
		t.Fatalf("err=%v %+v", err, res)
	}
	if f.syncs != 3 { // after 3, after 6, at the end
		t.Errorf("%d syncs, want 3", f.syncs)
	}
	if ids := q.ids(); len(ids) != 0 {
		t.Errorf("DLQ after = %v", ids)
	}
}

func TestExportWriteFailureRemovesNothingUnsynced(t *testing.T) {
	q := newFakeQueue(t, numbered(10)...)
	f := syncFile{failAt: 1} // the first flush fails
	o := exportOpts(10)
	o.Remove, o.SyncEvery = true, 4
	res, err := Export(context.Background(), q, &f, o)
	q.Close()
	if err == nil {
		t.Fatal("no error")
	}
	if res.Removed != 0 || len(q.ids()) != 10 {
		t.Fatalf("removed %d, DLQ %v", res.Removed, q.ids())
	}

	q = newFakeQueue(t, numbered(10)...)
	f = syncFile{syncErr: errors.New("fsync: input/output error")}
	_, err = Export(context.Background(), q, &f, o)
	q.Close()
	if err == nil || len(q.ids()) != 10 {
		t.Fatalf("sync failure: err=%v DLQ %v", err, q.ids())
	}
}

func TestExportFilterAndBound(t *testing.T) {
	q := newFakeQueue(t, numbered(6)...)
	q.push(dead("late", "orders", "k", "max-attempts", 500, 0)) // arrived after start
	var f syncFile
	o := exportOpts(6)
	o.Remove = true
	o.Filter = Filter{OlderThan: 150 * time.Second} // messages 3, 4, 5
	res, err := Export(context.Background(), q, &f, o)
	q.Close()
	if err != nil || res.Exported != 3 || res.Skipped != 3 || res.Taken != 6 {
		t.Fatalf("err=%v %+v", err, res)
	}
	if ids := q.ids(); !slices.Equal(ids, []string{"0", "1", "2", "late"}) {
		t.Errorf("DLQ after = %v", ids)
	}
}

func lines(ms ...*msg.Message) string {
	var b strings.Builder
	for _, m := range ms {
		l, err := MarshalLine(m, "orders.dlq")
		if err != nil {
			panic(err)
		}
		b.Write(l)
	}
	return b.String()
}

func TestImportPublishesEveryLine(t *testing.T) {
	ms := numbered(5)
	p := newFakePub()
	in := lines(ms[:2]...) + "\n" + lines(ms[2:]...) // a blank line is fine
	res, err := Import(context.Background(), strings.NewReader(in), p, ImportOptions{To: "orders.dlq", Parallel: 3})
	if err != nil || res.Published != 5 || res.Through != 6 || res.Lines != 6 {
		t.Fatalf("err=%v %+v", err, res)
	}
	got := p.idsIn("orders.dlq")
	slices.Sort(got)
	if !slices.Equal(got, []string{"0", "1", "2", "3", "4"}) {
		t.Errorf("published %v", got)
	}
}

func TestImportStopsAndResumes(t *testing.T) {
	ms := numbered(6)
	in := lines(ms[:3]...) + "{broken\n" + lines(ms[3:]...)
	p := newFakePub()
	res, err := Import(context.Background(), strings.NewReader(in), p, ImportOptions{To: "q", Parallel: 1})
	if err == nil || !strings.Contains(err.Error(), "line 4") || res.Through != 3 || res.Published != 3 {
		t.Fatalf("err=%v %+v", err, res)
	}
	// The operator fixes line 4 (here: drops it) and resumes.
	fixed := lines(ms[:3]...) + "\n" + lines(ms[3:]...)
	res, err = Import(context.Background(), strings.NewReader(fixed), p, ImportOptions{To: "q", Skip: res.Through})
	if err != nil || res.Published != 3 || res.Skipped != 3 {
		t.Fatalf("resume: err=%v %+v", err, res)
	}
	if got := p.idsIn("q"); !slices.Equal(got, []string{"0", "1", "2", "3", "4", "5"}) {
		t.Errorf("published %v: order or duplicates wrong", got)
	}
}

func TestImportPublishFailure(t *testing.T) {
	ms := numbered(8)
	p := newFakePub()
	p.fail = func(_ string, m *msg.Message) error {
		if m.MessageID == "5" {
			return errRefused
		}
		return nil
	}
	res, err := Import(context.Background(), strings.NewReader(lines(ms...)), p, ImportOptions{To: "q", Parallel: 1})
	if !errors.Is(err, errRefused) || res.Through != 5 || res.Published != 5 {
		t.Fatalf("err=%v %+v", err, res)
	}
}
