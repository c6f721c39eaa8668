package dlq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"golang.org/x/time/rate"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// Replay moves messages from a DLQ back to their original queue:
//
//	take ─ filter ─ destination? ─ replay cap? ─ publish copy → confirm → ack
//	         │           │              │                │
//	         └ skipped   └ kept         └ kept           └ failed (held)
//
// Everything not acked is held unacked until the run ends and then returns
// to its place in the DLQ (on a quorum DLQ it is rotated instead: see
// Rotation). That, with the bound (at most the number of messages present
// at start), means one run handles each message at most once even when a
// replayed message fails again at once and comes back to the DLQ behind
// the others. The source is an exclusive consumer, so a
// second replayer of the same DLQ is refused instead of republishing the
// same messages: two processes replaying one DLQ multiply its messages.
//
// What a replayed copy carries: body, properties and message id unchanged;
// the headers that describe the DLQ entry (x-dead-letter-reason,
// x-dead-letter-time, x-final-*) are removed, since the copy is no longer
// dead-lettered and Hopper writes them afresh if it comes back;
// x-replay-count is incremented and x-last-replay-time, x-replayed-from set.
// Hopper's attempt counters (x-retry-count, x-requeue-count, first/last
// failure) are kept unless ResetAttempts: a replayed message that fails
// again then goes straight back to the DLQ instead of through every retry
// tier again, which is what an operator replaying after a fix wants to
// find out first. ResetAttempts gives it the full retry budget again.
// The deadline (x-hopper-deadline) is kept unless ClearDeadline: a message
// that expired would otherwise expire again at once.

// ReplayOptions configure Replay.
type ReplayOptions struct {
	// DLQ is the queue replayed from (for x-replayed-from and messages).
	DLQ string
	// To, when set, is the destination queue for every message instead of
	// its x-original-queue.
	To string
	// ToExchange, when set, is the exchange every message is published
	// to instead, with RoutingKey, or the message's original routing key
	// when RoutingKey is empty: the bindings of that exchange then decide
	// where it goes, as they did when it was first published.
	ToExchange string
	RoutingKey string
	// Through, when set and To is not, names the exchange a message from
	// queue is replayed through instead of that queue: for a partition
	// queue its consistent-hash exchange, published with the message's
	// original routing key (its headers are kept), so the exchange picks
	// the partition for its key as it did the first time. ok false sends
	// the message to queue itself.
	Through func(queue string) (exchange string, ok bool)
	// Filter selects the messages replayed; the others are skipped (kept).
	Filter Filter
	// Bound is the number of messages present at start; at most that many
	// are taken. Zero takes nothing.
	Bound int
	// Limit caps the messages replayed (0: no cap).
	Limit int
	// Rate caps replays per second (0: no cap).
	Rate float64
	// DryRun decides and counts but publishes and removes nothing.
	DryRun bool
	// ResetAttempts clears Hopper's attempt counters on the copy.
	ResetAttempts bool
	// ClearDeadline removes Hopper's deadline header from the copy.
	ClearDeadline bool
	// MaxReplays keeps messages already replayed that many times
	// (x-replay-count ≥ MaxReplays) in the DLQ; 0 disables the cap.
	MaxReplays int
	// Parallel is the number of publishes awaiting their confirm at once.
	// 1 keeps the DLQ's order exactly. Default 1.
	Parallel int
	// IdleTimeout ends the run when the DLQ has had nothing to hand out
	// for that long (messages taken by someone else, or gone). Default 5s.
	IdleTimeout time.Duration
	// StallTimeout ends the run when nothing has moved — no message taken,
	// no publish settled — for that long, for example while the broker
	// blocks publishing. Default 60s.
	StallTimeout time.Duration
	// Progress, when set, is called every ProgressEvery (default 2s) and
	// once at the end.
	Progress      func(ReplayResult)
	ProgressEvery time.Duration
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// Rotate hands the messages not replayed back to a quorum DLQ: those
	// it rotates at once, the rest held; nil holds them all for the
	// caller's closing the source. With it a run that reaches Limit goes
	// on taking the rest of the messages present at start (kept:
	// KeptLimit), so that the DLQ keeps its order (see Rotation).
	Rotate *Rotation
	// OnBad, when set, is told about each bad message (n is its 1-based
	// place in the run).
	OnBad func(n int, err error)
	// Change, when set, makes the message a copy is made from: an edit or
	// a transformation of the message taken from the DLQ. It must not
	// change its argument; nil and no error replays the message as it is.
	// An error keeps the message in the DLQ as it was (KeptChange), and
	// the error is counted in the result's Errors.
	Change func(m *msg.Message) (*msg.Message, error)
	// Batch, when positive, replays in chunks of that many messages:
	// after each chunk the run waits for the moves in flight, then calls
	// Between (recovered so far), and goes on when it returns nil. So a
	// fix can be tried on a few messages before the rest. Not in a dry
	// run.
	Batch int
	// Between waits between chunks: a pause, or an operator's go-ahead.
	// An error (ctx ended) stops the run; what it has not moved stays in
	// the DLQ. The stall timeout does not run while it waits. Required
	// with Batch.
	Between func(ctx context.Context, recovered int) error
	// RunID names the run on every copy (msg.HeaderReplayRun), so that a
	// copy that comes back to the DLQ tells which run replayed it.
	RunID string
	// Originals, when set with Change, is the queue that receives an exact
	// copy of each message before its changed copy is published, so that
	// the message as it was can be got back; the changed copy is
	// published only once that copy is confirmed.
	Originals string
}

// Validate reports every problem with the options at once, each named by
// the command-line flag that sets it.
func (o *ReplayOptions) Validate() error {
	var errs []error
	if o.Limit < 0 {
		errs = append(errs, fmt.Errorf("--limit %d: must not be negative", o.Limit))
	}
	if o.Rate < 0 {
		errs = append(errs, fmt.Errorf("--rate %g: must not be negative", o.Rate))
	}
	if o.MaxReplays < 0 {
		errs = append(errs, fmt.Errorf("--max-replays %d: must not be negative", o.MaxReplays))
	}
	if o.Parallel < 1 || o.Parallel > 1000 {
		errs = append(errs, fmt.Errorf("--parallel %d: want 1 to 1000", o.Parallel))
	}
	if o.IdleTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--idle-timeout %s: must be positive", o.IdleTimeout))
	}
	if o.StallTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--stall-timeout %s: must be positive", o.StallTimeout))
	}
	if o.To != "" && o.To == o.DLQ {
		errs = append(errs, fmt.Errorf("--to %q is the DLQ itself", o.To))
	}
	if o.Batch < 0 {
		errs = append(errs, fmt.Errorf("--batch %d: must not be negative", o.Batch))
	}
	if o.Batch > 0 && o.Between == nil {
		errs = append(errs, fmt.Errorf("--batch %d: say what happens between batches (--pause)", o.Batch))
	}
	if o.To != "" && o.ToExchange != "" {
		errs = append(errs, fmt.Errorf("--to %q and --to-exchange %q: give a queue or an exchange, not both", o.To, o.ToExchange))
	}
	if o.RoutingKey != "" && o.ToExchange == "" {
		errs = append(errs, fmt.Errorf("--to-routing-key %q: only with --to-exchange (a queue is reached by its name)", o.RoutingKey))
	}
	if o.Originals != "" && (o.Originals == o.DLQ || o.Originals == o.To) {
		errs = append(errs, fmt.Errorf("originals queue %q must be neither the DLQ nor the destination", o.Originals))
	}
	if err := o.Filter.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// hopperReasons are the dead-letter reasons Hopper itself writes.
var hopperReasons = []string{"max-attempts", "non-retriable", "expired", "too-early", "app-action", "app-crash",
	retry.ReasonFiltered, retry.ReasonFilterError}

// Reasons are the dead-letter reasons a DLQ message can carry, each once:
// Hopper's own, then the broker's for messages it dead-lettered itself.
// "expired" is both (Hopper's deadline, the broker's TTL).
func Reasons() []string {
	out := slices.Clone(hopperReasons)
	for _, r := range msg.BrokerReasons {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// BrokerOnlyReasons are the reasons only the broker writes.
func BrokerOnlyReasons() []string {
	var out []string
	for _, r := range msg.BrokerReasons {
		if !slices.Contains(hopperReasons, r) {
			out = append(out, r)
		}
	}
	return out
}

func knownReason(r string) bool {
	for _, k := range Reasons() {
		if k == r {
			return true
		}
	}
	return false
}

// Kept reasons.
const (
	KeptNoDestination = "no destination (no x-original-queue; use --to)"
	KeptMaxReplays    = "replay cap reached (x-replay-count >= --max-replays)"
	KeptLimit         = "past --limit (handed back to keep the quorum DLQ's order)"
	KeptChange        = "change refused (left in the DLQ as it was)"
	KeptStopped       = "run stopped between batches"
)

// Why a run ended.
const (
	EndDone        = "done"        // every message present at start was handled
	EndEmpty       = "empty"       // the DLQ had nothing more to hand out
	EndLimit       = "limit"       // --limit messages replayed
	EndInterrupted = "interrupted" // signal or total timeout
	EndStalled     = "stalled"     // no progress for the stall timeout
	EndLost        = "source lost" // connection to the DLQ lost
	EndNotKept     = "not kept"    // a message could not be handed back (see ErrNotKept)
)

// errHandBack wraps the failure that made a run stop handing messages
// back to a quorum DLQ.
var errHandBack = errors.New("hand-back to the DLQ failed")

// ErrStalled ends a run that made no progress for the stall timeout.
var ErrStalled = errors.New("replay stalled: no progress")

// QueueCounts are per original queue.
type QueueCounts struct {
	Recovered    int `json:"recovered"`
	WouldRecover int `json:"wouldRecover,omitempty"`
	Failed       int `json:"failed"`
	Kept         int `json:"kept"`
	Skipped      int `json:"skipped"`
}

// ReplayResult is a run's account. Every message taken is in exactly one
// of Recovered, Failed, Kept, Skipped, Bad (or WouldRecover in a dry run).
type ReplayResult struct {
	DLQ     string `json:"dlq"`
	DryRun  bool   `json:"dryRun,omitempty"`
	Present int    `json:"present"`
	Taken   int    `json:"taken"`
	// Recovered were published, confirmed and removed from the DLQ.
	Recovered int `json:"recovered"`
	// WouldRecover is what a dry run would have replayed.
	WouldRecover int `json:"wouldRecover,omitempty"`
	// Failed could not be moved (publish refused, returned, unconfirmed, or
	// the ack lost after a confirmed publish — then the message is in both
	// queues); they stay in the DLQ.
	Failed int `json:"failed"`
	// Kept stay in the DLQ by rule (no destination, replay cap).
	Kept int `json:"kept"`
	// Skipped did not match the filter.
	Skipped int `json:"skipped"`
	// Changed are the recovered (or, in a dry run, would-be recovered)
	// messages whose copy was changed (ReplayOptions.Change).
	Changed int `json:"changed,omitempty"`
	// Bad could not be processed (see the package doc); they stay.
	Bad int `json:"bad,omitempty"`
	// InFlight are taken and not yet decided (progress reports only).
	InFlight int                     `json:"inFlight,omitempty"`
	ByQueue  map[string]*QueueCounts `json:"byQueue"`
	KeptWhy  map[string]int          `json:"keptWhy,omitempty"`
	// Errors holds the first distinct failure reasons, with counts.
	Errors  map[string]int `json:"errors,omitempty"`
	End     string         `json:"end"`
	Elapsed Duration       `json:"elapsed"`
	// Rate is messages recovered per second.
	Rate float64 `json:"rate"`
}

func (r *ReplayResult) queue(q string) *QueueCounts {
	q = orUnknown(q)
	c := r.ByQueue[q]
	if c == nil {
		c = &QueueCounts{}
		r.ByQueue[q] = c
	}
	return c
}

func (r *ReplayResult) clone() ReplayResult {
	c := *r
	c.ByQueue = make(map[string]*QueueCounts, len(r.ByQueue))
	for k, v := range r.ByQueue {
		vv := *v
		c.ByQueue[k] = &vv
	}
	c.KeptWhy = maps.Clone(r.KeptWhy)
	c.Errors = maps.Clone(r.Errors)
	return c
}

// maxErrorKinds bounds ReplayResult.Errors.
const maxErrorKinds = 10

// replayer is one run.
type replayer struct {
	o   ReplayOptions
	src Source
	pub Publisher

	mu       sync.Mutex
	res      ReplayResult
	inflight int
	// settled is signalled (without blocking) whenever a publish settles.
	settled chan struct{}
	// abort ends the taking of messages: a message could not be handed
	// back.
	abort    func(error)
	progress atomic.Int64 // UnixNano of the last progress
	began    time.Time
	// waiting is true while Between waits: no stall then.
	waiting atomic.Bool
	// nextBatch is the count of recovered messages at which the run next
	// waits (Batch).
	nextBatch int
}

// Replay runs one replay: it takes at most o.Bound messages from src and
// moves those that match to their destination through pub. It returns the
// account and, when the run ended abnormally (interrupted, stalled, source
// lost), an error; the account is valid either way. The caller closes src
// afterwards, which returns every held message to the DLQ.
func Replay(ctx context.Context, src Source, pub Publisher, o ReplayOptions) (ReplayResult, error) {
	if o.Parallel < 1 {
		o.Parallel = 1
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 5 * time.Second
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = 60 * time.Second
	}
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = 2 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	r := &replayer{o: o, src: src, pub: pub, began: o.Now(), settled: make(chan struct{}, 1)}
	r.res = ReplayResult{DLQ: o.DLQ, DryRun: o.DryRun, Present: o.Bound, ByQueue: map[string]*QueueCounts{}, KeptWhy: map[string]int{}, Errors: map[string]int{}}
	r.touch()
	err := r.run(ctx)
	r.mu.Lock()
	res := r.res.clone()
	r.mu.Unlock()
	res.Elapsed = Duration(o.Now().Sub(r.began))
	if secs := time.Duration(res.Elapsed).Seconds(); secs > 0 {
		res.Rate = float64(res.Recovered) / secs
	}
	if o.Progress != nil {
		o.Progress(res)
	}
	return res, err
}

func (r *replayer) touch() { r.progress.Store(time.Now().UnixNano()) }

func (r *replayer) run(parent context.Context) error {
	// fetchCtx ends the taking of new messages: on interrupt, stall or
	// total timeout. Publishes already started finish on their own
	// (bounded by the publisher's confirm timeout) so that a confirmed copy
	// gets its ack and is not left behind as a duplicate.
	fetchCtx, stop := context.WithCancelCause(parent)
	defer stop(nil)
	r.abort = func(err error) { stop(fmt.Errorf("%w: %w", errHandBack, err)) }

	done := make(chan struct{})
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		r.watch(fetchCtx, done, stop)
	}()

	slots := make(chan struct{}, r.o.Parallel)
	var workers sync.WaitGroup
	pace := newPacer(r.o.Rate)
	end, endErr := r.loop(fetchCtx, slots, &workers, pace)
	workers.Wait()
	close(done)
	watch.Wait()

	if end == "" {
		switch cause := context.Cause(fetchCtx); {
		case errors.Is(cause, errHandBack):
			end, endErr = EndNotKept, cause
		case errors.Is(cause, ErrStalled):
			end, endErr = EndStalled, fmt.Errorf("%w for %s", ErrStalled, r.o.StallTimeout)
		case parent.Err() != nil:
			end, endErr = EndInterrupted, fmt.Errorf("replay interrupted: %w", context.Cause(parent))
		}
	}
	// The copies still in flight are settled before the source closes.
	if ferr := flushed(r.o.Rotate, endErr); ferr != nil {
		if endErr == nil || end == EndDone {
			end = EndNotKept
		}
		endErr = ferr
	}
	r.mu.Lock()
	r.res.End = end
	r.mu.Unlock()
	return endErr
}

// loop takes and dispatches messages until the bound, the limit, an empty
// DLQ or fetchCtx ends it. It returns the end reason ("" when fetchCtx
// ended) and the error for an abnormal end.
func (r *replayer) loop(ctx context.Context, slots chan struct{}, workers *sync.WaitGroup, pace *pacer) (string, error) {
	for {
		// A select below with a free slot and an ended ctx may pick
		// either, and a source may still hand out what it has buffered:
		// once ctx has ended, nothing more is taken.
		if ctx.Err() != nil {
			return "", nil
		}
		r.mu.Lock()
		taken, inflight, replaying := r.res.Taken, r.inflight, r.res.Recovered+r.res.WouldRecover+r.inflight
		r.mu.Unlock()
		if taken >= r.o.Bound {
			return EndDone, nil
		}
		if r.o.Limit > 0 && replaying >= r.o.Limit && r.o.Rotate == nil {
			if inflight == 0 {
				return EndLimit, nil
			}
			// A publish in flight may still fail and free its share of
			// the limit: wait for it rather than stop short or overshoot.
			select {
			case <-r.settled:
				continue
			case <-ctx.Done():
				return "", nil
			}
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return "", nil
		}
		idle, cancel := context.WithTimeout(ctx, r.o.IdleTimeout)
		d, ok, err := r.src.Next(idle)
		cancel()
		if err != nil {
			<-slots
			return EndLost, fmt.Errorf("DLQ %q: %w", r.o.DLQ, err)
		}
		if !ok {
			<-slots
			if ctx.Err() != nil {
				return "", nil
			}
			return EndEmpty, nil
		}
		r.touch()
		m, err := message(d)
		var dest, verdict string
		var changed *msg.Message
		var changeErr error
		if err == nil {
			err = guard(func() error {
				dest, verdict = r.decide(m, replaying)
				return nil
			})
		}
		if err == nil && verdict == "" && r.o.Batch > 0 && !r.o.DryRun && !r.batchOK(ctx) {
			verdict = KeptStopped
		}
		if err == nil && verdict == "" && r.o.Change != nil {
			changeErr = guard(func() error {
				var cerr error
				changed, cerr = r.o.Change(m)
				return cerr
			})
			if changeErr != nil {
				verdict = KeptChange
			}
		}

		r.mu.Lock()
		r.res.Taken++
		n := r.res.Taken
		switch {
		case err != nil:
			verdict = "bad"
			r.res.Bad++
		case verdict == "" && r.o.DryRun:
			r.res.WouldRecover++
			r.res.queue(msg.OriginalQueue(m)).WouldRecover++
			if changed != nil {
				r.res.Changed++
			}
		case verdict == "":
			r.inflight++
		case verdict == "skip":
			r.res.Skipped++
			r.res.queue(msg.OriginalQueue(m)).Skipped++
		default:
			r.res.Kept++
			r.res.queue(msg.OriginalQueue(m)).Kept++
			r.res.KeptWhy[verdict]++
			if changeErr != nil {
				r.countError(changeErr)
			}
		}
		r.mu.Unlock()
		if err != nil && r.o.OnBad != nil {
			r.o.OnBad(n, err)
		}

		if verdict != "" || r.o.DryRun {
			// Handed back: held unacked until the source closes, or
			// rotated now on a quorum DLQ (in the loop, so in order; after
			// the moves in flight, which rotate their message if they fail).
			if m != nil && r.o.Rotate.Rotates(m) {
				r.awaitMoves()
				if err := r.o.Rotate.Keep(ctx, d, m); err != nil {
					<-slots
					return EndNotKept, err
				}
			}
			<-slots
			continue
		}
		if err := pace.wait(ctx); err != nil {
			r.mu.Lock()
			r.inflight--
			r.res.Taken--
			r.mu.Unlock()
			// Taken but not published: it is held and returns with the
			// others; it was not handled, so it is not counted.
			<-slots
			return "", nil
		}
		workers.Add(1)
		go func() {
			defer workers.Done()
			defer func() { <-slots }()
			r.move(ctx, d, m, changed, dest)
		}()
	}
}

// batchOK is called before a message is moved: at the end of a batch it
// waits for the moves in flight, then for Between. false: the run stops.
func (r *replayer) batchOK(ctx context.Context) bool {
	if r.nextBatch == 0 {
		r.nextBatch = r.o.Batch
	}
	r.mu.Lock()
	n := r.res.Recovered + r.inflight
	r.mu.Unlock()
	if n < r.nextBatch {
		return true
	}
	r.awaitMoves()
	r.mu.Lock()
	n = r.res.Recovered
	r.mu.Unlock()
	if n < r.nextBatch {
		// Moves failed: the batch is not full yet.
		return true
	}
	r.waiting.Store(true)
	err := r.o.Between(ctx, n)
	r.waiting.Store(false)
	r.touch()
	r.nextBatch = n + r.o.Batch
	return err == nil && ctx.Err() == nil
}

// awaitMoves waits until no move is in flight. Moves end on their own,
// bounded by the publisher's confirm timeout.
func (r *replayer) awaitMoves() {
	for {
		r.mu.Lock()
		n := r.inflight
		r.mu.Unlock()
		if n == 0 {
			return
		}
		<-r.settled
	}
}

// decide returns the destination, or why the message stays: "skip" when
// the filter does not select it, else a Kept* reason.
func (r *replayer) decide(m *msg.Message, replaying int) (dest, verdict string) {
	if ok, _ := r.o.Filter.Match(m, r.o.Now()); !ok {
		return "", "skip"
	}
	if r.o.Limit > 0 && replaying >= r.o.Limit {
		return "", KeptLimit
	}
	dest = r.o.To
	if r.o.ToExchange != "" {
		dest = "exchange " + r.o.ToExchange
	}
	if dest == "" {
		dest = msg.OriginalQueue(m)
	}
	if dest == "" {
		return "", KeptNoDestination
	}
	if r.o.MaxReplays > 0 && msg.ReplayCount(m) >= r.o.MaxReplays {
		return "", KeptMaxReplays
	}
	return dest, ""
}

// route is the exchange and routing key a copy for dest is published
// with: ToExchange when set; else dest through the default exchange, or
// the exchange in front of dest's partitions with the original routing
// key.
func (r *replayer) route(m *msg.Message, dest string) (exchange, key string) {
	if r.o.ToExchange != "" {
		if r.o.RoutingKey != "" {
			return r.o.ToExchange, r.o.RoutingKey
		}
		return r.o.ToExchange, msg.OriginalRoutingKey(m)
	}
	if r.o.To == "" && r.o.Through != nil {
		if ex, ok := r.o.Through(dest); ok {
			return ex, msg.OriginalRoutingKey(m)
		}
	}
	return "", dest
}

// move publishes the copy, waits for the confirm, then acks the original.
// A failed publish leaves the original held (it returns to the DLQ at the
// end of the run), or rotated on a quorum DLQ; never acked. changed, when
// not nil, is what the copy is made from instead of m; the original then
// goes to the originals queue first, when there is one.
func (r *replayer) move(ctx context.Context, d Delivery, m, changed *msg.Message, dest string) {
	from := m
	if changed != nil {
		from = changed
	}
	var cp *msg.Message
	err := guard(func() error {
		cp = msg.ReplayCopy(from, r.o.DLQ, r.o.Now(), r.o.ResetAttempts, r.o.ClearDeadline)
		// An earlier run's name would credit this run's failures to it.
		delete(cp.Headers, msg.HeaderReplayRun)
		if r.o.RunID != "" {
			cp.Headers[msg.HeaderReplayRun] = r.o.RunID
		}
		return nil
	})
	if err == nil && changed != nil && r.o.Originals != "" {
		// Not ctx, as below. The original stays in the DLQ until both
		// copies are confirmed.
		if perr := r.pub.PublishTo(context.WithoutCancel(ctx), "", r.o.Originals, msg.KeepCopy(m)); perr != nil {
			err = fmt.Errorf("keep the original in %s: %w", r.o.Originals, perr)
		}
	}
	published := false
	if err == nil {
		// Not ctx: an interrupt must not abandon a publish the broker may
		// already have taken; the publisher's confirm timeout bounds it.
		exchange, key := r.route(m, dest)
		err = r.pub.PublishTo(context.WithoutCancel(ctx), exchange, key, cp)
		published = err == nil
	}
	if published {
		if aerr := d.Ack(); aerr != nil {
			// The copy is in dest and the original back in the DLQ: a
			// duplicate, never a loss.
			err = fmt.Errorf("ack after a confirmed publish failed (the message is now in both queues): %w", aerr)
		}
	} else if kerr := r.o.Rotate.Keep(ctx, d, m); kerr != nil {
		r.abort(kerr)
	}
	r.touch()
	defer func() {
		select {
		case r.settled <- struct{}{}:
		default:
		}
	}()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inflight--
	q := r.res.queue(msg.OriginalQueue(m))
	if err != nil {
		r.res.Failed++
		q.Failed++
		r.countError(err)
		return
	}
	r.res.Recovered++
	q.Recovered++
	if changed != nil {
		r.res.Changed++
	}
}

// countError counts a failure in the result's Errors; r.mu is held.
func (r *replayer) countError(err error) {
	key := err.Error()
	if _, seen := r.res.Errors[key]; seen || len(r.res.Errors) < maxErrorKinds {
		r.res.Errors[key]++
	}
}

// watch reports progress and ends the run when it stalls.
func (r *replayer) watch(ctx context.Context, done <-chan struct{}, stop context.CancelCauseFunc) {
	every := max(min(r.o.ProgressEvery, r.o.StallTimeout)/4, 10*time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	lastReport := time.Now()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		if ctx.Err() == nil && !r.waiting.Load() && time.Since(time.Unix(0, r.progress.Load())) > r.o.StallTimeout {
			stop(ErrStalled)
		}
		// Half a tick of slack so that ticks landing just short of the
		// period do not skip a report.
		if r.o.Progress != nil && time.Since(lastReport) >= r.o.ProgressEvery-every/2 {
			lastReport = time.Now()
			r.mu.Lock()
			res := r.res.clone()
			res.InFlight = r.inflight
			r.mu.Unlock()
			res.Elapsed = Duration(r.o.Now().Sub(r.began))
			if secs := time.Duration(res.Elapsed).Seconds(); secs > 0 {
				res.Rate = float64(res.Recovered) / secs
			}
			r.o.Progress(res)
		}
	}
}

// pacer spaces replays to at most rate per second, with no burst: a paced
// replay must not flood the destination the moment it starts.
type pacer struct{ lim *rate.Limiter }

func newPacer(perSecond float64) *pacer {
	if perSecond <= 0 {
		return &pacer{}
	}
	return &pacer{lim: rate.NewLimiter(rate.Limit(perSecond), 1)}
}

func (p *pacer) wait(ctx context.Context) error {
	if p.lim == nil {
		return nil
	}
	if err := p.lim.Wait(ctx); err != nil {
		// The limiter refuses at once a wait that would outlast ctx's
		// deadline; the run still ends when ctx does, and says why.
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// WriteProgress writes one progress line.
func WriteProgress(w io.Writer, r ReplayResult) {
	verb := "recovered"
	n := r.Recovered
	if r.DryRun {
		verb, n = "would recover", r.WouldRecover
	}
	eta := ""
	if left := r.Present - r.Taken; left > 0 && r.Rate > 0 {
		eta = ", ETA " + time.Duration(float64(left)/r.Rate*float64(time.Second)).Round(time.Second).String()
	}
	fmt.Fprintf(w, "replay %s: %d/%d taken, %d %s, %d failed, %d kept, %d skipped, %d in flight, %.0f msg/s, %s%s\n",
		r.DLQ, r.Taken, r.Present, n, verb, r.Failed, r.Kept, r.Skipped, r.InFlight, r.Rate,
		time.Duration(r.Elapsed).Round(time.Millisecond), eta)
}

// WriteSummary writes the account for people.
func (r *ReplayResult) WriteSummary(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	title := "Replay"
	if r.DryRun {
		title = "Replay (dry run: nothing published, nothing removed)"
	}
	fmt.Fprintf(tw, "%s of %s: %s after %s\n", title, r.DLQ, r.End, time.Duration(r.Elapsed).Round(time.Millisecond))
	fmt.Fprintf(tw, "present at start\t%d\n", r.Present)
	fmt.Fprintf(tw, "taken\t%d\n", r.Taken)
	if r.DryRun {
		fmt.Fprintf(tw, "would recover\t%d\n", r.WouldRecover)
	} else {
		fmt.Fprintf(tw, "recovered\t%d\t(%.0f msg/s)\n", r.Recovered, r.Rate)
	}
	if r.Changed > 0 || r.KeptWhy[KeptChange] > 0 {
		verb := "changed"
		if r.DryRun {
			verb = "would change"
		}
		fmt.Fprintf(tw, "%s\t%d\t(the transformation changes them before they go)\n", verb, r.Changed)
	}
	fmt.Fprintf(tw, "failed\t%d\t(still in the DLQ)\n", r.Failed)
	fmt.Fprintf(tw, "kept\t%d\t(still in the DLQ)\n", r.Kept)
	for _, why := range slices.Sorted(maps.Keys(r.KeptWhy)) {
		fmt.Fprintf(tw, "  %s\t%d\t\n", why, r.KeptWhy[why])
	}
	fmt.Fprintf(tw, "skipped by filter\t%d\t(still in the DLQ)\n", r.Skipped)
	if r.Bad > 0 {
		fmt.Fprintf(tw, "bad\t%d\t(could not be read; still in the DLQ)\n", r.Bad)
	}
	if len(r.ByQueue) > 0 {
		col := "recovered"
		if r.DryRun {
			col = "would recover"
		}
		fmt.Fprintf(tw, "\nOriginal queue\t%s\tfailed\tkept\tskipped\n", col)
		for _, q := range slices.Sorted(maps.Keys(r.ByQueue)) {
			c := r.ByQueue[q]
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\n", q, c.Recovered+c.WouldRecover, c.Failed, c.Kept, c.Skipped)
		}
	}
	if len(r.Errors) > 0 {
		fmt.Fprintf(tw, "\nFailures\tcount\n")
		for _, e := range slices.Sorted(maps.Keys(r.Errors)) {
			fmt.Fprintf(tw, "  %s\t%d\n", strings.ReplaceAll(e, "\t", " "), r.Errors[e])
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	return nil
}
