package app

import (
	"context"

	"github.com/valyala/fasthttp"

	"github.com/hopper-sidecar/hopper/msg"
)

// BuildRequest builds into req the request Deliver sends for m (body,
// Hopper's headers, token and signatures, trace context, application
// headers) without sending it, for the benchmarks.
func (a *Client) BuildRequest(req *fasthttp.Request, m *msg.Message, in msg.Info) {
	creds, head := a.prepare(req, m, in)
	a.addHeaders(context.Background(), req, m, in, head)
	creds.authenticate(req)
}

// WaitingForConn is the number of requests waiting for a connection.
func (a *Client) WaitingForConn() int64 { return a.waiting.Load() }

// ForwardedName is forwardedName, for the tests.
var ForwardedName = forwardedName

// Digits is digits, for the tests.
var Digits = digits
