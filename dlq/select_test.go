package dlq

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/msg"
)

// --limit stops a classic-queue export once enough are written: the rest
// are never taken, and with Remove only what was written is acked.
func TestExportLimit(t *testing.T) {
	q := newFakeQueue(t, numbered(6)...)
	var f syncFile
	o := exportOpts(6)
	o.Remove, o.Limit = true, 2
	o.Filter = Filter{MessageIDs: []string{"1", "3", "4", "5"}}
	res, err := Export(context.Background(), q, &f, o)
	q.Close()
	if err != nil || res.Exported != 2 || res.Removed != 2 || res.Skipped != 2 || res.Taken != 4 {
		t.Fatalf("err=%v %+v", err, res)
	}
	if ids := q.ids(); !slices.Equal(ids, []string{"0", "2", "4", "5"}) {
		t.Errorf("DLQ after = %v", ids)
	}
	if strings.Count(f.buf.String(), "\n") != 2 {
		t.Errorf("file:\n%s", f.buf.String())
	}
}

// A dry run writes nothing, acks nothing, and counts what the run would.
func TestExportDryRun(t *testing.T) {
	q := newFakeQueue(t, numbered(5)...)
	q.onAck = func(m *msg.Message) { t.Errorf("dry run acked %s", m.MessageID) }
	o := exportOpts(5)
	o.Remove, o.DryRun = true, true
	o.Filter = Filter{MessageIDs: []string{"0", "2", "4"}}
	res, err := Export(context.Background(), q, nil, o)
	q.Close()
	if err != nil || !res.DryRun || res.WouldExport != 3 || res.WouldRemove != 3 || res.Exported != 0 || res.Removed != 0 || res.Bytes != 0 || res.Skipped != 2 {
		t.Fatalf("err=%v %+v", err, res)
	}
	if ids := q.ids(); !slices.Equal(ids, []string{"0", "1", "2", "3", "4"}) {
		t.Errorf("DLQ after = %v", ids)
	}
}

// An import dry run decodes every line and publishes nothing (it has no
// publisher to call); a bad line still stops it where the run would stop.
func TestImportDryRun(t *testing.T) {
	ms := numbered(4)
	res, err := Import(context.Background(), strings.NewReader(lines(ms...)), nil, ImportOptions{To: "orders.dlq", Skip: 1, DryRun: true})
	if err != nil || !res.DryRun || res.WouldPublish != 3 || res.Published != 0 || res.Skipped != 1 || res.Through != 4 {
		t.Fatalf("err=%v %+v", err, res)
	}
	res, err = Import(context.Background(), strings.NewReader(lines(ms[:2]...)+"{\n"), nil, ImportOptions{To: "orders.dlq", DryRun: true})
	if err == nil || !strings.Contains(err.Error(), "line 3") || res.Through != 2 {
		t.Fatalf("bad line: err=%v %+v", err, res)
	}
}

func TestFilterMessageIDs(t *testing.T) {
	f := Filter{MessageIDs: []string{"a", "c"}}
	for id, want := range map[string]bool{"a": true, "c": true, "b": false, "": false, "A": false} {
		m := dead(id, "orders", "k", "max-attempts", 500, 0)
		if got, why := f.Match(m, t0); got != want || !got && why != "message-id" {
			t.Errorf("id %q: match %v (%s), want %v", id, got, why, want)
		}
	}
	if err := (&Filter{MessageIDs: []string{"a", ""}}).Validate(); err == nil || !strings.Contains(err.Error(), "--message-id") {
		t.Errorf("an empty id: %v", err)
	}
}
