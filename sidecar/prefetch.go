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
		return sub.cfg.FollowPrefetch(w, w)
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
// queues, each gets an equal share of it. What the prefetch may hold in
// bytes is the consumer's to bound (prefetchBytes): it caps whatever it is
// asked for here, by the breaker's Resume, or at its start, so no path can
// raise it above the budget.
func followLimit(ctx context.Context, lim interface{ Limit() int }, subs []*subscription) {
	type following struct {
		follower
		sub     *subscription
		workers int
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
		var now time.Time
		select {
		case <-ctx.Done():
			return
		case now = <-t.C:
		}
		share := max(1, lim.Limit()/len(subs))
		for i := range follow {
			f := &follow[i]
			c := f.sub.cons.Load()
			if c == nil {
				continue
			}
			want := f.sub.cfg.FollowPrefetch(share, f.workers)
			if p, change := f.next(c.Requested(), want, now); change {
				c.SetPrefetch(p)
			}
		}
	}
}

// shrinkAfter is how long the limit must ask for half the prefetch or less
// before the prefetch comes down. The limit backs off on a single window of
// slow answers, and on a machine whose cores are busy a fast app's latency
// jumps for a moment now and then: followed at once, each jump cost a new
// consumer and a stall while the smaller prefetch refilled (twelve consumers
// in a 14 s drain of a happy backlog), where the limit was back within a
// second. An app that really slows down keeps the limit low for longer,
// and its deliveries are held back by the limit meanwhile, not by the
// prefetch.
const shrinkAfter = 2 * time.Second

// follower decides one consumer's prefetch from the limit's share: up at
// once when the share asks for half again as much, down only once it has
// asked for half or less for shrinkAfter, and then to the most it asked for
// in that time.
type follower struct {
	lowSince time.Time // zero: the share is not asking for less
	lowPeak  int       // the most the share asked for since lowSince
}

func (f *follower) next(cur, want int, now time.Time) (int, bool) {
	p, change := nextPrefetch(cur, want)
	if !change || p >= cur {
		f.lowSince = time.Time{}
		return p, change
	}
	if f.lowSince.IsZero() {
		f.lowSince, f.lowPeak = now, want
	}
	f.lowPeak = max(f.lowPeak, want)
	if now.Sub(f.lowSince) < shrinkAfter {
		return cur, false
	}
	f.lowSince = time.Time{}
	return f.lowPeak, true
}

// prefetchBytes is the byte budget of the queue's consumer: the
// configured consumer.prefetchBytes while the prefetch follows the limit,
// and for the prefetch Hopper picks for a single-active-consumer queue
// (which does not follow, to keep its place in line); none for a prefetch
// the operator set (consumer.prefetch), or an ordered queue's one.
func (sub *subscription) prefetchBytes() int {
	if sub.cfg.Budgeted() {
		return sub.cfg.Consumer.PrefetchBytes
	}
	return 0
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
