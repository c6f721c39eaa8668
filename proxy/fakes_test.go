package proxy

import (
	"context"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// eachOf answers a batch request with the test app's answer for each of
// its messages, as a results body naming every entry would.
func eachOf(ctx context.Context, deliver func(context.Context, *msg.Message, msg.Info) retry.Outcome, r *batch.Request) batch.Answer {
	a := batch.Answer{Whole: retry.Outcome{Kind: retry.Response, Status: 200}, Entries: make([]retry.Outcome, r.Len())}
	for i, m := range r.Messages {
		a.Entries[i] = deliver(ctx, m, r.Infos[i])
	}
	return a
}

func (f appFunc) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	return eachOf(ctx, f.Deliver, r)
}

func (a fakeApp) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	return eachOf(ctx, a.Deliver, r)
}

func (a *scriptedApp) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	return eachOf(ctx, a.Deliver, r)
}

func (a panicApp) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	return eachOf(ctx, a.Deliver, r)
}
