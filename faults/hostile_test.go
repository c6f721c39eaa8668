package faults

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// hostileKinds are what a publisher can put on a message that Hopper did
// not plan for, one per id in turn.
var hostileKinds = []string{
	"plain",
	"counters at the int64 limit",
	"counters as out-of-range strings and floats",
	"Hopper headers of the wrong type",
	"CR/LF in properties and header values",
	"a huge header table",
	"deep nesting",
	"a large body",
	"garbage broker headers",
}

// hostileMessage is the message for the i-th id: each kind in turn.
func hostileMessage(id string, i int) (*msg.Message, string) {
	m := &msg.Message{MessageID: id, ContentType: "text/plain", DeliveryMode: 2,
		Headers: map[string]any{}, Body: []byte("fault-suite " + id)}
	kind := hostileKinds[i%len(hostileKinds)]
	h := m.Headers
	switch kind {
	case "counters at the int64 limit":
		h[msg.HeaderRetryCount] = int64(math.MaxInt64)
		h[msg.HeaderCrashCount] = int64(math.MaxInt64)
	case "counters as out-of-range strings and floats":
		h[msg.HeaderRetryCount] = "9223372036854775807"
		h[msg.HeaderRequeueCount] = "-99999999999999999999"
		h[msg.HeaderCrashCount] = 1e300
		h[msg.HeaderReplayCount] = -1e300
	case "Hopper headers of the wrong type":
		h[msg.HeaderRetryCount] = map[string]any{"n": int32(3)}
		h[msg.HeaderRequeueCount] = []any{int32(1), "two"}
		h[msg.HeaderDeadline] = "soon"
		h[msg.HeaderOriginalRoutingKey] = []byte{0xff, 0x00, '\n'}
		h[msg.HeaderFirstFailureTime] = int64(-1)
		h[msg.HeaderCrashSuspect] = "yes"
	case "CR/LF in properties and header values":
		m.CorrelationID = "c\r\nX-Injected: correlation"
		m.Type = "t\nX-Injected: type"
		m.ContentType = "text/plain\r\nX-Injected: content-type"
		h["note"] = "v\r\nX-Injected: value"
		h["bad\r\nX-Injected: name"] = "x"
		h["nul"] = "a\x00b"
	case "a huge header table":
		for j := range 300 {
			h[fmt.Sprintf("h%03d", j)] = strings.Repeat("v", 100)
		}
	case "deep nesting":
		// 30 levels: the AMQP client refuses to read more than 32 (the
		// connection fails, see the README), so this is as deep as a
		// message can be and still be consumed at all.
		var v any = "leaf"
		for d := range 30 {
			if d%2 == 0 {
				v = map[string]any{"n": v}
			} else {
				v = []any{v, int32(d)}
			}
		}
		h["deep"] = v
	case "a large body":
		m.Body = []byte(strings.Repeat("b", 512<<10))
	case "garbage broker headers":
		h[msg.HeaderDeath] = []any{"not a table", int32(7)}
		h[msg.HeaderDeliveryCount] = "many"
		h[msg.HeaderFirstDeathQueue] = int64(1)
	}
	return m, kind
}

// TestFaultHostile: messages carrying out-of-range, wrong-typed and garbage
// Hopper headers, CR/LF in ids and header values, huge header tables, deep
// nesting and large bodies, mixed with plain ones, while the app answers a
// seeded mix of every class. Hopper never exits or recovers from an
// internal error, every message is acked or in the DLQ with a reason
// (lost=0), the plain messages end exactly as scripted, and nothing a
// message smuggles in through CR/LF reaches the app as a header.
func TestFaultHostile(t *testing.T) {
	n := flowSize(t, 360, 3600)
	ids := makeIDs("hostile", n)
	scripts := newScripts(ids, 23, maxAttempts)
	r := begin(t, "hostile", scripts)
	r.step("N=%d, %d kinds of hostile message in turn", n, len(hostileKinds))
	kinds := map[string]string{}
	for i, id := range ids {
		_, kinds[id] = hostileMessage(id, i)
	}
	index := map[string]int{}
	for i, id := range ids {
		index[id] = i
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pubDone := make(chan publishStats, 1)
	go func() {
		pubDone <- publishPacedWith(ctx, t, r.q.work, ids, 5*time.Second, func(id string) *msg.Message {
			m, _ := hostileMessage(id, index[id])
			return m
		})
	}()
	a := r.finish(pubDone)
	a.report(t)
	if n := r.app.injected.Load(); n != 0 {
		t.Errorf("%d requests reached the app with a header smuggled in through CR/LF", n)
	}
	for id, reasons := range a.inDLQ {
		for _, reason := range reasons {
			if reason == "" {
				t.Errorf("%s (%s) in the DLQ without a reason", id, kinds[id])
			}
		}
	}
	// Counters read far out of range make every attempt the last one, so
	// only the other kinds are held to their scripts.
	plain := map[string]*script{}
	for id, s := range scripts {
		if k := kinds[id]; k != "counters at the int64 limit" && k != "counters as out-of-range strings and floats" {
			plain[id] = s
		}
	}
	checkScripts(t, a, plain)
}
