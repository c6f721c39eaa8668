package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/config"
)

// TestConsoleDLQs: every subscription's DLQ once, with the queues that
// dead-letter into it; a partitioned queue's partitions share one DLQ,
// and their messages are replayed through the partitions exchange.
func TestConsoleDLQs(t *testing.T) {
	cfg := config.Default()
	cfg.Subscriptions = []config.Subscription{
		{Queue: config.Queue{Name: "orders"}},
		{Queue: config.Queue{Name: "invoices", Type: "quorum"}},
		{Queue: config.Queue{Name: "shipments"}, Partitions: &config.Partitions{Count: 3}},
	}
	got := consoleDLQs(&cfg)
	var names []string
	for _, d := range got {
		names = append(names, d.Name+"<-"+strings.Join(d.Queues, ","))
	}
	if want := "orders.dlq<-orders invoices.dlq<-invoices shipments.dlq<-shipments"; strings.Join(names, " ") != want {
		t.Fatalf("DLQs = %v, want %s", names, want)
	}
	through := got[2].Through
	if through == nil {
		t.Fatal("no Through with a partitioned subscription")
	}
	if ex, ok := through(config.PartitionQueue("shipments", 2)); !ok || ex != config.PartitionExchange("shipments") {
		t.Errorf("a partition's messages go through %q %v, want %s", ex, ok, config.PartitionExchange("shipments"))
	}
	if _, ok := through("orders"); ok {
		t.Error("an unpartitioned queue's messages go through an exchange")
	}

	one := config.Default()
	one.Queue.Name = "billing"
	if d := consoleDLQs(&one); len(d) != 1 || d[0].Name != "billing.dlq" || d[0].Through != nil {
		t.Errorf("single queue: %+v", d)
	}
}

func TestReadTokens(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "tokens")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := readTokens(write("# who may act\noncall: 0123456789abcdef0123\n\n  fedcba9876543210fedc  \n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Label != "oncall" || got[0].Secret != "0123456789abcdef0123" || got[1].Label != "token of line 4" || got[1].Secret != "fedcba9876543210fedc" {
		t.Errorf("tokens = %+v", got)
	}
	for _, bad := range []string{"", "# only a comment\n", "ops:short\n"} {
		if _, err := readTokens(write(bad)); err == nil {
			t.Errorf("token file %q accepted", bad)
		}
	}
	if _, err := readTokens(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing token file accepted")
	}
	a, _ := newToken()
	b, _ := newToken()
	if len(a) < 40 || a == b {
		t.Errorf("generated tokens %q %q", a, b)
	}
}
