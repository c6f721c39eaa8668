package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hopper-sidecar/hopper/internal/backoff"
	"github.com/hopper-sidecar/hopper/internal/redact"
)

// Ready checks whether the app can take messages: a GET on its health path
// answering 2xx, or, without a health path, a TCP connect to its address.
//
// The health URL keeps the app URL's user info, so an app that wants its
// basic-auth credentials on every path gets them on its health path too;
// its errors, logged and shown on /readyz, name the URL without them.
type Ready struct {
	Addr       string // host:port of the app
	HealthURL  string // "" for the TCP check
	Timeout    time.Duration
	httpClient *fasthttp.Client
	shownURL   string // HealthURL without its user info
}

// NewReady derives the check from the app URL and health path.
func NewReady(appURL, healthPath string, timeout time.Duration) (*Ready, error) {
	u, err := url.Parse(appURL)
	if err != nil {
		return nil, fmt.Errorf("parse app url: %w", redact.Error(err, appURL))
	}
	addr := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			addr = net.JoinHostPort(u.Hostname(), "443")
		} else {
			addr = net.JoinHostPort(u.Hostname(), "80")
		}
	}
	r := &Ready{Addr: addr, Timeout: timeout, httpClient: &fasthttp.Client{Name: "hopper-health"}}
	if healthPath != "" {
		h := *u
		h.Path, h.RawQuery, h.RawPath = healthPath, "", ""
		r.HealthURL = h.String()
		r.shownURL = redact.URL(r.HealthURL)
	}
	return r, nil
}

// UseTLS makes the health check of an https:// app use c (see NewTLS), as
// the deliveries do: an app that trusts only its own CA's client
// certificates refuses a check without one.
func (r *Ready) UseTLS(c *tls.Config) { r.httpClient.TLSConfig = c }

// Check runs the check once.
func (r *Ready) Check(ctx context.Context) error {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	if r.HealthURL == "" {
		d := net.Dialer{Timeout: timeout}
		conn, err := d.DialContext(ctx, "tcp", r.Addr)
		if err != nil {
			return fmt.Errorf("app not reachable at %s: %w", r.Addr, err)
		}
		return conn.Close()
	}
	status, _, err := r.httpClient.GetTimeout(nil, r.HealthURL, timeout)
	if err != nil {
		return fmt.Errorf("app health check %s: %w", r.shownURL, redact.Error(err, r.HealthURL))
	}
	if status < 200 || status > 299 {
		return fmt.Errorf("app health check %s answered %d", r.shownURL, status)
	}
	return nil
}

// Wait blocks until the check passes or ctx ends, checking every interval.
// Hopper consumes nothing before the app is ready, so a slow-starting app
// never sees its first messages fail.
func (r *Ready) Wait(ctx context.Context, interval time.Duration, onFail func(error)) error {
	for {
		err := r.Check(ctx)
		if err == nil {
			return nil
		}
		if onFail != nil {
			onFail(err)
		}
		if err := backoff.Sleep(ctx, interval); err != nil {
			return err
		}
	}
}
