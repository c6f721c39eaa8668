package streamsrc

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
)

// A stream subscription on amqps:// reads the broker's TLS stream listener
// with the CA of broker.tls, and refuses a listener whose certificate that
// CA did not sign.
func TestSourceReadsOverTLS(t *testing.T) {
	certs, err := testbroker.WriteCerts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	files, sslConf, err := certs.Node()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	b, err := testbroker.Start(testbroker.Options{Quiet: true, Streams: true, Files: files, ExtraConfig: sslConf +
		fmt.Sprintf("stream.listeners.ssl.1 = 127.0.0.1:%d\nstream.advertised_tls_port = %d\n", tlsPort, tlsPort)})
	if err != nil {
		t.Fatalf("start a broker with a TLS stream listener: %v", err)
	}
	t.Cleanup(func() { b.Stop() })

	c := config.Default()
	c.Broker.URLs = []string{fmt.Sprintf("amqps://guest:guest@localhost:%d/", b.Port())}
	c.Broker.TLS.CAFile = certs.CA
	c.Queue.Name, c.Queue.Type = "s.tls", "stream"
	c.Queue.Stream.Name, c.Queue.Stream.Consumer, c.Queue.Stream.Port = "s.tls", "c1", tlsPort
	o, err := ConfigOptions(&c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.TLS == nil || o.TLS.ServerName != "localhost" || o.TLS.RootCAs == nil {
		t.Fatalf("TLS options %+v: want the CA and the URL's host as the name checked", o.TLS)
	}
	o.Declare, o.StoreEvery = true, 50*time.Millisecond

	src := New(o)
	var mu sync.Mutex
	var got []*Delivery
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func(d *Delivery) { mu.Lock(); got = append(got, d); mu.Unlock() }) }()
	waitfor.Until(t, 20*time.Second, "the source subscribes over TLS", src.Connected)
	plain := o
	plain.Port, plain.TLS = b.StreamPort(), nil
	publish(t, plain, 0, 5)
	waitfor.Until(t, 10*time.Second, "5 deliveries over TLS", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 5 })
	for i, d := range got {
		if id := d.Message().MessageID; id != fmt.Sprintf("m%d", i) {
			t.Fatalf("delivery %d is %s", i, id)
		}
		if err := d.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	// Another CA: the handshake fails, and the error says so.
	other, err := testbroker.WriteCerts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c.Broker.TLS.CAFile = other.CA
	bad, err := ConfigOptions(&c, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = StoredOffset(bad)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("reading with a CA that did not sign the listener's certificate: %v, want a certificate error", err)
	}
}
