package app_test

import (
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hopper-sidecar/hopper/app"
	"github.com/hopper-sidecar/hopper/msg"
)

// headerMap turns BuildHeaders' output into a map, failing on a name that
// appears twice.
func headerMap(t *testing.T, hs []app.Header) map[string]string {
	t.Helper()
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		if _, dup := m[h.Name]; dup {
			t.Errorf("header %q sent twice", h.Name)
		}
		m[h.Name] = h.Value
	}
	return m
}

// isToken is RFC 9110's token (section 5.6.2): one or more tchar.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

func TestBuildHeadersIdentityAndHistory(t *testing.T) {
	ts := time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.FixedZone("CET", 3600))
	deadline := time.Date(2026, 3, 4, 6, 0, 0, 500_000_000, time.UTC)
	m := &msg.Message{
		Exchange:        "", // a tier queue delivers through the default exchange
		RoutingKey:      "orders",
		Redelivered:     true,
		MessageID:       "m-42",
		CorrelationID:   "c-7",
		Type:            "order.created",
		Timestamp:       ts,
		ContentEncoding: "gzip",
		AppID:           "shop",
		Headers: map[string]any{
			msg.HeaderFirstFailureTime: "2026-03-04T04:00:00.25Z",
			"traceparent":              "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tracestate":               "vendor=x",
		},
	}
	in := msg.Info{
		Queue:      "orders",
		Exchange:   "shop-events",
		RoutingKey: "order.created.eu",
		Attempt:    3,
		Requeues:   2,
		Deadline:   deadline,
	}
	hs, skipped := app.BuildHeaders(nil, m, in)
	if skipped != 0 {
		t.Errorf("skipped %d", skipped)
	}
	got := headerMap(t, hs)
	want := map[string]string{
		app.HdrMessageID:       "m-42",
		app.HdrCorrelationID:   "c-7",
		app.HdrType:            "order.created",
		app.HdrRoutingKey:      "order.created.eu", // the original, from msg.Info
		app.HdrExchange:        "shop-events",
		app.HdrQueue:           "orders",
		app.HdrTimestamp:       "2026-03-04T04:06:07Z", // RFC 3339, UTC, seconds
		app.HdrRedelivered:     "true",
		app.HdrAttempt:         "3",
		app.HdrRequeueCount:    "2",
		app.HdrFirstFailure:    "2026-03-04T04:00:00.25Z",
		app.HdrDeadline:        "2026-03-04T06:00:00.5Z",
		app.HdrContentEncoding: "gzip",
		app.HdrAppID:           "shop",
		"traceparent":          "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":           "vendor=x",
		// The first-failure header is also an application header.
		app.HdrHeaderPrefix + msg.HeaderFirstFailureTime: "2026-03-04T04:00:00.25Z",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected header %s: %q", k, got[k])
		}
	}
	if _, err := time.Parse(time.RFC3339, got[app.HdrTimestamp]); err != nil {
		t.Errorf("timestamp not RFC 3339: %v", err)
	}
	for _, h := range hs {
		if !isToken(h.Name) {
			t.Errorf("invalid header name %q", h.Name)
		}
	}
}

func TestBuildHeadersMinimalMessage(t *testing.T) {
	m := &msg.Message{Body: []byte("x")}
	hs, skipped := app.BuildHeaders(nil, m, msg.Info{Queue: "q", Attempt: 1})
	got := headerMap(t, hs)
	if skipped != 0 {
		t.Errorf("skipped %d", skipped)
	}
	// Unset properties are left out rather than sent empty.
	for _, absent := range []string{app.HdrMessageID, app.HdrCorrelationID, app.HdrType, app.HdrTimestamp,
		app.HdrFirstFailure, app.HdrDeadline, app.HdrExchange, app.HdrRoutingKey, app.HdrAppID, "traceparent"} {
		if v, ok := got[absent]; ok {
			t.Errorf("%s sent for an unset property: %q", absent, v)
		}
	}
	if got[app.HdrRedelivered] != "false" || got[app.HdrAttempt] != "1" || got[app.HdrRequeueCount] != "0" || got[app.HdrQueue] != "q" {
		t.Errorf("got %v", got)
	}
}

func TestBuildHeadersAppendsToDst(t *testing.T) {
	dst := make([]app.Header, 1, 32)
	dst[0] = app.Header{Name: "Keep", Value: "me"}
	hs, _ := app.BuildHeaders(dst, &msg.Message{MessageID: "id"}, msg.Info{Attempt: 1})
	if hs[0] != (app.Header{Name: "Keep", Value: "me"}) || len(hs) < 2 {
		t.Fatalf("dst not kept: %v", hs)
	}
	if &hs[0] != &dst[0] {
		t.Error("dst storage not reused")
	}
}

func TestBuildHeadersApplicationHeaders(t *testing.T) {
	when := time.Date(2026, 5, 6, 7, 8, 9, 0, time.FixedZone("X", -7200))
	headers := map[string]any{
		// Forwarded.
		"s":                  "text",
		"i8":                 int8(-8),
		"i16":                int16(1600),
		"i32":                int32(-5),
		"i64":                int64(1) << 40,
		"int":                42,
		"u8":                 uint8(255),
		"u16":                uint16(65535),
		"u32":                uint32(1) << 31,
		"f32":                float32(2.25),
		"f64":                1.5,
		"f64-whole":          3.0,
		"yes":                true,
		"no":                 false,
		"when":               when,
		"x-Mixed_Case":       "kept as is",
		"tok!#$%&'*+-.^_`|~": "all tchars",
		// Skipped and counted.
		"nested":     map[string]any{"a": 1},
		"array":      []any{1, "two"},
		"bytes":      []byte("raw"),
		"nil":        nil,
		"with space": "v",
		"co:lon":     "v",
		"":           "v",
		"naïve":      "v",
		"paren(s)":   "v",
		"slash/x":    "v",
	}
	// The broker's dead-letter history is bookkeeping: neither forwarded
	// nor counted as skipped.
	headers["x-death"] = []any{map[string]any{"count": int64(1), "queue": "orders.retry.1s"}}
	hs, skipped := app.BuildHeaders(nil, &msg.Message{Headers: headers}, msg.Info{Attempt: 1})
	got := headerMap(t, hs)
	want := map[string]string{
		"s":                  "text",
		"i8":                 "-8",
		"i16":                "1600",
		"i32":                "-5",
		"i64":                strconv.FormatInt(1<<40, 10),
		"int":                "42",
		"u8":                 "255",
		"u16":                "65535",
		"u32":                "2147483648",
		"f32":                "2.25",
		"f64":                "1.5",
		"f64-whole":          "3",
		"yes":                "true",
		"no":                 "false",
		"when":               "2026-05-06T09:08:09Z",
		"x-Mixed_Case":       "kept as is",
		"tok!#$%&'*+-.^_`|~": "all tchars",
	}
	for k, v := range want {
		name := app.HdrHeaderPrefix + k
		if g, ok := got[name]; !ok || g != v {
			t.Errorf("%s = %q (present %v), want %q", name, g, ok, v)
		}
	}
	n := 0
	for name := range got {
		if strings.HasPrefix(name, app.HdrHeaderPrefix) {
			n++
		}
	}
	if n != len(want) {
		t.Errorf("%d application headers forwarded, want %d: %v", n, len(want), got)
	}
	if _, ok := got[app.HdrHeaderPrefix+"x-death"]; ok {
		t.Error("x-death forwarded")
	}
	if wantSkipped := len(headers) - len(want) - 1; skipped != wantSkipped {
		t.Errorf("skipped = %d, want %d", skipped, wantSkipped)
	}
	for _, h := range hs {
		if !isToken(h.Name) {
			t.Errorf("invalid header name %q", h.Name)
		}
	}
}

func TestBuildHeadersTraceContextOnlyAsString(t *testing.T) {
	hs, _ := app.BuildHeaders(nil, &msg.Message{Headers: map[string]any{"traceparent": int64(5)}}, msg.Info{})
	got := headerMap(t, hs)
	if _, ok := got["traceparent"]; ok {
		t.Error("a non-string traceparent was forwarded")
	}
	if _, ok := got[app.HdrHeaderPrefix+"traceparent"]; ok {
		t.Error("traceparent forwarded under the application prefix")
	}
}

func TestBuildHeadersHostileValues(t *testing.T) {
	m := &msg.Message{
		MessageID:     "id\r\nX-Injected: 1",
		CorrelationID: "c\x00d",
		Type:          "t\nype",
		Headers: map[string]any{
			"evil":        "a\r\n\r\nGET / HTTP/1.1\r\n",
			"long":        strings.Repeat("v", 10000),
			"traceparent": "00-abc\r\nX: y",
		},
	}
	hs, _ := app.BuildHeaders(nil, m, msg.Info{RoutingKey: "rk\r\nX: 1", Queue: "q\x00"})
	for _, h := range hs {
		if strings.ContainsAny(h.Value, "\r\n\x00") {
			t.Errorf("%s carries CR/LF/NUL: %q", h.Name, h.Value)
		}
		if len(h.Value) > 4096 {
			t.Errorf("%s is %d bytes", h.Name, len(h.Value))
		}
	}
	got := headerMap(t, hs)
	if got[app.HdrMessageID] != "id  X-Injected: 1" {
		t.Errorf("message id %q", got[app.HdrMessageID])
	}
	if got[app.HdrHeaderPrefix+"long"] != strings.Repeat("v", 4096) {
		t.Errorf("long value not cut at 4096 bytes: %d", len(got[app.HdrHeaderPrefix+"long"]))
	}
}

// TestBuildHeadersEmptyStringHeader: an application header whose value is
// the empty string is a string header; it must be forwarded, or
// at least counted as skipped.
func TestBuildHeadersEmptyStringHeader(t *testing.T) {
	hs, skipped := app.BuildHeaders(nil, &msg.Message{Headers: map[string]any{"flag": ""}}, msg.Info{})
	got := headerMap(t, hs)
	if _, ok := got[app.HdrHeaderPrefix+"flag"]; !ok && skipped != 1 {
		t.Fatalf("empty header neither forwarded nor counted (skipped=%d)", skipped)
	}
}

func TestSanitizeValue(t *testing.T) {
	cases := []struct{ in, want string }{
		{"plain", "plain"},
		{"", ""},
		{"a\tb", "a\tb"},
		{"a\rb", "a b"},
		{"a\nb", "a b"},
		{"a\r\nb", "a  b"},
		{"a\x00b", "a b"},
		{"\x01\x02\x1b[31m\x7f", "   [31m "},
		{"é ü € 😀", "é ü € 😀"},
		{"\x85\xff", "\x85\xff"}, // bytes >= 0x80 are not controls at byte level
	}
	for _, tc := range cases {
		if got := app.SanitizeValue(tc.in); got != tc.want {
			t.Errorf("SanitizeValue(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	for c := 0; c < 0x20; c++ {
		if c == '\t' {
			continue
		}
		if got := app.SanitizeValue("x" + string(rune(c)) + "y"); got != "x y" {
			t.Errorf("control %#x -> %q", c, got)
		}
	}
}

func TestSanitizeValueLength(t *testing.T) {
	if got := app.SanitizeValue(strings.Repeat("a", 4096)); len(got) != 4096 {
		t.Errorf("4096 bytes cut to %d", len(got))
	}
	if got := app.SanitizeValue(strings.Repeat("a", 4097)); got != strings.Repeat("a", 4096) {
		t.Errorf("4097 bytes -> %d", len(got))
	}
	// A multi-byte rune across the limit is dropped whole.
	for _, r := range []string{"é", "€", "😀"} {
		for pad := 4096 - len(r) - 1; pad <= 4096; pad++ {
			in := strings.Repeat("a", pad) + r + strings.Repeat("b", 10)
			got := app.SanitizeValue(in)
			if len(got) > 4096 || !utf8.ValidString(got) || !strings.HasPrefix(in, got) {
				t.Fatalf("pad %d rune %q: got %d bytes, valid %v", pad, r, len(got), utf8.ValidString(got))
			}
			if pad+len(r) <= 4096 && len(got) != 4096 {
				t.Errorf("pad %d rune %q: %d bytes, want 4096", pad, r, len(got))
			}
			if pad < 4096 && pad+len(r) > 4096 && len(got) != pad {
				t.Errorf("pad %d rune %q: cut at %d, want at the rune start %d", pad, r, len(got), pad)
			}
		}
	}
	// Controls and length together.
	got := app.SanitizeValue(strings.Repeat("\r\n", 3000))
	if len(got) != 4096 || strings.Trim(got, " ") != "" {
		t.Errorf("got %d bytes %q...", len(got), got[:10])
	}
}

func FuzzBuildHeaders(f *testing.F) {
	f.Add("x-tenant", "acme", []byte("body"))
	f.Add("bad name", "v\r\nInjected: 1", []byte{0, 1, 2})
	f.Add("traceparent", "00-abc-def-01", []byte("\r\n"))
	f.Add("", "", []byte(nil))
	f.Add("naïve", strings.Repeat("€", 2000), []byte(strings.Repeat("x", 5000)))
	f.Add("a:b", "\x00\x7f\t", []byte("é"))
	f.Fuzz(func(t *testing.T, name, value string, body []byte) {
		m := &msg.Message{
			MessageID:     value,
			CorrelationID: string(body),
			Type:          name,
			ContentType:   value,
			Headers: map[string]any{
				name:          value,
				name + "-raw": body,
				name + "-n":   int64(len(body)),
				"v-" + value:  true,
				"tracestate":  value,
				"body":        string(body),
			},
			Body: body,
		}
		in := msg.Info{Queue: name, Exchange: value, RoutingKey: string(body), Attempt: len(body), Deadline: time.UnixMilli(int64(len(value)))}
		hs, skipped := app.BuildHeaders(nil, m, in)
		got := map[string]string{}
		for _, h := range hs {
			got[h.Name] = h.Value
		}
		// Every application header is forwarded or counted as skipped.
		// (Trace context has its own names, x-death is the broker's
		// bookkeeping; an empty string value is the known bug of
		// TestBuildHeadersEmptyStringHeader.)
		notForwarded, empty := 0, 0
		for k, v := range m.Headers {
			if k == "traceparent" || k == "tracestate" || k == "x-death" {
				continue
			}
			if v == "" {
				empty++
				continue
			}
			fv, ok := got[app.HdrHeaderPrefix+k]
			if !ok {
				notForwarded++
				continue
			}
			if sv, isStr := v.(string); isStr && fv != app.SanitizeValue(sv) {
				t.Fatalf("header %q: sent %q, want %q", k, fv, app.SanitizeValue(sv))
			}
		}
		if skipped < notForwarded || skipped > notForwarded+empty {
			t.Fatalf("skipped = %d, but %d application headers were not forwarded (%v)", skipped, notForwarded, got)
		}
		for _, h := range hs {
			if !isToken(h.Name) {
				t.Fatalf("invalid header name %q", h.Name)
			}
			if strings.ContainsAny(h.Value, "\r\n\x00") {
				t.Fatalf("%s value carries CR, LF or NUL: %q", h.Name, h.Value)
			}
			if len(h.Value) > 4096 {
				t.Fatalf("%s value is %d bytes", h.Name, len(h.Value))
			}
		}
		s := app.SanitizeValue(value)
		if len(s) > 4096 || strings.ContainsAny(s, "\r\n\x00") {
			t.Fatalf("SanitizeValue(%q) = %q", value, s)
		}
		if utf8.ValidString(value) && !utf8.ValidString(s) {
			t.Fatalf("SanitizeValue broke UTF-8: %q -> %q", value, s)
		}
	})
}

func TestCloudEventHeaders(t *testing.T) {
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m := &msg.Message{MessageID: "id-1", Type: "order.created", Timestamp: ts, Body: []byte("{}")}
	got := map[string]string{}
	for _, h := range app.CloudEventHeaders(nil, m, msg.Info{Queue: "orders", Exchange: "shop", RoutingKey: "order.created.eu"}) {
		got[h.Name] = h.Value
	}
	want := map[string]string{"ce-specversion": "1.0", "ce-id": "id-1", "ce-source": "/rabbitmq/exchange/shop",
		"ce-type": "order.created", "ce-subject": "order.created.eu", "ce-time": "2026-01-02T03:04:05Z"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	// Without id, type and exchange: a stable derived id, the default type,
	// the queue as source.
	bare := &msg.Message{Body: []byte("x")}
	a := app.CloudEventHeaders(nil, bare, msg.Info{Queue: "orders", RoutingKey: "orders"})
	b := app.CloudEventHeaders(nil, bare, msg.Info{Queue: "orders", RoutingKey: "orders"})
	am := map[string]string{}
	for _, h := range a {
		am[h.Name] = h.Value
	}
	if am["ce-id"] == "" || a[1] != b[1] || am["ce-type"] != app.DefaultCloudEventType || am["ce-source"] != "/rabbitmq/queue/orders" {
		t.Errorf("derived attributes %v", am)
	}
	if _, ok := am["ce-time"]; ok {
		t.Error("ce-time without a timestamp")
	}
}
