package app

import (
	"context"

	"github.com/hopper-sidecar/hopper/batch"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// asBatch lets a test app that answers single messages take a batch
// request: its answer for the first message is the request's.
func asBatch(ctx context.Context, deliver func(context.Context, *msg.Message, msg.Info) retry.Outcome, r *batch.Request) batch.Answer {
	o := deliver(ctx, r.Messages[0], r.Infos[0])
	return batch.Classified(batch.Answer{}, o, r.Len())
}

func (f deliverFunc) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	return asBatch(ctx, f.Deliver, r)
}
func (a *crashApp) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	return asBatch(ctx, a.Deliver, r)
}
func (a *gateApp) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	return asBatch(ctx, a.Deliver, r)
}
func (s *scripted) DeliverBatch(ctx context.Context, r *batch.Request) batch.Answer {
	return asBatch(ctx, s.Deliver, r)
}
