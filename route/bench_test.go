package route

import (
	"fmt"
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/msg"
)

// BenchmarkDecide judges a JSON message of about 256 bytes against eight
// routes, four on a header and four on a body field, that it matches none
// of: every rule runs and the body is read.
func BenchmarkDecide(b *testing.B) {
	var s Spec
	for i := range 8 {
		match := fmt.Sprintf(`headers["x-event-type"] == "e%d"`, i)
		if i >= 4 {
			match = fmt.Sprintf(`body.kind == "k%d"`, i)
		}
		s.Routes = append(s.Routes, RouteSpec{Name: fmt.Sprintf("r%d", i), Match: match})
	}
	t, err := Compile(s)
	if err != nil {
		b.Fatal(err)
	}
	m := &msg.Message{
		ContentType: "application/json",
		Headers:     map[string]any{"x-event-type": "e9"},
		Body:        []byte(`{"kind":"k9","seq":12345,"pad":"` + strings.Repeat("x", 200) + `"}`),
	}
	b.ReportAllocs()
	for b.Loop() {
		if d := t.Decide(m, "rk", "ex"); d.Route != nil {
			b.Fatalf("matched %s", d.RouteName())
		}
	}
}
