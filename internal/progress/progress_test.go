package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// clock is a test clock the test moves by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func lines(b *bytes.Buffer) []string { return strings.Split(strings.TrimSpace(b.String()), "\n") }

// TestPlainLines: a line at most every Every, with count, percentage, rate
// and ETA from the clock, and a last line at Finish.
func TestPlainLines(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	var out bytes.Buffer
	r, err := New(&out, Options{What: "replay q.dlq", Mode: Auto, Every: 2 * time.Second, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	c.add(time.Second)
	r.Set(100, 1000) // too soon: no line
	if out.Len() != 0 {
		t.Fatalf("a line before Every: %q", out.String())
	}
	c.add(time.Second)
	r.Set(200, 1000) // 2s: 100 msg/s, 800 left: ETA 8s
	c.add(3 * time.Second)
	r.Set(500, 1000) // 5s: 100 msg/s, ETA 5s
	c.add(5 * time.Second)
	r.Set(1000, 1000)
	r.Finish()
	want := []string{
		"replay q.dlq: 200/1000 (20%), 100 msg/s, ETA 8s",
		"replay q.dlq: 500/1000 (50%), 100 msg/s, ETA 5s",
		"replay q.dlq: 1000/1000 (100%), 100 msg/s, ETA 0s",
		"replay q.dlq: 1000/1000 (100%), 100 msg/s, ETA 0s",
	}
	got := lines(&out)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestPlainUnknownTotal: an import does not know its total.
func TestPlainUnknownTotal(t *testing.T) {
	c := &clock{t: time.Unix(0, 0)}
	var out bytes.Buffer
	r, _ := New(&out, Options{What: "import", Mode: Plain, Every: time.Second, Now: c.now})
	c.add(4 * time.Second)
	r.Set(400, 0)
	if got := lines(&out); len(got) != 1 || got[0] != "import: 400, 100 msg/s, 4s" {
		t.Errorf("got %q", out.String())
	}
}

// TestModes: a buffer is no terminal, so auto is plain; bar draws a bar
// with the count; none writes nothing; anything else is refused.
func TestModes(t *testing.T) {
	var out bytes.Buffer
	r, err := New(&out, Options{What: "x", Mode: Auto})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.(*plain); !ok {
		t.Errorf("auto on a non-terminal: %T, want plain lines", r)
	}
	out.Reset()
	r, _ = New(&out, Options{What: "export", Mode: Bar})
	r.Set(5, 10)
	r.Finish()
	if s := out.String(); !strings.Contains(s, "export") || !strings.Contains(s, "10/10") {
		t.Errorf("bar output %q lacks the description or the count", s)
	}
	out.Reset()
	r, _ = New(&out, Options{What: "x", Mode: None})
	r.Set(1, 2)
	r.Finish()
	if out.Len() != 0 {
		t.Errorf("none wrote %q", out.String())
	}
	if _, err := New(&out, Options{Mode: "fancy"}); err == nil || !strings.Contains(err.Error(), "auto, bar, plain, none") {
		t.Errorf("mode fancy: %v", err)
	}
}
