package sidecar

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/schedule"
)

// schedulePolicy is a queue's schedule, nil with scheduling off.
func schedulePolicy(cfg *config.Config) *schedule.Policy {
	s := cfg.Schedule
	if !s.Enabled {
		return nil
	}
	p := &schedule.Policy{Step: s.Step.D(), Max: s.MaxDelay.D()}
	if s.PastMax == "longest" {
		p.PastMax = schedule.AtLongest
	}
	return p
}

// parkedCount is what the broker last said of a queue's parking queues.
type parkedCount struct {
	n  atomic.Int64
	at atomic.Int64 // Unix ms of the count; 0: never counted
}

// parkedCountEvery is how often the parking queues are counted: a passive
// declare per queue, cheap, and the broker's own count of a quorum queue
// lags anyway.
const parkedCountEvery = 5 * time.Second

// countParked counts, until ctx ends, the messages in every queue's
// parking queues on a connection of its own (one the delivery loops never
// wait on), for /readyz and hopper_parked_messages. A count that fails is
// tried again at the next round on a new connection; the last count
// stays shown with its age.
func (s *Sidecar) countParked(ctx context.Context) {
	var insp *broker.Inspector
	defer func() {
		if insp != nil {
			insp.Close() //nolint:errcheck // a read-only connection
		}
	}()
	t := time.NewTicker(parkedCountEvery)
	defer t.Stop()
	for {
		if insp == nil {
			var err error
			insp, err = broker.OpenInspector(ctx, broker.ConfigOptions(s.cfg.Broker, s.log, "hopper-parked-count"))
			if err != nil {
				insp = nil
				s.log.Debug("could not count parked messages", "event", "PARKED_COUNT_FAILED", "error", err.Error())
			}
		}
		if insp != nil && !s.countParkedOnce(insp) {
			insp.Close() //nolint:errcheck // broken already
			insp = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// countParkedOnce counts each queue's parking queues; false when the
// connection failed.
func (s *Sidecar) countParkedOnce(insp *broker.Inspector) bool {
	for _, sub := range s.subs {
		if len(sub.plan.Parking) == 0 {
			continue
		}
		var n int64
		for _, q := range sub.plan.Parking {
			d, err := insp.Depth(q.Name)
			if err != nil {
				s.log.Debug("could not count parked messages", "event", "PARKED_COUNT_FAILED", "queue", q.Name, "error", err.Error())
				return false
			}
			n += int64(d)
		}
		sub.parked.n.Store(n)
		sub.parked.at.Store(time.Now().UnixMilli())
	}
	return true
}

// scheduling says whether any queue parks messages.
func (s *Sidecar) scheduling() bool {
	for _, sub := range s.subs {
		if len(sub.plan.Parking) > 0 {
			return true
		}
	}
	return false
}

// parkedByQueue is hopper_parked_messages.
func (s *Sidecar) parkedByQueue() map[string]float64 {
	out := map[string]float64{}
	for _, sub := range s.subs {
		if len(sub.plan.Parking) > 0 {
			out[sub.name()] = float64(sub.parked.n.Load())
		}
	}
	return out
}

// nextDueByQueue is hopper_schedule_next_due_timestamp_seconds.
func (s *Sidecar) nextDueByQueue() map[string]float64 {
	out := map[string]float64{}
	for _, sub := range s.subs {
		if len(sub.plan.Parking) == 0 {
			continue
		}
		out[sub.name()] = 0
		if px := sub.px.Load(); px != nil {
			if t, ok := px.NextDue(); ok {
				out[sub.name()] = float64(t.Unix())
			}
		}
	}
	return out
}

// scheduleText is a queue's parked messages on /readyz.
func (sub *subscription) scheduleText(now time.Time) string {
	at := sub.parked.at.Load()
	txt := "parked: not counted yet"
	if at > 0 {
		txt = fmt.Sprintf("parked %d (counted %s ago)", sub.parked.n.Load(), now.Sub(time.UnixMilli(at)).Round(time.Second))
	}
	if px := sub.px.Load(); px != nil {
		if t, ok := px.NextDue(); ok {
			return fmt.Sprintf("%s, next due %s (in %s)", txt, t.UTC().Format(time.RFC3339), t.Sub(now).Round(time.Second))
		}
	}
	return txt + ", none due that this Hopper parked"
}
