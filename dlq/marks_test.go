package dlq

import (
	"errors"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// TestMarksRoundTrip: a set stored as a message reads back as it was, and
// the message is persistent, typed and named by its Seq.
func TestMarksRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)
	m := Marks{DLQ: "orders.dlq", Seq: 7, Updated: at, By: "oncall from 127.0.0.1:5000",
		Ignored: map[string]Mark{"3f2a": {By: "oncall from 127.0.0.1:5000", At: at, Messages: 4}}}
	enc, err := EncodeMarks(m)
	if err != nil {
		t.Fatal(err)
	}
	if enc.DeliveryMode != 2 || enc.Type != MarksType || enc.MessageID != "console-marks-7" || enc.ContentType != "application/json" {
		t.Errorf("message = %+v", enc)
	}
	got, err := DecodeMarks("orders.dlq", enc)
	if err != nil {
		t.Fatal(err)
	}
	if got.Format != MarksFormat || got.Seq != 7 || !got.Updated.Equal(at) || got.Ignored["3f2a"] != m.Ignored["3f2a"] || len(got.Ignored) != 1 {
		t.Errorf("decoded %+v, want %+v", got, m)
	}
}

// TestDecodeMarksRefuses: a message that is not a set of marks of this
// DLQ, in this format, is refused with ErrNotMarks rather than read as an
// empty set, which the next change would then store over it.
func TestDecodeMarksRefuses(t *testing.T) {
	good, err := EncodeMarks(Marks{DLQ: "orders.dlq", Seq: 1})
	if err != nil {
		t.Fatal(err)
	}
	newer := *good
	newer.Body = []byte(`{"format":2,"dlq":"orders.dlq","seq":2,"ignored":{}}`)
	junk := *good
	junk.Body = []byte(`not json`)
	untyped := *good
	untyped.Type = ""
	for name, m := range map[string]*msg.Message{"another DLQ's": good, "a newer format": &newer, "not JSON": &junk, "another type": &untyped} {
		dlqName := "orders.dlq"
		if name == "another DLQ's" {
			dlqName = "billing.dlq"
		}
		if _, err := DecodeMarks(dlqName, m); !errors.Is(err, ErrNotMarks) {
			t.Errorf("%s: err = %v, want ErrNotMarks", name, err)
		}
	}
}

// TestLatestMarks: the highest Seq wins (an older set left beside a newer
// one by a change whose removal of the old did not reach the broker), the
// later update between equal ones; none is the empty set.
func TestLatestMarks(t *testing.T) {
	empty, i := LatestMarks("q.dlq", nil)
	if i != -1 || empty.Seq != 0 || empty.Ignored == nil || len(empty.Ignored) != 0 || empty.DLQ != "q.dlq" {
		t.Errorf("no sets: %+v %d", empty, i)
	}
	at := time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)
	sets := []Marks{
		{Seq: 4, Updated: at, Ignored: map[string]Mark{"a": {}}},
		{Seq: 5, Updated: at, Ignored: map[string]Mark{"b": {}}},
		{Seq: 5, Updated: at.Add(time.Second), Ignored: map[string]Mark{"c": {}}},
		{Seq: 3, Updated: at.Add(time.Hour)},
	}
	got, i := LatestMarks("q.dlq", sets)
	if i != 2 || got.IDs()[0] != "c" {
		t.Errorf("latest = %d %+v, want the third", i, got)
	}
	got.Ignored["x"] = Mark{}
	if len(sets[2].Ignored) != 1 {
		t.Error("the latest set shares its map with the sets read")
	}
}

// TestMarksNext: a change makes the next set, one Seq higher, and leaves
// the set it was made from as it was.
func TestMarksNext(t *testing.T) {
	at := time.Date(2026, 11, 28, 1, 0, 0, 0, time.FixedZone("x", 3600))
	old := Marks{DLQ: "q.dlq", Seq: 9, Ignored: map[string]Mark{"a": {By: "x"}}}
	next := old.Next(at, "oncall", func(m *Marks) {
		delete(m.Ignored, "a")
		m.Ignored["b"] = Mark{By: "oncall", At: at}
	})
	if next.Seq != 10 || next.By != "oncall" || !next.Updated.Equal(at) || next.Updated.Location() != time.UTC || next.Format != MarksFormat {
		t.Errorf("next = %+v", next)
	}
	if ids := next.IDs(); len(ids) != 1 || ids[0] != "b" {
		t.Errorf("next marks %v, want [b]", ids)
	}
	if _, ok := old.Ignored["a"]; !ok || len(old.Ignored) != 1 || old.Seq != 9 {
		t.Errorf("the old set changed: %+v", old)
	}
}

func TestMarksQueue(t *testing.T) {
	if got := MarksQueue("orders.dlq"); got != "orders.dlq.console-marks" {
		t.Errorf("MarksQueue = %q", got)
	}
}
