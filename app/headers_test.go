package app_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"slices"
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
		AppID:         strings.Repeat("a", 5000),
		Headers: map[string]any{
			"evil":        "a\r\n\r\nGET / HTTP/1.1\r\n",
			"long":        strings.Repeat("v", 10000),
			"traceparent": "00-abc\r\nX: y",
		},
	}
	hs, omitted := app.BuildHeaders(nil, m, msg.Info{RoutingKey: "rk\r\nX: 1", Queue: "q\x00"})
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
	if got[app.HdrHeaderPrefix+"evil"] != "a    GET / HTTP/1.1  " {
		t.Errorf("evil = %q", got[app.HdrHeaderPrefix+"evil"])
	}
	// An application value over the cap is left out whole, and said so;
	// Hopper's own values (AMQP allows 255 bytes) are cut at 512.
	if v, ok := got[app.HdrHeaderPrefix+"long"]; ok {
		t.Errorf("a 10000-byte value was forwarded as %d bytes", len(v))
	}
	if omitted != 1 || got[app.HdrHeadersOmitted] != "1" {
		t.Errorf("omitted = %d, %s = %q, want 1", omitted, app.HdrHeadersOmitted, got[app.HdrHeadersOmitted])
	}
	if got[app.HdrAppID] != strings.Repeat("a", 512) {
		t.Errorf("app id of 5000 bytes sent as %d", len(got[app.HdrAppID]))
	}
}

// TestBuildHeadersHostileNames: application header names that are not HTTP
// tokens (header injection through the name, separators, controls,
// non-ASCII, empty) are never sent, are counted as invalid, and the app is
// told how many it misses.
func TestBuildHeadersHostileNames(t *testing.T) {
	hostile := []string{
		"x\r\nInjected: 1", "x\nInjected", "x\rY", "x\x00y", "", " ", "with space", "tab\tname",
		"co:lon", "Host:", ":authority", "naïve", "名前", "\xff\xfe", "paren(s)", "quote\"", "semi;colon",
		"slash/x", "a,b", "a=b", "{brace}", "at@sign", "q?", "back\\slash", strings.Repeat("n", 201),
	}
	headers := map[string]any{"ok-name": "kept\r\nX-Evil: 1"}
	for _, n := range hostile {
		headers[n] = "v"
	}
	hs, om := app.DefaultLimits.Build(nil, &msg.Message{Headers: headers}, msg.Info{Attempt: 1}, nil, app.Head{})
	if om.Invalid != len(hostile) || om.Total() != len(hostile) {
		t.Errorf("omitted %+v, want %d invalid", om, len(hostile))
	}
	got := headerMap(t, hs)
	if got[app.HdrHeaderPrefix+"ok-name"] != "kept  X-Evil: 1" {
		t.Errorf("ok-name = %q", got[app.HdrHeaderPrefix+"ok-name"])
	}
	if got[app.HdrHeadersOmitted] != strconv.Itoa(len(hostile)) {
		t.Errorf("%s = %q, want %d", app.HdrHeadersOmitted, got[app.HdrHeadersOmitted], len(hostile))
	}
	for _, h := range hs {
		if !isToken(h.Name) {
			t.Errorf("invalid header name %q sent", h.Name)
		}
		if strings.ContainsAny(h.Value, "\r\n\x00") {
			t.Errorf("%s carries CR/LF/NUL: %q", h.Name, h.Value)
		}
	}
}

// TestBuildExtraReplacesTraceContext: the client span's trace context
// (extra) replaces the message's instead of being sent twice, and the
// headers of head count against the limits.
func TestBuildExtraReplacesTraceContext(t *testing.T) {
	m := &msg.Message{Headers: map[string]any{"traceparent": "00-aaaa-bbbb-01", "tenant": "acme"}}
	extra := []app.Header{{Name: "traceparent", Value: "00-cccc-dddd-01"}, {Name: "ce-id", Value: "x\r\ny"}}
	hs, om := app.DefaultLimits.Build(nil, m, msg.Info{Attempt: 1}, extra, app.Head{})
	got := headerMap(t, hs)
	if got["traceparent"] != "00-cccc-dddd-01" || got["ce-id"] != "x  y" || got[app.HdrHeaderPrefix+"tenant"] != "acme" || om.Total() != 0 {
		t.Errorf("got %v, omitted %+v", got, om)
	}
	// A head that leaves room for Hopper's own headers and the omission
	// signal only: no application header goes, both are counted, and the
	// request stays within the bound.
	m.Headers["zone"] = "eu"
	hs, _ = app.DefaultLimits.Build(nil, m, msg.Info{Attempt: 1}, extra, app.Head{})
	own := hs[:len(hs)-2]
	signal := len(app.HdrHeadersOmitted) + 1 + 4
	hs, om = app.Limits{MaxHeaders: len(own) + 10 + 1}.Build(nil, m, msg.Info{Attempt: 1}, extra, app.Head{Headers: 10})
	if n := len(forwardedNames(hs)); n != 0 || om.MaxHeaders != 2 || len(hs) != len(own)+1 {
		t.Errorf("count bound: forwarded %d, omitted %+v, %d headers", n, om, len(hs))
	}
	hs, om = app.Limits{MaxHeaderBytes: lineBytes(own) + 100 + signal + 5}.Build(nil, m, msg.Info{Attempt: 1}, extra, app.Head{Bytes: 100})
	if n := len(forwardedNames(hs)); n != 0 || om.MaxHeaderBytes != 2 || lineBytes(hs)+100 > lineBytes(own)+100+signal+5 {
		t.Errorf("byte bound: forwarded %d, omitted %+v", n, om)
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
	f.Add("x-tenant", "acme", []byte("body"), uint16(0), uint16(0), uint16(0))
	f.Add("bad name", "v\r\nInjected: 1", []byte{0, 1, 2}, uint16(3), uint16(100), uint16(5000))
	f.Add("traceparent", "00-abc-def-01", []byte("\r\n"), uint16(10), uint16(7), uint16(1))
	f.Add("", "", []byte(nil), uint16(500), uint16(0), uint16(0))
	f.Add("naïve", strings.Repeat("€", 2000), []byte(strings.Repeat("x", 5000)), uint16(20), uint16(4000), uint16(200))
	f.Add("a:b", "\x00\x7f\t", []byte("é"), uint16(1), uint16(1), uint16(1))
	f.Add("h", strings.Repeat("v", 300), []byte("b"), uint16(200), uint16(60), uint16(3000))
	f.Fuzz(func(t *testing.T, name, value string, body []byte, n, maxHeaders, maxBytes uint16) {
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
		// Up to 300 more headers, so that every bound is reached.
		for i := range int(n % 300) {
			m.Headers[name+"-"+strconv.Itoa(i)] = strings.Repeat(value, i%3)
		}
		in := msg.Info{Queue: name, Exchange: value, RoutingKey: string(body), Attempt: len(body), Deadline: time.UnixMilli(int64(len(value)))}
		lim := app.Limits{
			MaxHeaders:     32 + int(maxHeaders%200),
			MaxHeaderBytes: 2048 + int(maxBytes%16384),
			MaxValueBytes:  1 + int(maxBytes/7%4096),
		}
		head := app.Head{Headers: int(maxHeaders % 5), Bytes: int(maxHeaders % 300)}
		hs, om := lim.Build(nil, m, in, []app.Header{{Name: "ce-id", Value: value}}, head)
		got := map[string]string{}
		var forwarded []string
		for _, h := range hs {
			if !isToken(h.Name) {
				t.Fatalf("invalid header name %q", h.Name)
			}
			if strings.ContainsAny(h.Value, "\r\n\x00") {
				t.Fatalf("%s value carries CR, LF or NUL: %q", h.Name, h.Value)
			}
			if _, dup := got[h.Name]; dup {
				t.Fatalf("header %q sent twice", h.Name)
			}
			got[h.Name] = h.Value
			if k, ok := strings.CutPrefix(h.Name, app.HdrHeaderPrefix); ok {
				forwarded = append(forwarded, k)
				if len(h.Value) > lim.MaxValueBytes {
					t.Fatalf("%s value is %d bytes, over %d", h.Name, len(h.Value), lim.MaxValueBytes)
				}
			} else if len(h.Value) > 512 {
				t.Fatalf("Hopper's own %s is %d bytes", h.Name, len(h.Value))
			}
		}
		// The bounds: the count always (Hopper's own headers take fewer
		// than 32); the bytes whenever any application header went, since
		// Hopper's own are sent whatever their size.
		if len(hs)+head.Headers > lim.MaxHeaders {
			t.Fatalf("%d headers + %d in the head, over %d", len(hs), head.Headers, lim.MaxHeaders)
		}
		if size := lineBytes(hs) + head.Bytes; len(forwarded) > 0 && size > lim.MaxHeaderBytes {
			t.Fatalf("head of %d bytes with %d application headers, over %d", size, len(forwarded), lim.MaxHeaderBytes)
		}
		// The application headers that could go, in name order; those sent
		// are the first of them, unchanged but for controls.
		var forwardable []string
		apps := 0
		for k, v := range m.Headers {
			if k == "traceparent" || k == "tracestate" || k == "x-death" {
				continue
			}
			apps++
			if s, ok := msg.Scalar(v); ok && isToken(k) && len(k) <= 200 && len(s) <= lim.MaxValueBytes {
				forwardable = append(forwardable, k)
			}
		}
		slices.Sort(forwardable)
		if len(forwarded) > len(forwardable) || !slices.Equal(forwarded, forwardable[:len(forwarded)]) {
			t.Fatalf("forwarded %q, not the first of %q", forwarded, forwardable)
		}
		for _, k := range forwarded {
			if sv, isStr := m.Headers[k].(string); isStr && got[app.HdrHeaderPrefix+k] != app.SanitizeValue(sv) {
				t.Fatalf("header %q: sent %q, want %q", k, got[app.HdrHeaderPrefix+k], app.SanitizeValue(sv))
			}
		}
		// Every application header is forwarded or counted, and the app
		// is told the count.
		if om.Total() != apps-len(forwarded) {
			t.Fatalf("omitted %+v, but %d of %d application headers were not forwarded", om, apps-len(forwarded), apps)
		}
		if sig, ok := got[app.HdrHeadersOmitted]; ok != (om.Total() > 0) || ok && sig != strconv.Itoa(om.Total()) {
			t.Fatalf("%s = %q (sent %v), omitted %d", app.HdrHeadersOmitted, sig, ok, om.Total())
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

// TestCloudEventIDFromContent pins the id derived for a message without a
// message id: the first 16 bytes of the SHA-256 of routing key, a zero byte
// and body, in hex, the same whether the content is hashed from the stack
// or streamed, so that ids already sent and deduplicated on stay valid.
func TestCloudEventIDFromContent(t *testing.T) {
	for _, size := range []int{0, 1, 256, 1024 - 6, 1024 - 5, 1024, 70000} {
		body := bytes.Repeat([]byte{'a' + byte(size%26)}, size)
		in := msg.Info{RoutingKey: "orders"}
		want := sha256.Sum256(append([]byte("orders\x00"), body...))
		if got := app.CloudEventID(&msg.Message{Body: body}, in); got != hex.EncodeToString(want[:16]) {
			t.Errorf("body of %d bytes: %q, want %x", size, got, want[:16])
		}
	}
	if got := app.CloudEventID(&msg.Message{MessageID: "m-1", Body: []byte("x")}, msg.Info{}); got != "m-1" {
		t.Errorf("with a message id: %q, want it", got)
	}
}

// The names of the headers Hopper writes itself are forwarded as any
// other application header's.
func TestForwardedNames(t *testing.T) {
	for _, k := range []string{msg.HeaderStream, msg.HeaderStreamOffset, msg.HeaderRetryCount, msg.HeaderRequeueCount,
		msg.HeaderFirstFailureTime, msg.HeaderLastFailureTime, msg.HeaderLastStatusCode, msg.HeaderOriginalExchange,
		msg.HeaderOriginalRoutingKey, msg.HeaderOriginalQueue, "tenant"} {
		if got, want := app.ForwardedName(k), app.HdrHeaderPrefix+k; got != want {
			t.Errorf("forwarded name of %s = %q, want %q", k, got, want)
		}
	}
}

func TestDigits(t *testing.T) {
	for _, n := range []int{0, 7, 9, 10, 99, 100, 256, 65535, 1 << 20, -1, -10, -256} {
		if got, want := app.Digits(n), len(strconv.Itoa(n)); got != want {
			t.Errorf("digits(%d) = %d, want %d", n, got, want)
		}
	}
}
