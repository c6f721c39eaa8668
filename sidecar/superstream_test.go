package sidecar_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/sidecar"
	"github.com/hopper-sidecar/hopper/streamsrc"
)

// refused runs a Hopper with cfg on sb, which cannot do what cfg asks:
// Run must end within a minute with an error that is want and names
// release.
func refused(t *testing.T, sb *testbroker.Broker, cfg config.Config, want error, release string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- sidecar.New(&cfg, testLogger(t)).Run(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, want) || !strings.Contains(err.Error(), release) {
			t.Fatalf("Run on RabbitMQ %s: %v, want %v naming %s", sb.Version(), err, want, release)
		}
		t.Logf("RabbitMQ %s: %v", sb.Version(), err)
	case <-time.After(time.Minute):
		t.Fatalf("Run on RabbitMQ %s went on with what the broker cannot do", sb.Version())
	}
}

// activePartitions are the partitions of the super stream that r reads,
// by its hopper_stream_partition_active gauges.
func activePartitions(r *running, queue string, parts []string) []string {
	var out []string
	for _, p := range parts {
		if v, ok := r.sc.Metrics().Value("hopper_stream_partition_active", map[string]string{"queue": queue, "partition": p}); ok && v == 1 {
			out = append(out, p)
		}
	}
	return out
}

// Two Hoppers read one super stream under one consumer name as single
// active consumers: the broker gives each partition to one of them, each
// message reaches the app once, from the Hopper that reads its partition,
// and the messages of one key (routed to one partition) in order. When
// one stops, the other takes its partitions over after the offsets stored
// and delivers everything published since: nothing skipped.
func TestStreamSuperStreamShared(t *testing.T) {
	sb := testbroker.MustStartWith(t, testbroker.Options{Quiet: true, Streams: true})
	app1, app2 := newScriptApp(t), newScriptApp(t)
	cfg := streamConfig(t, sb, app1.URL, "st.super")
	yes := true
	cfg.Queue.Stream.SingleActiveConsumer = &yes
	cfg.Queue.Stream.SuperStream = true
	cfg.Queue.Stream.Partitions = 3
	cfg.Consumer.OrderingKey = "routingKey"
	cfg.Admin.Listen = "127.0.0.1:0"
	if sb.Series() < 4 {
		// RabbitMQ 3.10 has no super streams: Hopper exits saying so,
		// rather than trying again for ever.
		refused(t, sb, cfg, streamsrc.ErrNoSuperStream, "3.13")
		return
	}
	sub := "st.super.app"
	parts := []string{"st.super-0", "st.super-1", "st.super-2"}
	r1 := start(t, cfg)
	waitfor.Until(t, 20*time.Second, "the first Hopper reads every partition", func() bool {
		return len(activePartitions(r1, sub, parts)) == 3
	})
	cfg2 := cfg
	cfg2.App.URL = app2.URL
	r2 := start(t, cfg2)
	waitfor.Until(t, 30*time.Second, "the broker shares the partitions between the two", func() bool {
		a, b := activePartitions(r1, sub, parts), activePartitions(r2, sub, parts)
		return len(a) > 0 && len(b) > 0 && len(a)+len(b) == 3
	})
	own1, own2 := activePartitions(r1, sub, parts), activePartitions(r2, sub, parts)
	for _, p := range own1 {
		if slices.Contains(own2, p) {
			t.Fatalf("%s read by both Hoppers", p)
		}
	}
	// The super stream's exchange routes by key: "0" to st.super-0, and
	// so on; the key is the ordering key.
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			r1.publish(fmt.Sprintf("m%d", i), func(m *msg.Message) { m.Exchange, m.RoutingKey = "st.super", strconv.Itoa(i%3) })
		}
	}
	delivered := func(from, to int) func() bool {
		return func() bool {
			for i := from; i < to; i++ {
				if len(app1.callsFor(fmt.Sprintf("m%d", i)))+len(app2.callsFor(fmt.Sprintf("m%d", i))) == 0 {
					return false
				}
			}
			return true
		}
	}
	const n = 60
	publish(0, n)
	waitfor.Until(t, 30*time.Second, "every message delivered", delivered(0, n))
	for i := range n {
		id := fmt.Sprintf("m%d", i)
		c1, c2 := app1.callsFor(id), app2.callsFor(id)
		if len(c1)+len(c2) != 1 {
			t.Fatalf("%s delivered %d times by the first Hopper and %d by the second", id, len(c1), len(c2))
		}
		part := "st.super-" + strconv.Itoa(i%3)
		calls, own := c1, own1
		if len(c2) == 1 {
			calls, own = c2, own2
		}
		if got := calls[0].Header.Get("Hopper-Header-X-Stream"); got != part || !slices.Contains(own, part) {
			t.Fatalf("%s from %s, delivered by the Hopper reading %v", id, got, own)
		}
	}
	inOrder := func(a *scriptApp, key string) {
		t.Helper()
		var prev int64 = -1
		for _, id := range a.order(func(c call) bool { return c.RoutingKey == key }) {
			i, _ := strconv.ParseInt(strings.TrimPrefix(id, "m"), 10, 64)
			if i < prev {
				t.Fatalf("key %s: %s after m%d", key, id, prev)
			}
			prev = i
		}
	}
	for _, k := range []string{"0", "1", "2"} {
		inOrder(app1, k)
		inOrder(app2, k)
	}
	// Every pod reports every partition's lag: 0 once all is stored.
	waitfor.Until(t, 20*time.Second, "the lag gauges at 0 on both", func() bool {
		for _, r := range []*running{r1, r2} {
			lag, ok := r.sc.Metrics().Value("hopper_stream_lag_messages", map[string]string{"queue": sub})
			if !ok || lag != 0 {
				return false
			}
		}
		return true
	})
	if _, body := readyz(t, r2.sc); !strings.Contains(body, "super stream st.super as app: active on "+strings.Join(own2, ", ")) {
		t.Errorf("/readyz of the second Hopper does not name its partitions %v:\n%s", own2, body)
	}

	// The first stops: the second takes its partitions over and delivers
	// everything published after.
	if err := r1.shutdown(); err != nil {
		t.Fatal(err)
	}
	waitfor.Until(t, 30*time.Second, "the second Hopper reads every partition", func() bool {
		return len(activePartitions(r2, sub, parts)) == 3
	})
	for i := n; i < 2*n; i++ {
		r2.publish(fmt.Sprintf("m%d", i), func(m *msg.Message) { m.Exchange, m.RoutingKey = "st.super", strconv.Itoa(i%3) })
	}
	waitfor.Until(t, 30*time.Second, "every later message delivered by the second", func() bool {
		for i := n; i < 2*n; i++ {
			if len(app2.callsFor(fmt.Sprintf("m%d", i))) == 0 {
				return false
			}
		}
		return true
	})
	for _, k := range []string{"0", "1", "2"} {
		inOrder(app2, k)
	}
	// What the first had settled and stored is not read again.
	again := 0
	for i := range n {
		if len(app1.callsFor(fmt.Sprintf("m%d", i))) == 1 && len(app2.callsFor(fmt.Sprintf("m%d", i))) > 0 {
			again++
		}
	}
	if again != 0 {
		t.Errorf("%d messages the first Hopper settled and stored were delivered again", again)
	}
}
