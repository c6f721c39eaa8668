package app_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/app"
	"github.com/hopper-sidecar/hopper/msg"
)

// The default forwarding bounds, written out: Python's http.server answers
// 431 above 100 request headers, Node.js above 16 KiB of head, and the Java
// servers (Tomcat, Jetty, Netty) above 8 KiB.
const (
	hdrOmitted            = "Hopper-Headers-Omitted"
	defaultMaxHeaders     = 90
	defaultMaxHeaderBytes = 7168
	defaultMaxValueBytes  = 4096
)

// lineBytes is the size of the header lines of hs as sent: "Name: value\r\n".
func lineBytes(hs []app.Header) int {
	n := 0
	for _, h := range hs {
		n += len(h.Name) + len(h.Value) + 4
	}
	return n
}

// manyHeaders is a message with n application headers h000, h001, ...,
// each with a value of size bytes.
func manyHeaders(n, size int) *msg.Message {
	m := &msg.Message{MessageID: "many", Headers: map[string]any{}, Body: []byte("{}")}
	for i := range n {
		m.Headers["h"+strconv.Itoa(1000 + i)[1:]] = strings.Repeat("v", size)
	}
	return m
}

// forwardedNames are the application header names a request carries, in
// the order sent.
func forwardedNames(hs []app.Header) []string {
	var names []string
	for _, h := range hs {
		if name, ok := strings.CutPrefix(h.Name, app.HdrHeaderPrefix); ok {
			names = append(names, name)
		}
	}
	return names
}

// TestBuildHeadersBoundsHeaderCount: a message with 500 application headers
// becomes a request of at most 90 headers, Hopper's own all present, the
// application headers a prefix of them sorted by name, and the app told how
// many were left out.
func TestBuildHeadersBoundsHeaderCount(t *testing.T) {
	m := manyHeaders(500, 8)
	hs, omitted := app.BuildHeaders(nil, m, msg.Info{Queue: "orders", RoutingKey: "orders", Attempt: 1})
	if len(hs) > defaultMaxHeaders {
		t.Fatalf("%d request headers, want at most %d", len(hs), defaultMaxHeaders)
	}
	if b := lineBytes(hs); b > defaultMaxHeaderBytes {
		t.Fatalf("%d bytes of header lines, want at most %d", b, defaultMaxHeaderBytes)
	}
	got := headerMap(t, hs)
	for _, own := range []string{app.HdrMessageID, app.HdrQueue, app.HdrRoutingKey, app.HdrAttempt, app.HdrRedelivered, app.HdrRequeueCount} {
		if _, ok := got[own]; !ok {
			t.Errorf("Hopper's own %s left out", own)
		}
	}
	names := forwardedNames(hs)
	if len(names) == 0 {
		t.Fatal("no application header forwarded")
	}
	all := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		all = append(all, k)
	}
	slices.Sort(all)
	if !slices.Equal(names, all[:len(names)]) {
		t.Errorf("forwarded %v, want the first %d names in order %v", names, len(names), all[:len(names)])
	}
	if omitted != 500-len(names) {
		t.Errorf("omitted = %d, want %d", omitted, 500-len(names))
	}
	if got[hdrOmitted] != strconv.Itoa(500-len(names)) {
		t.Errorf("%s = %q, want %d", hdrOmitted, got[hdrOmitted], 500-len(names))
	}
	// The bound is used, not merely respected: one more header would not
	// have fit.
	if len(hs) != defaultMaxHeaders {
		t.Errorf("%d headers sent, want the bound %d filled", len(hs), defaultMaxHeaders)
	}
}

// TestBuildHeadersBoundsHeaderBytes: a few huge values. The value over the
// per-value cap is left out whole (a cut value would pass for the real
// one); the rest are forwarded in name order until the byte bound is hit.
func TestBuildHeadersBoundsHeaderBytes(t *testing.T) {
	m := &msg.Message{MessageID: "huge", Headers: map[string]any{
		"a-small": "1",
		"b-big":   strings.Repeat("b", 3000),
		"c-big":   strings.Repeat("c", 3000),
		"d-huge":  strings.Repeat("d", 10000),
		"e-big":   strings.Repeat("e", 3000),
		"f-big":   strings.Repeat("f", 3000),
		"g-small": "2",
	}}
	hs, omitted := app.BuildHeaders(nil, m, msg.Info{Queue: "orders", Attempt: 1})
	if b := lineBytes(hs); b > defaultMaxHeaderBytes {
		t.Fatalf("%d bytes of header lines, want at most %d", b, defaultMaxHeaderBytes)
	}
	got := headerMap(t, hs)
	if _, ok := got[app.HdrHeaderPrefix+"d-huge"]; ok {
		t.Error("a value over the per-value cap was forwarded (cut or whole)")
	}
	// a-small, b-big and c-big fit in 7 KiB beside Hopper's own; e-big
	// does not, and forwarding stops there: g-small is left out too.
	if names := forwardedNames(hs); !slices.Equal(names, []string{"a-small", "b-big", "c-big"}) {
		t.Errorf("forwarded %v", names)
	}
	if got[app.HdrHeaderPrefix+"b-big"] != m.Headers["b-big"] {
		t.Error("b-big not forwarded whole")
	}
	if omitted != 4 || got[hdrOmitted] != "4" {
		t.Errorf("omitted = %d, %s = %q; want 4", omitted, hdrOmitted, got[hdrOmitted])
	}
}

// TestBuildHeadersNothingOmittedNoSignal: a message whose headers all fit
// gets no Hopper-Headers-Omitted.
func TestBuildHeadersNothingOmittedNoSignal(t *testing.T) {
	hs, omitted := app.BuildHeaders(nil, manyHeaders(20, 100), msg.Info{Attempt: 1})
	got := headerMap(t, hs)
	if omitted != 0 || len(forwardedNames(hs)) != 20 {
		t.Errorf("omitted %d, forwarded %d of 20", omitted, len(forwardedNames(hs)))
	}
	if v, ok := got[hdrOmitted]; ok {
		t.Errorf("%s sent: %q", hdrOmitted, v)
	}
}
