package dlq

import (
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

func TestFingerprint(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"connection refused", "connection refused"},
		{"order 12345 not found", "order <n> not found"},
		{"order 98 not found", "order <n> not found"},
		{"user 3f2504e0-4f89-11d3-9a0c-0305e82c3301 missing", "user <uuid> missing"},
		{"user 3F2504E0-4F89-11D3-9A0C-0305E82C3301 missing", "user <uuid> missing"},
		{"at 2026-11-25T03:18:33.123Z deadline passed", "at <time> deadline passed"},
		{"at 2026-11-25 03:18:33+01:00 deadline passed", "at <time> deadline passed"},
		{"checksum deadbeef01 mismatch", "checksum <hex> mismatch"},
		{"pointer 0x7ffd12ab", "pointer <hex>"},
		{"record ord_12ab9 rejected", "record <id> rejected"},
		{"status: 503, retry after 2.5s", "status: <n>, retry after <n>.<n>s"},
		{"  many\t\tspaces\n here ", "many spaces here"},
		{"café 42 ünïcode", "café <n> ünïcode"},
		{"deadbeef is a word", "deadbeef is a word"},
	} {
		if got := Fingerprint(tc.in); got != tc.want {
			t.Errorf("Fingerprint(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestFingerprintSameFailureSameGroup(t *testing.T) {
	a := Fingerprint(`POST /orders/8812: upstream 10.0.3.17 answered 503 at 2026-11-25T03:18:33Z (request 3f2504e0-4f89-11d3-9a0c-0305e82c3301)`)
	b := Fingerprint(`POST /orders/17: upstream 10.0.3.201 answered 503 at 2026-11-24T23:01:02.5Z (request 9a2504e0-4f89-11d3-9a0c-0305e82c33ff)`)
	if a != b {
		t.Fatalf("same failure fingerprints differ:\n%s\n%s", a, b)
	}
	if c := Fingerprint(`POST /orders/17: schema validation failed`); c == a {
		t.Fatalf("different failures share fingerprint %q", c)
	}
}

func TestFingerprintBounded(t *testing.T) {
	long := strings.Repeat("é", 400)
	got := Fingerprint(long)
	if len(got) > MaxFingerprint+len("…") {
		t.Fatalf("fingerprint is %d bytes, want at most %d", len(got), MaxFingerprint+len("…"))
	}
	if !strings.HasSuffix(got, "…") || !strings.HasPrefix(got, "éé") {
		t.Fatalf("cut fingerprint = %q", got)
	}
	for _, r := range got {
		if r == '\uFFFD' {
			t.Fatalf("cut split a rune: %q", got)
		}
	}
}

func TestGroupOfAndFilter(t *testing.T) {
	a := dead("a", "orders", "order.created", "max-attempts", 503, time.Hour)
	a.Headers[msg.HeaderFinalError] = "upstream answered 503 after 1200ms"
	b := dead("b", "orders", "order.created", "max-attempts", 503, time.Minute)
	b.Headers[msg.HeaderFinalError] = []byte("upstream answered 503 after 31ms")
	c := dead("c", "orders", "order.created", "max-attempts", 502, time.Minute)
	c.Headers[msg.HeaderFinalError] = "upstream answered 503 after 31ms"
	d := dead("d", "orders", "order.paid", "max-attempts", 503, time.Minute)
	d.Headers[msg.HeaderFinalError] = "upstream answered 503 after 31ms"
	e := &msg.Message{MessageID: "e", Headers: map[string]any{}}

	ga := GroupOf(a)
	want := GroupKey{Reason: "max-attempts", Status: "503", Fingerprint: "upstream answered <n> after <n>ms", RoutingKey: "order.created"}
	if ga != want {
		t.Fatalf("GroupOf = %+v, want %+v", ga, want)
	}
	if GroupOf(b) != ga {
		t.Fatalf("b (bytes header, other numbers) = %+v, want the group of a", GroupOf(b))
	}
	if GroupOf(c) == ga || GroupOf(d) == ga {
		t.Fatal("other status or routing key in the same group")
	}
	if ge := GroupOf(e); ge.Status != Unknown || ge.Reason != "" {
		t.Fatalf("bare message group = %+v", ge)
	}

	f := Filter{Groups: []GroupKey{ga}}
	if err := f.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		m    *msg.Message
		want bool
	}{{a, true}, {b, true}, {c, false}, {d, false}, {e, false}} {
		if got, why := f.Match(tc.m, t0); got != tc.want {
			t.Errorf("message %s: match = %v (%s), want %v", tc.m.MessageID, got, why, tc.want)
		}
	}
	two := Filter{Groups: []GroupKey{ga, GroupOf(e)}}
	if ok, _ := two.Match(e, t0); !ok {
		t.Error("second group of the filter not matched")
	}
}
