package dlq

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// SyncWriter is where an export goes: an *os.File. Sync must make what was
// written durable; export --remove acks nothing before it returns.
type SyncWriter interface {
	io.Writer
	Sync() error
}

// ExportOptions configure Export.
type ExportOptions struct {
	// DLQ is written in every record (informational).
	DLQ string
	// Bound is the number of messages present at start; at most that many
	// are read, so messages arriving meanwhile are not exported.
	Bound int
	// Filter selects the messages exported; the others stay untouched.
	Filter Filter
	// Limit caps the messages exported (0: no cap). Reaching it ends the
	// export, except on a quorum DLQ (Rotate set), where the rest of the
	// messages present are still taken and handed back, so that the DLQ
	// keeps its order (see Rotation); they count as skipped.
	Limit int
	// Remove acks each exported message once its line is written and
	// synced. Without it the DLQ is left exactly as it was.
	Remove bool
	// DryRun reads, filters and encodes like a real export but writes no
	// line and removes nothing: it counts what would be exported (and
	// with Remove removed). w may be nil.
	DryRun bool
	// SyncEvery is the number of lines written between syncs when Remove
	// is set (their acks wait for the sync). Default 100.
	SyncEvery int
	// IdleTimeout ends the export when the DLQ has had nothing to hand out
	// for that long. Default 2s.
	IdleTimeout time.Duration
	Now         func() time.Time
	// Progress, when set, is told the number of messages taken so far
	// after each one.
	Progress func(taken int)
	// Rotate hands the messages not removed back to a quorum DLQ: those
	// it rotates at once, the rest held; nil holds them all for the
	// caller's closing the source.
	Rotate *Rotation
	// OnBad, when set, is told about each bad message (n is its 1-based
	// place in the pass).
	OnBad func(n int, err error)
}

// ExportResult is an export's account.
type ExportResult struct {
	DLQ      string `json:"dlq"`
	Present  int    `json:"present"`
	Taken    int    `json:"taken"`
	Exported int    `json:"exported"`
	// Removed were acked after their line was synced.
	Removed int `json:"removed"`
	// Skipped did not match the filter, or came after the limit.
	Skipped int `json:"skipped"`
	// Failed could not be encoded (unsupported header type); they stay.
	Failed int `json:"failed"`
	// Bad could not be processed at all (see the package doc); they stay.
	Bad   int   `json:"bad,omitempty"`
	Bytes int64 `json:"bytes"`
	// AckFailed were synced to the file but their ack was lost: they are
	// in the file and still in the DLQ.
	AckFailed int `json:"ackFailed,omitempty"`
	// DryRun: nothing was written or removed; WouldExport and
	// WouldRemove are what the real run would have done.
	DryRun      bool `json:"dryRun,omitempty"`
	WouldExport int  `json:"wouldExport,omitempty"`
	WouldRemove int  `json:"wouldRemove,omitempty"`
}

// Export writes messages from src to w as JSON Lines (see Record). Without
// o.Remove nothing is settled and the caller's closing the source returns
// everything to its place. With o.Remove a message is acked only after its
// line was written and w synced, so a crash at any point leaves every
// message in the DLQ, in the file, or both.
func Export(ctx context.Context, src Source, w SyncWriter, o ExportOptions) (ExportResult, error) {
	if o.SyncEvery <= 0 {
		o.SyncEvery = 100
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 2 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	res := ExportResult{DLQ: o.DLQ, Present: o.Bound, DryRun: o.DryRun}
	wouldRemove := o.Remove
	if o.DryRun {
		// Every message is handed back as one not selected is.
		w, o.Remove = discard{}, false
	}
	bw := bufio.NewWriterSize(w, 256<<10)
	var pending []Delivery
	var errs []error
	// commit makes the lines written so far durable, then acks the
	// messages they hold.
	commit := func() error {
		if err := bw.Flush(); err != nil {
			return fmt.Errorf("write export: %w", err)
		}
		if err := w.Sync(); err != nil {
			return fmt.Errorf("sync export file: %w", err)
		}
		for _, d := range pending {
			if err := d.Ack(); err != nil {
				res.AckFailed++
				if len(errs) == 0 {
					errs = append(errs, fmt.Errorf("ack after sync (message is in the file and still in the DLQ): %w", err))
				}
				continue
			}
			res.Removed++
		}
		pending = pending[:0]
		return nil
	}
	for res.Taken < o.Bound {
		full := o.Limit > 0 && res.Exported+res.WouldExport >= o.Limit
		if full && o.Rotate == nil {
			break // the rest stay where they are
		}
		if ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("export interrupted after %d messages: %w", res.Exported, context.Cause(ctx)))
			break
		}
		idle, cancel := context.WithTimeout(ctx, o.IdleTimeout)
		d, ok, err := src.Next(idle)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("DLQ %q: %w", o.DLQ, err))
			break
		}
		if !ok {
			if ctx.Err() != nil {
				errs = append(errs, fmt.Errorf("export interrupted after %d messages: %w", res.Exported, context.Cause(ctx)))
			}
			break // idle: nothing more to hand out
		}
		res.Taken++
		if o.Progress != nil {
			o.Progress(res.Taken)
		}
		var line []byte
		m, err := message(d)
		if err == nil {
			err = guard(func() (err error) {
				if match, _ := o.Filter.Match(m, o.Now()); match && !full {
					line, err = MarshalLine(m, o.DLQ)
				}
				return err
			})
		}
		switch {
		case errors.Is(err, ErrBadMessage):
			res.Bad++
			if o.OnBad != nil {
				o.OnBad(res.Taken, err)
			}
		case err != nil:
			res.Failed++
			if res.Failed == 1 {
				errs = append(errs, err)
			}
		case line == nil:
			res.Skipped++
		}
		if line == nil {
			if m != nil {
				if err := o.Rotate.Keep(ctx, d, m); err != nil {
					errs = append(errs, err)
					break
				}
			}
			continue
		}
		if o.DryRun {
			res.WouldExport++
			if wouldRemove {
				res.WouldRemove++
			}
			if err := o.Rotate.Keep(ctx, d, m); err != nil {
				errs = append(errs, err)
				break
			}
			continue
		}
		if _, err := bw.Write(line); err != nil {
			errs = append(errs, fmt.Errorf("write export: %w", err))
			if err := o.Rotate.Keep(ctx, d, m); err != nil {
				errs = append(errs, err)
			}
			break
		}
		res.Exported++
		res.Bytes += int64(len(line))
		if !o.Remove {
			if err := o.Rotate.Keep(ctx, d, m); err != nil {
				errs = append(errs, err)
				break
			}
			continue
		}
		pending = append(pending, d)
		if len(pending) >= o.SyncEvery {
			if err := commit(); err != nil {
				errs = append(errs, err)
				pending = nil // not acked: they return to the DLQ
				break
			}
		}
	}
	if err := commit(); err != nil {
		errs = append(errs, err)
	}
	return res, flushed(o.Rotate, errors.Join(errs...))
}

// discard is where a dry run's lines go.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) Sync() error                 { return nil }

// ImportOptions configure Import.
type ImportOptions struct {
	// To is the destination queue.
	To string
	// Skip is the number of lines to skip first, to resume an import that
	// stopped.
	Skip int
	// Parallel is the number of publishes awaiting their confirm at once;
	// 1 keeps the file's order exactly. Default 1.
	Parallel int
	// Progress, when set, is told the number of lines published (or
	// skipped) so far after each one. It is called with a lock held.
	Progress func(done int)
	// DryRun reads and decodes every line like a real import but
	// publishes nothing: WouldPublish counts what would be. pub may be
	// nil.
	DryRun bool
}

// Validate reports every problem with the options at once.
func (o *ImportOptions) Validate() error {
	var errs []error
	if o.Parallel < 1 {
		errs = append(errs, fmt.Errorf("--parallel %d: want at least 1", o.Parallel))
	}
	if o.Skip < 0 {
		errs = append(errs, fmt.Errorf("--skip %d: must not be negative", o.Skip))
	}
	return errors.Join(errs...)
}

// ImportResult is an import's account.
type ImportResult struct {
	To        string `json:"to"`
	Lines     int    `json:"lines"`
	Skipped   int    `json:"skipped"`
	Published int    `json:"published"`
	// Through is the number of leading lines all published (or skipped):
	// run again with --skip Through to resume after a failure.
	Through int `json:"through"`
	// DryRun: nothing was published; WouldPublish lines would have been.
	DryRun       bool `json:"dryRun,omitempty"`
	WouldPublish int  `json:"wouldPublish,omitempty"`
}

// Import publishes every line of r to o.To, each confirmed by the broker.
// It stops at the first line it cannot decode or publish; lines published
// past Through when it stops (Parallel > 1) would be published again by a
// resumed run.
func Import(ctx context.Context, r io.Reader, pub Publisher, o ImportOptions) (ImportResult, error) {
	if o.Parallel < 1 {
		o.Parallel = 1
	}
	res := ImportResult{To: o.To, DryRun: o.DryRun}
	br := bufio.NewReaderSize(r, 1<<20)

	var (
		mu       sync.Mutex
		done     = map[int]bool{}
		firstErr error
		wg       sync.WaitGroup
	)
	slots := make(chan struct{}, o.Parallel)
	// advance moves Through over every finished leading line.
	advance := func() {
		for done[res.Through+1] {
			delete(done, res.Through+1)
			res.Through++
		}
	}
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return firstErr != nil
	}

	for n := 1; ; n++ {
		line, rerr := br.ReadBytes('\n')
		if len(line) == 0 && rerr != nil {
			if !errors.Is(rerr, io.EOF) {
				fail(fmt.Errorf("read line %d: %w", n, rerr))
			}
			break
		}
		mu.Lock()
		res.Lines = n
		mu.Unlock()
		if n <= o.Skip || len(bytes.TrimSpace(line)) == 0 {
			mu.Lock()
			if n <= o.Skip {
				res.Skipped++
			}
			done[n] = true
			advance()
			mu.Unlock()
			if rerr != nil {
				break
			}
			continue
		}
		m, err := UnmarshalLine(line)
		if err != nil {
			fail(fmt.Errorf("line %d: %w", n, err))
			break
		}
		if o.DryRun {
			mu.Lock()
			res.WouldPublish++
			done[n] = true
			advance()
			if o.Progress != nil {
				o.Progress(res.WouldPublish + res.Skipped)
			}
			mu.Unlock()
			if rerr != nil {
				break
			}
			continue
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			fail(fmt.Errorf("import interrupted: %w", context.Cause(ctx)))
		}
		if failed() {
			break
		}
		wg.Add(1)
		go func(n int) {
			defer wg.Done()
			defer func() { <-slots }()
			// Not ctx: a publish the broker may have taken is seen through.
			if err := pub.PublishTo(context.WithoutCancel(ctx), "", o.To, m); err != nil {
				fail(fmt.Errorf("line %d (message id %q): %w", n, m.MessageID, err))
				return
			}
			mu.Lock()
			res.Published++
			done[n] = true
			advance()
			if o.Progress != nil {
				o.Progress(res.Published + res.Skipped)
			}
			mu.Unlock()
		}(n)
		if rerr != nil {
			break
		}
	}
	wg.Wait()
	return res, firstErr
}
