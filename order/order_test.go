package order

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/msg"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"", "", ""},
		{"routingKey", "routingKey", ""},
		{"type", "type", ""},
		{"header:customer-id", "header:customer-id", ""},
		{"messageId:/", "messageId:/", ""},
		{"routingKey:x", "", "takes no argument"},
		{"header:", "", "names no header"},
		{"header", "", "names no header"},
		{"messageId", "", "names no separator"},
		{"customer", "", "unknown ordering key"},
	} {
		s, err := Parse(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Parse(%q) = %v, want error with %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || s.String() != tc.want || s.Set() != (tc.want != "") {
			t.Errorf("Parse(%q) = %q set=%v, %v; want %q", tc.in, s, s.Set(), err, tc.want)
		}
	}
}

func TestKey(t *testing.T) {
	m := &msg.Message{RoutingKey: "eu.orders", Type: "order.created", MessageID: "cust-7/42",
		Headers: map[string]any{"customer-id": "c7", "n": int32(12), "blob": []byte("x"), "empty": ""}}
	long := strings.Repeat("k", MaxKeyLen+10)
	for _, tc := range []struct {
		src  string
		m    *msg.Message
		want string
		ok   bool
	}{
		{"routingKey", m, "eu.orders", true},
		{"type", m, "order.created", true},
		{"header:customer-id", m, "c7", true},
		{"header:n", m, "12", true},
		{"header:blob", m, "", false},
		{"header:empty", m, "", false},
		{"header:missing", m, "", false},
		{"messageId:/", m, "cust-7", true},
		{"messageId:#", m, "", false},
		{"routingKey", &msg.Message{}, "", false},
		{"routingKey", &msg.Message{RoutingKey: long}, long[:MaxKeyLen], true},
		{"", m, "", false},
	} {
		s, err := Parse(tc.src)
		if err != nil {
			t.Fatal(err)
		}
		k, ok := s.Key(tc.m)
		if k != tc.want || ok != tc.ok {
			t.Errorf("%s: Key = %q, %v; want %q, %v", tc.src, k, ok, tc.want, tc.ok)
		}
	}
}

func TestLanesOneAtATimePerKey(t *testing.T) {
	l := NewLanes[int]()
	if !l.Add("a", 1) || !l.Add("b", 2) {
		t.Fatal("a free key must deliver at once")
	}
	if l.Add("a", 3) || l.Add("a", 4) {
		t.Fatal("a busy key must hold what comes behind")
	}
	if l.Busy() != 2 || l.Waiting() != 2 {
		t.Fatalf("busy %d waiting %d, want 2 and 2", l.Busy(), l.Waiting())
	}
	if n, ok := l.Done("a"); !ok || n != 3 {
		t.Fatalf("Done(a) = %d, %v; want 3", n, ok)
	}
	if _, ok := l.Done("b"); ok || l.Busy() != 1 {
		t.Fatalf("b had nothing behind it: it must be free (busy %d)", l.Busy())
	}
	if n, ok := l.Done("a"); !ok || n != 4 {
		t.Fatalf("Done(a) = %d, %v; want 4", n, ok)
	}
	if _, ok := l.Done("a"); ok || l.Busy() != 0 || l.Waiting() != 0 {
		t.Fatalf("all done: busy %d waiting %d", l.Busy(), l.Waiting())
	}
	if !l.Add("a", 5) {
		t.Fatal("a freed key must deliver at once")
	}
}

// TestLanesCut: the items waiting behind a key can be taken out of its
// line, in arrival order, while the key stays busy with the one being
// delivered; Firsts names the first waiting item of each key.
func TestLanesCut(t *testing.T) {
	l := NewLanes[int]()
	l.Add("a", 1)
	l.Add("a", 2)
	l.Add("a", 3)
	l.Add("b", 4)
	l.Add("b", 5)
	l.Add("c", 6)
	firsts := func() map[string]int {
		got := map[string]int{}
		l.Firsts(func(k string, first int) { got[k] = first })
		return got
	}
	if got := firsts(); len(got) != 2 || got["a"] != 2 || got["b"] != 5 {
		t.Fatalf("Firsts %v, want a:2 b:5 (c has nothing waiting)", got)
	}
	if got := l.Cut("a"); !slices.Equal(got, []int{2, 3}) {
		t.Fatalf("Cut(a) = %v, want [2 3]", got)
	}
	if l.Waiting() != 1 || l.Busy() != 3 {
		t.Fatalf("waiting %d busy %d, want 1 and 3: a stays busy", l.Waiting(), l.Busy())
	}
	if got := firsts(); len(got) != 1 || got["b"] != 5 {
		t.Fatalf("Firsts %v, want b:5", got)
	}
	if got := l.Cut("c"); got != nil {
		t.Fatalf("Cut(c) = %v, want nothing", got)
	}
	if got := l.Cut("z"); got != nil {
		t.Fatalf("Cut of a free key = %v, want nothing", got)
	}
	if l.Add("a", 7) {
		t.Fatal("a is still busy: 7 must wait")
	}
	if n, ok := l.Done("a"); !ok || n != 7 {
		t.Fatalf("Done(a) = %d, %v; want 7", n, ok)
	}
	if _, ok := l.Done("a"); ok {
		t.Fatal("nothing left behind a")
	}
	if got := l.Cut("b"); !slices.Equal(got, []int{5}) || l.Waiting() != 0 {
		t.Fatalf("Cut(b) = %v, waiting %d; want [5] and 0", got, l.Waiting())
	}
}

// TestLanesRandom runs random arrivals and completions over a few keys and
// checks that each key delivers its items in arrival order, never two at a
// time, and that nothing is kept once everything is done.
func TestLanesRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	l := NewLanes[int]()
	type item struct {
		key string
		seq int
	}
	keys := []string{"a", "b", "c", "d", "e"}
	var inFlight []item
	next := map[string]int{}
	delivered := map[string]int{}
	seqOf := map[int]item{}
	id := 0
	deliver := func(it item) {
		for _, f := range inFlight {
			if f.key == it.key {
				t.Fatalf("key %s delivered twice at once", it.key)
			}
		}
		if it.seq != delivered[it.key] {
			t.Fatalf("key %s delivered %d, want %d", it.key, it.seq, delivered[it.key])
		}
		delivered[it.key]++
		inFlight = append(inFlight, it)
	}
	for step := 0; step < 20000; step++ {
		if len(inFlight) == 0 || r.IntN(2) == 0 {
			k := keys[r.IntN(len(keys))]
			it := item{k, next[k]}
			next[k]++
			id++
			seqOf[id] = it
			if l.Add(k, id) {
				deliver(it)
			}
			continue
		}
		i := r.IntN(len(inFlight))
		done := inFlight[i]
		inFlight = append(inFlight[:i], inFlight[i+1:]...)
		if n, ok := l.Done(done.key); ok {
			deliver(seqOf[n])
		}
	}
	for len(inFlight) > 0 {
		done := inFlight[0]
		inFlight = inFlight[1:]
		if n, ok := l.Done(done.key); ok {
			deliver(seqOf[n])
		}
	}
	for _, k := range keys {
		if delivered[k] != next[k] {
			t.Errorf("key %s: delivered %d of %d", k, delivered[k], next[k])
		}
	}
	if l.Busy() != 0 || l.Waiting() != 0 {
		t.Errorf("left busy %d waiting %d", l.Busy(), l.Waiting())
	}
}
