package dlq_test

// The DLQ tools on a quorum DLQ: a quorum queue counts every return of a
// message (nack with requeue, or a channel closing with it unacked) and,
// past its delivery limit, drops it. Every tool must leave the DLQ with
// every message it had, whatever the limit and however often it runs.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
)

// quorumDLQ declares a quorum DLQ under a policy that sets its delivery
// limit to limit, the way an operator's policy would.
func (e *env) quorumDLQ(limit int) string {
	e.t.Helper()
	name := e.Work + ".qdlq"
	e.declare(name, map[string]any{"x-queue-type": "quorum"})
	policy := "dl-" + strconv.FormatInt(seq.Add(1), 10)
	if out, err := e.rb.Ctl("set_policy", "--apply-to", "queues", policy, "^"+regexp.QuoteMeta(name)+"$",
		fmt.Sprintf(`{"delivery-limit":%d}`, limit)); err != nil {
		e.t.Fatalf("set_policy: %v\n%s", err, out)
	}
	e.t.Cleanup(func() { e.rb.Ctl("clear_policy", policy) }) //nolint:errcheck // the node is private to the test run
	return name
}

// drain takes every message of a queue for good (get and ack), so that
// reading the result spends nothing a later look would need.
func (e *env) drain(queue string) []*msg.Message {
	e.t.Helper()
	return e.getAll(queue, true)
}

// exported runs `hopper dlq export --file -` and returns the messages of
// its lines, in queue order.
func (e *env) exported(queue string) []*msg.Message {
	e.t.Helper()
	r := e.ok("export", "--dlq", queue, "--file", "-")
	var out []*msg.Message
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if l == "" {
			continue
		}
		m, err := dlq.UnmarshalLine([]byte(l))
		if err != nil {
			e.t.Fatalf("export line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// sameMessage compares what a copy must keep: body, properties, message
// id and every header but the broker's return counts.
func sameMessage(t *testing.T, want, got *msg.Message) {
	t.Helper()
	norm := func(m *msg.Message) []byte {
		c := m.Clone()
		delete(c.Headers, msg.HeaderDeliveryCount)
		delete(c.Headers, msg.HeaderAcquiredCount)
		// Delivery fields, and the delivery mode every publish sets.
		c.Redelivered, c.Exchange, c.RoutingKey, c.DeliveryMode = false, "", "", 0
		line, err := dlq.MarshalLine(c, "")
		if err != nil {
			t.Fatal(err)
		}
		return line
	}
	if a, b := norm(want), norm(got); !bytes.Equal(a, b) {
		t.Errorf("message %s changed:\nwant %s\ngot  %s", want.MessageID, a, b)
	}
}

func TestCLIQuorumDLQToolsLoseNothingUnderDeliveryLimit(t *testing.T) {
	e := newEnv(t)
	qdlq := e.quorumDLQ(2)
	missing := "no-such-queue-" + e.Work
	var want []*msg.Message
	for i := range 6 {
		m := deadMsg("q"+strconv.Itoa(i), e.Work, "k."+strconv.Itoa(i), "max-attempts", 500+i, time.Duration(i+1)*time.Minute)
		m.Body = []byte(fmt.Sprintf(`{"n":%d,"pad":%q}`, i, strings.Repeat("x", i*10)))
		m.Headers["tenant"] = "t" + strconv.Itoa(i)
		m.Headers["n"] = int64(i)
		m.Headers["nested"] = map[string]any{"i": int32(i), "list": []any{"a", int16(i)}}
		m.CorrelationID = "corr-" + strconv.Itoa(i)
		switch i {
		case 4:
			// Its original queue is gone: every replay fails to move it.
			m.Headers[msg.HeaderOriginalQueue] = missing
		case 5:
			m.Headers[msg.HeaderReplayCount] = int32(3)
		}
		want = append(want, m)
	}
	e.fill(qdlq, want...)
	wantIDs := ids(want)

	for round := range 3 {
		e.ok("stats", "--dlq", qdlq)
		e.ok("peek", "--dlq", qdlq, "-n", "2")
		e.ok("export", "--dlq", qdlq, "--file", filepath.Join(t.TempDir(), "x.jsonl"))
		if res, r := e.replayJSON("--dlq", qdlq, "--dry-run", "--max-replays", "2"); r.code != 0 || res.WouldRecover != 5 || res.Kept != 1 {
			t.Fatalf("round %d: dry run: exit %d %+v\n%s", round, r.code, res, r.stderr)
		}
		// A filter that selects nothing, a replay cap that keeps one.
		if res, r := e.replayJSON("--dlq", qdlq, "--original-queue", "elsewhere"); r.code != 0 || res.Skipped != 6 {
			t.Fatalf("round %d: filtered replay: exit %d %+v\n%s", round, r.code, res, r.stderr)
		}
		// Only the message whose destination is missing, and the one past
		// the replay cap: one fails, one is kept, both stay.
		if res, r := e.replayJSON("--dlq", qdlq, "--max-replays", "2", "--header", "tenant=t4"); r.code == 0 || res.Failed != 1 || res.Skipped != 5 {
			t.Fatalf("round %d: replay to a missing queue: exit %d %+v\n%s", round, r.code, res, r.stderr)
		}
		if res, r := e.replayJSON("--dlq", qdlq, "--max-replays", "2", "--header", "tenant=t5"); r.code != 0 || res.Kept != 1 || res.Skipped != 5 {
			t.Fatalf("round %d: replay past the cap: exit %d %+v\n%s", round, r.code, res, r.stderr)
		}
		// Everything is still there, in order (the failed replay moved its
		// one message alone, so the order holds).
		if got := ids(e.exported(qdlq)); !slices.Equal(got, wantIDs) {
			t.Fatalf("round %d: DLQ holds %v, want %v", round, got, wantIDs)
		}
	}
	if n := e.depth(e.Work); n != 0 {
		t.Errorf("a browsing tool published %d message(s) to the work queue", n)
	}
	got := e.drain(qdlq)
	if !slices.Equal(ids(got), wantIDs) {
		t.Fatalf("DLQ holds %v, want %v", ids(got), wantIDs)
	}
	for i := range got {
		sameMessage(t, want[i], got[i])
		if n, ok := got[i].Int(msg.HeaderDeliveryCount); ok && n > 0 {
			t.Errorf("message %s: delivery count %d spent", got[i].MessageID, n)
		}
	}
}

// A real replay of a quorum DLQ moves what it can and leaves the rest, with
// its delivery count unspent, in order.
func TestCLIQuorumDLQReplayMovesSome(t *testing.T) {
	e := newEnv(t)
	qdlq := e.quorumDLQ(1)
	var all []*msg.Message
	for i := range 8 {
		m := deadMsg("r"+strconv.Itoa(i), e.Work, "k", "max-attempts", 500, time.Hour)
		if i%2 == 1 {
			m.Headers[msg.HeaderDeadLetterReason] = "expired"
		}
		all = append(all, m)
	}
	e.fill(qdlq, all...)
	for range 2 {
		if res, r := e.replayJSON("--dlq", qdlq, "--reason", "expired", "--limit", "2"); r.code != 0 || res.Recovered != 2 {
			t.Fatalf("exit %d %+v\n%s", r.code, res, r.stderr)
		}
	}
	// Moves run in parallel: their order in the work queue is not kept.
	moved := ids(e.drain(e.Work))
	slices.Sort(moved)
	if want := []string{"r1", "r3", "r5", "r7"}; !slices.Equal(moved, want) {
		t.Errorf("work queue %v, want %v", moved, want)
	}
	got := e.drain(qdlq)
	if want := []string{"r0", "r2", "r4", "r6"}; !slices.Equal(ids(got), want) {
		t.Fatalf("DLQ %v, want %v", ids(got), want)
	}
	for i, m := range got {
		sameMessage(t, all[2*i], m)
	}
}

// Messages whose headers are legal AMQP but nothing Hopper wrote — the
// broker's and Hopper's own headers of the wrong types, a table of
// thousands of fields, deep nesting, a header near the frame size — go
// through every tool without crashing one, and stay.
func TestCLIOddHeadersNeverCrashTools(t *testing.T) {
	e := newEnv(t)
	big := map[string]any{}
	for i := range 3000 {
		big["k"+strconv.Itoa(i)] = int32(i)
	}
	deep := map[string]any{"leaf": "x"}
	for i := range 14 {
		if i%2 == 0 {
			deep = map[string]any{"d": deep}
		} else {
			deep = map[string]any{"a": []any{deep}}
		}
	}
	odd := []map[string]any{
		{msg.HeaderDeath: "not a list", msg.HeaderOriginalQueue: int32(7), msg.HeaderFinalStatusCode: map[string]any{"x": "y"}},
		{msg.HeaderDeath: []any{"a", int32(1), nil}, msg.HeaderDeadLetterTime: "garbage", msg.HeaderReplayCount: "many"},
		{msg.HeaderDeath: []any{map[string]any{"queue": int64(1), "time": "x", "routing-keys": "k"}}, msg.HeaderDeadLetterReason: []byte{0xff, 0}},
		{"big": big, msg.HeaderRetryCount: float64(1e300), msg.HeaderDeliveryCount: "x"},
		{"deep": deep, "long": strings.Repeat("z", 60_000)},
		{"": nil, "dec": msg.Decimal{Scale: 255, Value: -1}, "ts": time.Unix(-1<<40, 0)},
	}
	for _, typ := range []string{"classic", "quorum"} {
		t.Run(typ, func(t *testing.T) {
			q := e.Work + ".odd." + typ
			e.declare(q, map[string]any{"x-queue-type": typ})
			var want []*msg.Message
			for i, h := range odd {
				want = append(want, &msg.Message{MessageID: "odd" + strconv.Itoa(i), Headers: h, Body: []byte{byte(i), 0xff}})
			}
			e.fill(q, want...)
			for range 2 {
				e.ok("stats", "--dlq", q)
				e.ok("stats", "--dlq", q, "-o", "json")
				e.ok("peek", "--dlq", q, "-n", "10")
				e.ok("peek", "--dlq", q, "-n", "10", "-o", "json")
				e.run("export", "--dlq", q, "--file", filepath.Join(t.TempDir(), "x.jsonl"))
				if res, r := e.replayJSON("--dlq", q, "--dry-run"); res.Taken != len(odd) {
					t.Fatalf("dry run: exit %d %+v\n%s", r.code, res, r.stderr)
				}
				// Every destination is unknown or missing: nothing moves.
				if res, r := e.replayJSON("--dlq", q); res.Taken != len(odd) || res.Recovered != 0 {
					t.Fatalf("replay: exit %d %+v\n%s", r.code, res, r.stderr)
				}
				e.settled(q)
			}
			got := e.drain(q)
			if !slices.Equal(ids(got), ids(want)) {
				t.Fatalf("%s holds %v, want %v", q, ids(got), ids(want))
			}
			for i := range got {
				if !bytes.Equal(got[i].Body, want[i].Body) || len(got[i].Headers) < len(want[i].Headers)-1 {
					t.Errorf("message %s changed: %d headers", got[i].MessageID, len(got[i].Headers))
				}
			}
		})
	}
}

// A user who may read the DLQ but not publish cannot rotate: the tools
// refuse before reading anything rather than return what they read, and
// every message keeps its delivery count. Told the DLQ has no delivery
// limit, stats reads it without publishing, returning what it read (free
// on RabbitMQ 4.x, one delivery each on 3.x).
func TestCLIQuorumDLQWithoutPublishPermissionRefuses(t *testing.T) {
	e := newEnv(t)
	qdlq := e.quorumDLQ(1)
	e.fill(qdlq, deadMsg("p0", e.Work, "k", "max-attempts", 500, time.Hour), deadMsg("p1", e.Work, "k", "max-attempts", 500, time.Hour))
	user := "reader" + strconv.FormatInt(seq.Add(1), 10)
	for _, args := range [][]string{
		{"add_user", user, "secret"},
		{"set_permissions", user, ".*", "^$", ".*"}, // configure, write, read
	} {
		if out, err := e.rb.Ctl(args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	url := strings.Replace(e.rb.URL(), "guest:guest@", user+":secret@", 1)
	for _, args := range [][]string{
		{"stats", "--dlq", qdlq},
		{"peek", "--dlq", qdlq},
		{"export", "--dlq", qdlq, "--file", "-"},
		{"replay", "--dlq", qdlq, "--dry-run"},
	} {
		cmd := e.command(args...)
		cmd.Args[len(cmd.Args)-3] = url // --broker-url's value
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "delivery limit") || !strings.Contains(string(out), "quorum") {
			t.Errorf("%v as a reader: %v\n%s", args, err, out)
		}
	}
	// A DLQ said to have no delivery limit is read without publishing:
	// nothing is rotated.
	cmd := e.command("stats", "--dlq", qdlq, "--delivery-limit", "none")
	cmd.Args[len(cmd.Args)-3] = url
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "depth") {
		t.Errorf("stats --delivery-limit none as a reader: %v\n%s", err, out)
	}
	e.settled(qdlq)
	got := e.drain(qdlq)
	if !slices.Equal(ids(got), []string{"p0", "p1"}) {
		t.Fatalf("DLQ holds %v", ids(got))
	}
	spent := int64(0)
	if e.rb.Series() < 4 {
		spent = 1
	}
	for _, m := range got {
		if n, _ := m.Int(msg.HeaderDeliveryCount); n != spent {
			t.Errorf("RabbitMQ %s: message %s: delivery count %d, want %d", e.rb.Version(), m.MessageID, n, spent)
		}
	}
}

// A header table the client cannot decode ends the connection: every tool
// stops with an error that says so, and the message stays.
func TestCLIUndecodableMessageStopsWithClearError(t *testing.T) {
	e := newEnv(t)
	deep := map[string]any{"leaf": "x"}
	for range 40 {
		deep = map[string]any{"d": deep}
	}
	e.fill(e.DLQ, &msg.Message{MessageID: "deep", Headers: map[string]any{"deep": deep}, Body: []byte("b")})
	for _, args := range [][]string{
		{"stats", "--dlq", e.DLQ},
		{"peek", "--dlq", e.DLQ},
		{"replay", "--dlq", e.DLQ},
	} {
		r := e.run(args...)
		if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "could not be decoded by the AMQP client") {
			t.Errorf("%v: exit %d\n%s\n%s", args, r.code, r.stdout, r.stderr)
		}
	}
	e.settled(e.DLQ)
	if n := e.depth(e.DLQ); n != 1 {
		t.Errorf("DLQ holds %d, want the message", n)
	}
}

// More messages than the rotation keeps in flight: every pass ends with
// each message once, in order — no original left beside its copy.
func TestCLIQuorumDLQManyMessagesNoDuplicates(t *testing.T) {
	e := newEnv(t)
	qdlq := e.quorumDLQ(3)
	var want []*msg.Message
	for i := range 150 {
		want = append(want, deadMsg("n"+strconv.Itoa(i), e.Work, "k", "max-attempts", 500, time.Hour))
	}
	e.fill(qdlq, want...)
	for range 2 {
		e.ok("stats", "--dlq", qdlq)
		e.ok("peek", "--dlq", qdlq, "-n", "3")
		if res, r := e.replayJSON("--dlq", qdlq, "--dry-run"); r.code != 0 || res.WouldRecover != 150 {
			t.Fatalf("dry run: exit %d %+v", r.code, res)
		}
		if res, r := e.replayJSON("--dlq", qdlq, "--reason", "expired"); r.code != 0 || res.Skipped != 150 {
			t.Fatalf("filtered replay: exit %d %+v", r.code, res)
		}
	}
	if got := ids(e.drain(qdlq)); !slices.Equal(got, ids(want)) {
		t.Fatalf("DLQ holds %d messages %v…, want %d in order", len(got), got[:min(len(got), 5)], len(want))
	}
}

// export --remove on a quorum DLQ takes out what it wrote and rotates what
// the filter skips, which keep their order and their delivery count.
func TestCLIQuorumDLQExportRemove(t *testing.T) {
	e := newEnv(t)
	qdlq := e.quorumDLQ(1)
	var all []*msg.Message
	for i := range 40 {
		reason := "max-attempts"
		if i%4 == 0 {
			reason = "expired"
		}
		all = append(all, deadMsg("x"+strconv.Itoa(i), e.Work, "k", reason, 500, time.Hour))
	}
	e.fill(qdlq, all...)
	file := filepath.Join(t.TempDir(), "out.jsonl")
	r := e.ok("export", "--dlq", qdlq, "--file", file, "--remove", "--reason", "expired", "--sync-every", "3")
	if !strings.Contains(r.stdout, "exported 10 of 40") || !strings.Contains(r.stdout, "removed 10, skipped 30") {
		t.Errorf("export: %s", r.stdout)
	}
	var want []string
	for _, m := range all {
		if msg.DeadLetterReason(m) != "expired" {
			want = append(want, m.MessageID)
		}
	}
	got := e.drain(qdlq)
	if !slices.Equal(ids(got), want) {
		t.Fatalf("DLQ holds %v, want %v", ids(got), want)
	}
	for _, m := range got {
		if n, _ := m.Int(msg.HeaderDeliveryCount); n != 0 {
			t.Errorf("message %s: delivery count %d", m.MessageID, n)
		}
	}
}

// SIGKILL mid-rotation loses nothing: a message is in the DLQ as its
// original, its copy, or (for the copies in flight) both.
func TestCLIQuorumDLQStatsSIGKILLLosesNothing(t *testing.T) {
	e := newEnv(t)
	q := e.Work + ".qdlq"
	e.declare(q, map[string]any{"x-queue-type": "quorum"})
	const n = 20000
	e.fillFast(q, "s", n, bytes.Repeat([]byte("x"), 64))
	cmd := e.command("stats", "--dlq", q)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The broker's own counts of a quorum queue lag by seconds, longer
	// than a pass may take; its consumer count is current (a pass reads
	// through a consumer, and a quorum queue counts each message taken with
	// basic.get and not settled as one too).
	in, err := broker.OpenInspector(context.Background(), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	waitfor.Until(t, 60*time.Second, "the rotation under way", func() bool {
		n, err := in.Consumers(q)
		return err == nil && n > 0
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait() //nolint:errcheck // killed
	e.settled(q)
	seen := map[string]int{}
	for _, m := range e.drain(q) {
		seen[m.MessageID]++
	}
	dups := 0
	for i := range n {
		switch c := seen["s"+strconv.Itoa(i)]; {
		case c == 0:
			t.Errorf("message s%d lost", i)
		case c > 1:
			dups += c - 1
		}
	}
	t.Logf("after SIGKILL: %d messages, %d in twice", len(seen), dups)
	// A pass reads through a consumer whose acks are coalesced, up to a
	// quarter of its window of 128 at once: an original whose copy is
	// confirmed and whose ack was still waiting for its batch comes back
	// beside the copy.
	if dups > 16+32 {
		t.Errorf("%d duplicates, want at most the 16 copies in flight and the 32 acks being coalesced", dups)
	}
}

// Every tool SIGKILLed mid-pass over a quorum DLQ under a delivery-limit
// policy of 2, not told the limit (so every message it hands back is
// rotated; TestCLIQuorumDLQKilledReadsLeaveNoCopies has the tools told
// it), then run to the end: each kill hands back what the pass held
// (one return counted for each), the next full pass rotates every message
// into a fresh copy whose count is 0, so no message ever reaches the limit
// and every one is still there. On RabbitMQ 4.x a tool that took a quorum
// DLQ for a classic one (and returned what it read) spent a delivery of
// every message each run and emptied the DLQ by the third.
func TestCLIQuorumDLQToolsKilledUnderDeliveryLimit(t *testing.T) {
	e := newEnv(t)
	qdlq := e.quorumDLQ(2)
	const n = 2000
	e.fillFast(qdlq, "k", n, bytes.Repeat([]byte("x"), 128))
	in, err := broker.OpenInspector(context.Background(), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	file := filepath.Join(t.TempDir(), "x.jsonl")
	for _, args := range [][]string{
		{"stats", "--dlq", qdlq},
		{"peek", "--dlq", qdlq, "-n", strconv.Itoa(n)},
		{"export", "--dlq", qdlq, "--file", file, "--overwrite"},
		{"export", "--dlq", qdlq, "--file", file, "--overwrite", "--remove", "--header", "tenant=none"},
		{"replay", "--dlq", qdlq, "--dry-run"},
		{"replay", "--dlq", qdlq, "--original-queue", "elsewhere"},
	} {
		cmd := e.command(args...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitfor.Until(t, 60*time.Second, args[0]+" reading the DLQ", func() bool {
			c, err := in.Consumers(qdlq)
			return err == nil && c > 0
		})
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait() //nolint:errcheck // killed
		e.settled(qdlq)
		waitfor.Until(t, 60*time.Second, "the killed tool's consumer gone", func() bool {
			c, err := in.Consumers(qdlq)
			return err == nil && c == 0
		})
		e.ok(args...)
	}
	seen := map[string]int{}
	for _, m := range e.drain(qdlq) {
		seen[m.MessageID]++
		if c, _ := m.Int(msg.HeaderDeliveryCount); c > 0 {
			t.Errorf("%s has delivery count %d after a full pass", m.MessageID, c)
		}
	}
	dups := 0
	for i := range n {
		switch c := seen["k"+strconv.Itoa(i)]; {
		case c == 0:
			t.Errorf("message k%d lost", i)
		case c > 1:
			dups += c - 1
		}
	}
	t.Logf("RabbitMQ %s: %d messages after 6 kills and 6 full passes, %d in twice", e.rb.Version(), len(seen), dups)
}

// With --delivery-limit the read-only tools hand back by returning every
// message one more return cannot bring to the limit, and rotate the rest.
// A tool that ends normally returns with a basic.nack, which RabbitMQ 4.x
// does not count: there the messages keep a count of 0 however often they
// are read. 3.x counts each such return, and rotates each message once its
// count reaches the threshold (limit − 1), which starts its copy at 0
// again. Either way nothing is lost, nothing doubled, the order kept.
func TestCLIQuorumDLQDeliveryLimitReturnsInstead(t *testing.T) {
	e := newEnv(t)
	const limit, n = 3, 300
	qdlq := e.quorumDLQ(limit)
	var want []*msg.Message
	for i := range n {
		want = append(want, deadMsg("l"+strconv.Itoa(i), e.Work, "k", "max-attempts", 500, time.Hour))
	}
	e.fill(qdlq, want...)
	dl := []string{"--delivery-limit", strconv.Itoa(limit)}
	file := filepath.Join(t.TempDir(), "x.jsonl")
	runs := [][]string{
		{"stats", "--dlq", qdlq},
		{"peek", "--dlq", qdlq, "-n", "5"},
		{"export", "--dlq", qdlq, "--file", file, "--overwrite"},
		{"stats", "--dlq", qdlq, "-o", "json"},
		{"export", "--dlq", qdlq, "--file", file, "--overwrite", "--remove", "--header", "tenant=none"},
		{"replay", "--dlq", qdlq, "--dry-run"},
		{"replay", "--dlq", qdlq, "--original-queue", "elsewhere"},
	}
	for _, args := range runs {
		e.ok(append(args, dl...)...)
		e.settled(qdlq)
	}
	if n := e.depth(e.Work); n != 0 {
		t.Errorf("a tool published %d message(s) to the work queue", n)
	}
	four := e.rb.Series() >= 4
	got := e.drain(qdlq)
	if !slices.Equal(ids(got), ids(want)) {
		t.Fatalf("DLQ holds %d messages %v…, want %d in order", len(got), ids(got)[:min(len(got), 5)], n)
	}
	for i, m := range got {
		sameMessage(t, want[i], m)
		c, _ := m.Int(msg.HeaderDeliveryCount)
		switch {
		case c > limit-1:
			t.Errorf("%s: x-delivery-count %d: returned at the threshold", m.MessageID, c)
		case four && c != 0:
			t.Errorf("RabbitMQ %s: %s: x-delivery-count %d, want 0 (a basic.nack is not counted)", e.rb.Version(), m.MessageID, c)
		}
	}
}

// The read-only tools SIGKILLed mid-pass over a quorum DLQ whose delivery
// limit they are told: each kill leaves the DLQ with exactly the messages
// it had — no copy beside an original, none lost — since every message a
// pass held comes back from the kill itself, one delivery counted for it.
// Returns go back to the head of a quorum queue, so the second killed pass
// takes the first one's messages again, and brings some to
// x-delivery-count 2, one short of the limit of 3. The whole pass after
// the kills rotates those, its copies starting again at 0, and returns the
// rest. No message ever reaches the limit, and the broker drops none.
// (Without --delivery-limit, as before, every kill leaves the copies in
// flight beside their originals.)
func TestCLIQuorumDLQKilledReadsLeaveNoCopies(t *testing.T) {
	e := newEnv(t)
	const limit, n = 3, 10000
	qdlq := e.quorumDLQ(limit)
	e.fillFast(qdlq, "c", n, bytes.Repeat([]byte("x"), 64))
	in, err := broker.OpenInspector(context.Background(), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	dl := []string{"--dlq", qdlq, "--delivery-limit", strconv.Itoa(limit)}
	for _, args := range [][]string{
		{"export", "--file", filepath.Join(t.TempDir(), "x.jsonl")},
		{"replay", "--dry-run"},
	} {
		cmd := e.command(append(args, dl...)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitfor.Until(t, 60*time.Second, args[0]+" reading the DLQ", func() bool {
			c, err := in.Consumers(qdlq)
			return err == nil && c > 0
		})
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait() //nolint:errcheck // killed
		waitfor.Until(t, 60*time.Second, "the killed tool's messages back", func() bool {
			c, err := in.Consumers(qdlq)
			return err == nil && c == 0
		})
		if d, err := in.Depth(qdlq); err != nil || d != n {
			t.Fatalf("after %s was killed the DLQ holds %d messages (err %v), want exactly %d", args[0], d, err, n)
		}
	}
	var st dlq.Stats
	r := e.ok(append([]string{"stats", "-o", "json"}, dl...)...)
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("stats: %v\n%s", err, r.stdout)
	}
	if st.Scanned != n || st.MaxDeliveryCount != limit-1 {
		t.Errorf("RabbitMQ %s: the pass after two kills scanned %d, max x-delivery-count %d; want %d and %d (both kills counted)",
			e.rb.Version(), st.Scanned, st.MaxDeliveryCount, n, limit-1)
	}
	e.settled(qdlq)
	seen := map[string]int{}
	most := int64(0)
	for _, m := range e.drain(qdlq) {
		seen[m.MessageID]++
		c, _ := m.Int(msg.HeaderDeliveryCount)
		most = max(most, c)
	}
	for i := range n {
		if c := seen["c"+strconv.Itoa(i)]; c != 1 {
			t.Errorf("message c%d is in the DLQ %d times", i, c)
		}
	}
	// The whole pass returned what it held: free on RabbitMQ 4.x, one
	// delivery on 3.x; the messages at the threshold were rotated.
	want := int64(limit - 2)
	if e.rb.Series() < 4 {
		want = limit - 1
	}
	if most > want {
		t.Errorf("RabbitMQ %s: x-delivery-count up to %d after the whole pass, want at most %d", e.rb.Version(), most, want)
	}
}
