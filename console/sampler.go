package console

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// Sampler remembers a DLQ's depth over the console's lifetime, for the
// overview's chart and its arrival rate. It keeps at most Max samples:
// when full, every other one is dropped, so a console left running for
// days still draws its whole lifetime, at a coarser grain.
type Sampler struct {
	// Now is the clock; tests move it.
	Now func() time.Time
	// Max bounds the samples kept. Default 720.
	Max int

	mu      sync.Mutex
	samples []Sample
	removed int
}

// Sample is one depth reading.
type Sample struct {
	At    time.Time `json:"at"`
	Depth int       `json:"depth"`
	// Removed counts the messages the console itself removed (replayed,
	// purged) since the previous sample, which are not departures the
	// arrival rate must hide.
	Removed int `json:"-"`
}

// Add records depth now.
func (s *Sampler) Add(depth int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	max := s.Max
	if max <= 0 {
		max = 720
	}
	s.samples = append(s.samples, Sample{At: s.Now(), Depth: depth, Removed: s.removed})
	s.removed = 0
	if len(s.samples) > max {
		kept := make([]Sample, 0, len(s.samples)/2+1)
		carry := 0
		for i, x := range s.samples {
			x.Removed += carry
			carry = 0
			if i%2 == 1 && i != len(s.samples)-1 {
				// The next kept sample accounts for what this one saw.
				carry = x.Removed
				continue
			}
			kept = append(kept, x)
		}
		s.samples = kept
	}
}

// Removed tells the sampler that the console removed n messages, so the
// depth's fall is not taken for fewer arrivals.
func (s *Sampler) Removed(n int) {
	s.mu.Lock()
	s.removed += n
	s.mu.Unlock()
}

// Samples returns a copy of the samples, oldest first.
func (s *Sampler) Samples() []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Sample(nil), s.samples...)
}

// PerMinute is the arrival rate over the last minute of samples (or the
// whole history when shorter): every rise of the depth, plus what the
// console removed meanwhile, per minute. A consumer other than the
// console taking messages hides as many arrivals; a DLQ has none in
// normal operation. ok is false before two samples a moment apart.
func (s *Sampler) PerMinute() (rate float64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) < 2 {
		return 0, false
	}
	last := s.samples[len(s.samples)-1]
	from := len(s.samples) - 2
	for from > 0 && last.At.Sub(s.samples[from].At) < time.Minute {
		from--
	}
	span := last.At.Sub(s.samples[from].At)
	if span <= 0 {
		return 0, false
	}
	arrived := 0
	for i := from + 1; i < len(s.samples); i++ {
		if d := s.samples[i].Depth - s.samples[i-1].Depth + s.samples[i].Removed; d > 0 {
			arrived += d
		}
	}
	return float64(arrived) / span.Minutes(), true
}

// Chart is a line chart of depth samples, in pixels: depth on the
// vertical axis from zero to the largest seen, time on the horizontal.
// The page draws it as inline SVG from these figures; SVG renders the
// same as a document of its own.
type Chart struct {
	Width  int `json:"width"`
	Height int `json:"height"`
	// Points is the polyline's points attribute ("x,y x,y …"), empty
	// without samples.
	Points string `json:"points"`
	// Max is the largest depth, the top of the chart.
	Max int `json:"max"`
}

// DepthChart lays samples out on a width × height chart with 2 pixels of
// padding.
func DepthChart(samples []Sample, width, height int) Chart {
	c := Chart{Width: width, Height: height, Max: 1}
	if len(samples) == 0 {
		return c
	}
	for _, x := range samples {
		c.Max = max(c.Max, x.Depth)
	}
	const pad = 2.0
	w, h := float64(width)-2*pad, float64(height)-2*pad
	t0, t1 := samples[0].At, samples[len(samples)-1].At
	span := t1.Sub(t0).Seconds()
	var b strings.Builder
	for i, x := range samples {
		px := pad + w
		if span > 0 {
			px = pad + w*x.At.Sub(t0).Seconds()/span
		} else if len(samples) > 1 {
			px = pad + w*float64(i)/float64(len(samples)-1)
		}
		py := pad + h - h*float64(x.Depth)/float64(c.Max)
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", px, py)
	}
	c.Points = b.String()
	return c
}

// SVG renders the chart as a document of its own. It writes numbers only,
// so it needs no escaping.
func (c Chart) SVG() string {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img">`, c.Width, c.Height, c.Width, c.Height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#f6f8fa"/>`, c.Width, c.Height)
	if c.Points != "" {
		fmt.Fprintf(&b, `<polyline fill="none" stroke="#0969da" stroke-width="1.5" points="%s"/>`, c.Points)
		fmt.Fprintf(&b, `<text x="4" y="12" font-size="10" fill="#57606a">max %d</text>`, c.Max)
	}
	b.WriteString(`</svg>`)
	return b.String()
}
