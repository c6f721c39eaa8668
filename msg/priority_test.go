package msg_test

import (
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// TestCopiesKeepPriority: on a priority work queue a message retried
// through a tier, requeued, given back or dead-lettered must come back with
// the priority it was published with, or a retried urgent message would
// queue behind every ordinary one. Every kind of copy keeps it, with the
// other properties the app may read.
func TestCopiesKeepPriority(t *testing.T) {
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	orig := &msg.Message{
		RoutingKey: "orders", MessageID: "m1", Body: []byte("b"), Priority: 9,
		ContentType: "application/json", CorrelationID: "c1", Type: "order.created", AppID: "shop",
		Headers: map[string]any{},
	}
	in := msg.Read(orig, "orders", "", now)
	dlq := msg.DLQCopy(orig, in, msg.DeadLetter{Reason: "max-attempts", Status: 503, Retries: 3, Now: now})
	for name, cp := range map[string]*msg.Message{
		"retry":     msg.RetryCopy(orig, in, 1, 503, now),
		"requeue":   msg.RequeueCopy(orig, in, 1),
		"give-back": msg.ReturnCopy(orig, in),
		"dlq":       dlq,
		"keep":      msg.KeepCopy(orig),
		"replay":    msg.ReplayCopy(dlq, "orders.dlq", now, false, false),
	} {
		if cp.Priority != 9 {
			t.Errorf("%s copy has priority %d, want 9", name, cp.Priority)
		}
		if cp.ContentType != orig.ContentType || cp.CorrelationID != orig.CorrelationID || cp.Type != orig.Type || cp.AppID != orig.AppID {
			t.Errorf("%s copy lost a property: %+v", name, cp)
		}
	}
}
