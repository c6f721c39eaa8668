package msg

import (
	"regexp"
	"testing"
)

// TestEnsureIDUniquePerMessage: two messages alike in every byte get ids
// of their own; a message's id is never replaced.
func TestEnsureIDUniquePerMessage(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	a := &Message{RoutingKey: "orders", Body: []byte(`{"order":1}`)}
	b := &Message{RoutingKey: "orders", Body: []byte(`{"order":1}`)}
	if !EnsureID(a) || !EnsureID(b) {
		t.Fatal("a message without an id was not given one")
	}
	if a.MessageID == b.MessageID {
		t.Errorf("two messages got the same id %q", a.MessageID)
	}
	for _, m := range []*Message{a, b} {
		if !uuid.MatchString(m.MessageID) {
			t.Errorf("id %q is not a version 4 UUID", m.MessageID)
		}
	}
	id := a.MessageID
	if EnsureID(a) || a.MessageID != id {
		t.Errorf("a message's id changed from %q to %q", id, a.MessageID)
	}
	c := &Message{MessageID: "order-42"}
	if EnsureID(c) || c.MessageID != "order-42" {
		t.Errorf("the publisher's id became %q", c.MessageID)
	}
}
