// Package broker is the only package that speaks AMQP (amqp091-go). It owns
// the connections: one for consuming, a separate one for publishing moves, so
// that flow control on publishes never stalls deliveries and acks.
//
// Notification channels (NotifyClose, NotifyCancel, NotifyBlocked, returns)
// are always buffered and always drained: amqp091-go delivers them from the
// connection's reader goroutine and a full one deadlocks the connection.
//
// A delivery belongs to the channel it came on. When that channel dies the
// delivery can no longer be acked: the broker has already returned it to the
// queue, and Hopper never acks it on a new channel.
package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hopper-sidecar/hopper/internal/tlsfiles"
)

// Options configure connections.
type Options struct {
	// URLs are tried in turn on every (re)connect.
	URLs []string
	// UsernameFile and PasswordFile, when set, replace the credentials in
	// every URL (mounted secrets).
	UsernameFile string
	PasswordFile string
	// TLS for amqps:// URLs.
	CAFile, CertFile, KeyFile, ServerName string
	InsecureSkipVerify                    bool
	// Heartbeat is the AMQP heartbeat interval. Default 0: the broker's
	// proposal (60s on RabbitMQ); the config sets 10s.
	Heartbeat time.Duration
	// ConnectTimeout bounds one dial and handshake. Default 10s.
	ConnectTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the jittered exponential backoff.
	// Defaults 500ms and ReconnectMin.
	ReconnectMin, ReconnectMax time.Duration
	// Name labels the connection in the management UI.
	Name string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (o *Options) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.Default()
	}
	return o.Logger
}

// Redact hides the password in an AMQP URL so it can be logged.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparsable url>"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	return u.String()
}

func (o *Options) tlsConfig() (*tls.Config, error) {
	return tlsfiles.Client(tlsfiles.Files{CAFile: o.CAFile, CertFile: o.CertFile, KeyFile: o.KeyFile, ServerName: o.ServerName, InsecureSkipVerify: o.InsecureSkipVerify})
}

func (o *Options) resolve(raw string) (string, error) {
	if o.UsernameFile == "" && o.PasswordFile == "" {
		return raw, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("parse broker url: %w", errors.New(Redact(raw)))
	}
	user, pass := "", ""
	if u.User != nil {
		user = u.User.Username()
		pass, _ = u.User.Password()
	}
	if o.UsernameFile != "" {
		b, err := os.ReadFile(o.UsernameFile)
		if err != nil {
			return "", fmt.Errorf("read username file: %w", err)
		}
		user = strings.TrimSpace(string(b))
	}
	if o.PasswordFile != "" {
		b, err := os.ReadFile(o.PasswordFile)
		if err != nil {
			return "", fmt.Errorf("read password file: %w", err)
		}
		pass = strings.TrimRight(string(b), "\r\n")
	}
	u.User = url.UserPassword(user, pass)
	return u.String(), nil
}

// dialOnce tries every URL once, in turn, starting after the one that
// worked last, and returns the first connection that opens.
func (o *Options) dialOnce(ctx context.Context, start int) (*amqp.Connection, int, error) {
	var errs []error
	tlsCfg, err := o.tlsConfig()
	if err != nil {
		return nil, start, err
	}
	for i := range o.URLs {
		idx := (start + i) % len(o.URLs)
		if ctx.Err() != nil {
			return nil, idx, ctx.Err()
		}
		raw, err := o.resolve(o.URLs[idx])
		if err != nil {
			return nil, idx, err
		}
		props := amqp.NewConnectionProperties()
		props.SetClientConnectionName(o.Name)
		timeout := o.ConnectTimeout
		if timeout <= 0 {
			timeout = 10 * time.Second
		}
		cfg := amqp.Config{
			Heartbeat:       o.Heartbeat,
			Properties:      props,
			TLSClientConfig: tlsCfg,
			Dial: func(network, addr string) (net.Conn, error) {
				d := net.Dialer{Timeout: timeout}
				conn, err := d.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				// The handshake must finish within the timeout too; amqp091
				// clears the deadline once the connection is open.
				if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
					conn.Close()
					return nil, err
				}
				return conn, nil
			},
		}
		conn, err := amqp.DialConfig(raw, cfg)
		if err == nil {
			return conn, idx, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", Redact(o.URLs[idx]), scrub(err, raw)))
	}
	return nil, start, errors.Join(errs...)
}

// scrub keeps a dial error from echoing the URL's password.
func scrub(err error, raw string) error {
	u, perr := url.Parse(raw)
	if perr != nil || u.User == nil {
		return err
	}
	if p, ok := u.User.Password(); ok && p != "" && strings.Contains(err.Error(), p) {
		return errors.New(strings.ReplaceAll(err.Error(), p, "xxxxx"))
	}
	return err
}

// wholeBodies makes the client take each delivery's body, up to
// wholeBodyMax, into one buffer of the size its header announces. With the
// frame size it negotiated, the client starts the buffer at one frame (128
// KiB) and grows it by appending every frame, which allocates about five
// times the body before it is whole: 40 MiB for an 8 MiB message, faster
// than the collector frees it, so a 64 MiB container was killed now and
// then with one message held. The client reads the frame size there and
// when it publishes (where it would send frames larger than the broker
// takes), so only connections that never publish take it: consumers and
// the tools' readers; every publish goes through a Publisher's own
// connection. Frames are still read within the negotiated size.
func wholeBodies(conn *amqp.Connection) { conn.Config.FrameSize = wholeBodyMax }

// wholeBodyMax bounds what a header's announced size can make the client
// set aside before any of the body has arrived: RabbitMQ 4.x's default
// max_message_size. A larger body grows from there as it arrives.
const wholeBodyMax = 16 << 20
