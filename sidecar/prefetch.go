package sidecar

import (
	"context"
	"time"

	"github.com/hopper-sidecar/hopper/config"
)

// followEvery is how often a following prefetch is compared with the
// concurrency limit. The limit moves by at most one step per window of
// answers; a change needs the prefetch off by half, so checking often
// follows a climbing limit within a few hundred milliseconds without
// churning consumers.
const followEvery = 100 * time.Millisecond

// maxPrefetch is the most deliveries the queue can hold at once: the
// hand-off buffer to its workers is sized for it.
func (sub *subscription) maxPrefetch() int {
	p, w, follow := sub.cfg.Concurrency()
	if follow {
		return config.FollowPrefetch(w, w)
	}
	return p
}

// initialLimit is where the shared concurrency limit starts: each queue
// whose prefetch follows the limit brings its starting share, every other
// queue its workers. A fixed configuration gets its full concurrency from
// the first message; a following one ramps up from a modest start, so an
// app that cannot take hundreds of requests at once never sees them.
func initialLimit(subs []*subscription) int {
	n := 0
	for _, sub := range subs {
		_, w, follow := sub.cfg.Concurrency()
		if follow {
			w = min(w, config.AutoInitial)
		}
		n += w
	}
	return n
}

// followLimit keeps each following queue's prefetch at about twice its
// share of the concurrency limit until ctx ends. The limit is shared by all
// queues, each gets an equal share of it.
func followLimit(ctx context.Context, lim interface{ Limit() int }, subs []*subscription) {
	type following struct {
		sub     *subscription
		workers int
		sizes   bodySizes
	}
	var follow []following
	for _, sub := range subs {
		if _, w, f := sub.cfg.Concurrency(); f {
			follow = append(follow, following{sub: sub, workers: w})
		}
	}
	if len(follow) == 0 {
		return
	}
	t := time.NewTicker(followEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		share := max(1, lim.Limit()/len(subs))
		for i := range follow {
			f := &follow[i]
			c := f.sub.cons.Load()
			if c == nil {
				continue
			}
			if px := f.sub.px.Load(); px != nil {
				f.sizes.observe(px.Stats.Received.Load(), px.Stats.ReceivedBytes.Load())
			}
			want := config.CapPrefetch(config.FollowPrefetch(share, f.workers), f.sub.cfg.Consumer.PrefetchBytes, f.sizes.avg)
			if p, change := nextPrefetch(c.Prefetch(), want); change {
				c.SetPrefetch(p)
			}
		}
	}
}

// bodySizes follows the average body size of a queue's recent deliveries
// from its running totals.
type bodySizes struct {
	count, bytes int64   // totals at the last observation
	avg          float64 // bytes per message, 0 until one was seen
}

// observe takes the totals now. The average moves a quarter of the way to
// the latest period's, so one odd message does not swing the prefetch,
// and jumps at once when messages got larger: memory is the risk there.
func (b *bodySizes) observe(count, bytes int64) {
	dc, db := count-b.count, bytes-b.bytes
	b.count, b.bytes = count, bytes
	if dc <= 0 {
		return
	}
	latest := float64(db) / float64(dc)
	if b.avg == 0 || latest > b.avg {
		b.avg = latest
		return
	}
	b.avg += (latest - b.avg) / 4
}

// nextPrefetch says whether a consumer running with cur should move to
// want. A new prefetch costs a new broker consumer, so small moves of the
// limit are ignored: it changes when want is half again as large, or half
// as large or less.
func nextPrefetch(cur, want int) (int, bool) {
	if cur <= 0 {
		return want, want > 0
	}
	if want >= cur+cur/2 || want <= cur/2 {
		return want, true
	}
	return cur, false
}
