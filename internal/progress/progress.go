// Package progress shows how far a long DLQ tool run has got: a bar with
// rate and ETA on a terminal, plain lines (one every few seconds) in a log
// or a pipe, or nothing. It writes to stderr only, so an export to stdout
// is never mixed with it.
package progress

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Modes a user can ask for with --progress.
const (
	Auto  = "auto"
	Bar   = "bar"
	Plain = "plain"
	None  = "none"
)

// Modes lists the accepted --progress values.
var Modes = []string{Auto, Bar, Plain, None}

// Reporter is told how far a run has got.
type Reporter interface {
	// Set reports done of total (total 0: unknown).
	Set(done, total int64)
	// Finish ends the report (the bar's last state, a last plain line).
	Finish()
}

// Options configure New.
type Options struct {
	// What names the run in every line ("replay orders.dlq").
	What string
	// Mode is one of Modes; Auto picks Bar on a terminal, else Plain.
	Mode string
	// Every is the least time between plain lines. Default 5s.
	Every time.Duration
	// Now is the clock of plain lines (rate, ETA). Default time.Now.
	Now func() time.Time
}

// New returns the reporter for mode, writing to w. IsTerminal decides
// Auto when w is a terminal.
func New(w io.Writer, o Options) (Reporter, error) {
	if o.Every <= 0 {
		o.Every = 5 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	switch o.Mode {
	case Auto, "":
		if IsTerminal(w) {
			return newBar(w, o.What), nil
		}
		return newPlain(w, o), nil
	case Bar:
		return newBar(w, o.What), nil
	case Plain:
		return newPlain(w, o), nil
	case None:
		return nop{}, nil
	}
	return nil, fmt.Errorf("--progress %q: want one of auto, bar, plain, none", o.Mode)
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

type nop struct{}

func (nop) Set(int64, int64) {}
func (nop) Finish()          {}

// bar draws a terminal progress bar with count, rate and ETA.
type bar struct {
	w     io.Writer
	what  string
	b     *progressbar.ProgressBar
	total int64
}

func newBar(w io.Writer, what string) *bar { return &bar{w: w, what: what} }

func (b *bar) Set(done, total int64) {
	if b.b == nil || total != b.total {
		max := total
		if max <= 0 {
			max = -1 // a spinner: the total is unknown
		}
		if b.b == nil {
			b.b = progressbar.NewOptions64(max,
				progressbar.OptionSetWriter(b.w),
				progressbar.OptionSetDescription(b.what),
				progressbar.OptionShowCount(),
				progressbar.OptionShowIts(),
				progressbar.OptionSetItsString("msg"),
				progressbar.OptionSetPredictTime(true),
				progressbar.OptionSetElapsedTime(true),
				progressbar.OptionThrottle(100*time.Millisecond),
				progressbar.OptionFullWidth(),
			)
		} else {
			b.b.ChangeMax64(max)
		}
		b.total = total
	}
	_ = b.b.Set64(done) // a write error on the terminal is not the run's
}

func (b *bar) Finish() {
	if b.b == nil {
		return
	}
	_ = b.b.Finish()
	fmt.Fprintln(b.w)
}

// plain writes a line at most every o.Every, and one at the end:
// "replay orders.dlq: 1200/5000 (24%), 600 msg/s, ETA 6s".
type plain struct {
	w           io.Writer
	o           Options
	start, last time.Time
	done, total int64
	wrote       bool
}

func newPlain(w io.Writer, o Options) *plain {
	now := o.Now()
	return &plain{w: w, o: o, start: now, last: now}
}

func (p *plain) Set(done, total int64) {
	p.done, p.total = done, total
	if now := p.o.Now(); now.Sub(p.last) >= p.o.Every {
		p.last = now
		p.line(now)
	}
}

func (p *plain) Finish() {
	if p.wrote || p.done > 0 {
		p.line(p.o.Now())
	}
}

func (p *plain) line(now time.Time) {
	p.wrote = true
	elapsed := now.Sub(p.start)
	rate := 0.0
	if elapsed > 0 {
		rate = float64(p.done) / elapsed.Seconds()
	}
	if p.total <= 0 {
		fmt.Fprintf(p.w, "%s: %d, %.0f msg/s, %s\n", p.o.What, p.done, rate, elapsed.Round(time.Second))
		return
	}
	eta := "?"
	if rate > 0 {
		left := max(p.total-p.done, 0)
		eta = (time.Duration(float64(left) / rate * float64(time.Second))).Round(time.Second).String()
	}
	fmt.Fprintf(p.w, "%s: %d/%d (%d%%), %.0f msg/s, ETA %s\n", p.o.What, p.done, p.total, p.done*100/p.total, rate, eta)
}
