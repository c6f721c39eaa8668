// Command benchtable rewrites the performance table of docs/performance.md
// from the summary lines hopperbench and dlqbench print, so that the figures
// there are those of a run, never typed by hand. `make bench-readme` runs
// both benchmarks and pipes their output into it.
//
// It reads bench output on standard input, any mix of
//
//	bench: hopper=R1/s raw=R2/s ratio=X p99_added_ms=Y rss_mb=Z [cpu_ratio=C] [anon_mb=A]
//	bench: retry|dlq|defaults hopper=R1/s raw=R2/s ratio=X cpu_ratio=Y rss_mb=Z [anon_mb=A]
//	bench: defaults-fixed defaults=R1/s fixed=R2/s (prefetch P/workers W) ratio=X cpu_ratio=C rss_mb=Z [anon_mb=A] …
//	bench: slow20ms defaults=R1/s best_fixed=R2/s (prefetch P/workers W) ratio=X
//	bench: fair healthy_alone=R1/s healthy_beside_poison=R2/s ratio=X
//	bench: big size_kib=K hold=D held_max=H held_bound=B rss_mb=R rss_over_held_mb=X
//	bench: batch size=S hopper=R1/s raw=R2/s floor=R3/s of_floor=X ratio=Y cpu_ratio=C rss_mb=Z [anon_mb=A]
//	bench: batch-raw size=S rawbatch=R1/s ratio=X
//	bench: batch-retry size=S hopper=R1/s of_happy=X
//	bench: deep n=N hopper=R1/s raw=R2/s ratio=X batch=R3/s batch_ratio=Y
//	dlqbench: replay=R1/s raw=R2/s ratio=X rss_mb=Y [floor=R3/s of_floor=Z]
//	bench: console-scan n=N secs=S rss_mb=M
//
// and hopperbench's settings line (hopperbench: [RabbitMQ V, ]backlog …);
// every other line is ignored (the baseline: lines of --baseline-bin
// among them), and a path seen twice keeps its last line. Where a line
// has anon_mb, the RSS column shows it beside the peak RSS. It replaces
// what lies between the lines
//
//	<!-- bench-table:begin -->
//	<!-- bench-table:end -->
//
// of that page with a markdown table, one row per path found, in a fixed
// order. Without both markers, or without any figures, it fails and leaves
// the page alone.
//
//	go run ./bench/benchtable [--readme docs/performance.md] [--command "make bench-readme …"] < bench.log
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
)

const (
	beginMarker = "<!-- bench-table:begin -->"
	endMarker   = "<!-- bench-table:end -->"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchtable", flag.ContinueOnError)
	fs.SetOutput(stderr)
	readme := fs.String("readme", "docs/performance.md", "the file whose bench-table block is rewritten")
	command := fs.String("command", "", "the command that produced the figures, recorded in the block")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "benchtable: unexpected argument %q (bench output is read from standard input)\n", fs.Arg(0))
		return 2
	}
	fig, err := parse(stdin, stderr)
	if err == nil {
		err = rewrite(*readme, fig.block(*command))
	}
	if err != nil {
		fmt.Fprintf(stderr, "benchtable: %v\n", err)
		return 1
	}
	fmt.Fprint(stdout, fig.table())
	fmt.Fprintf(stderr, "benchtable: %s: %d row(s) written between %s and %s\n", *readme, len(fig.rows), beginMarker, endMarker)
	return 0
}

// row is one line of the table.
type row struct {
	path, hopper, compared, ratio, cpu, rss string
}

// rowOrder is the order of the rows, whatever the order of the input.
var rowOrder = []string{"happy", "retry", "dlq", "defaults", "defaults-fixed", "slow", "fair", "big", "batch", "batch-raw", "batch-retry", "deep", "deep-batch", "replay", "console-scan"}

// figures are what the input held.
type figures struct {
	rows     map[string]row // by rowOrder key
	settings string         // hopperbench's settings line, without its prefix
	p99Added string         // happy line's p99_added_ms, when measured
}

var bestFixedRE = regexp.MustCompile(`\(prefetch (\d+)/workers (\d+)\)`)

// settingsRE is hopperbench's settings line, which names the broker's
// version first since the benchmark runs on more than one.
var settingsRE = regexp.MustCompile(`^hopperbench: ((RabbitMQ [^,]+, )?backlog .*)$`)

// parse reads bench output; lines that are not summary lines are ignored,
// a summary line missing a figure is an error.
func parse(r io.Reader, warn io.Writer) (*figures, error) {
	fig := &figures{rows: map[string]row{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		var err error
		switch {
		case settingsRE.MatchString(line):
			fig.settings = settingsRE.FindStringSubmatch(line)[1]
		case strings.HasPrefix(line, "bench: "):
			err = fig.benchLine(strings.TrimPrefix(line, "bench: "), warn)
		case strings.HasPrefix(line, "dlqbench: replay="):
			err = fig.dlqLine(strings.TrimPrefix(line, "dlqbench: "))
		}
		if err != nil {
			return nil, fmt.Errorf("%w in line %q", err, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read bench output: %w", err)
	}
	fig.joinBatchRows()
	if len(fig.rows) == 0 {
		return nil, errors.New("no figures in the input: expected `bench: …` lines of hopperbench or a `dlqbench: replay=…` line (pipe the output of make bench / make dlq-bench into benchtable)")
	}
	return fig, nil
}

// fields splits a summary line into its path name (the first word when it
// holds no '=', else "") and its key=value pairs; other words are skipped.
func fields(s string) (string, map[string]string) {
	words := strings.Fields(s)
	kind := ""
	if len(words) > 0 && !strings.Contains(words[0], "=") {
		kind, words = words[0], words[1:]
	}
	kv := map[string]string{}
	for _, w := range words {
		if k, v, ok := strings.Cut(w, "="); ok {
			kv[k] = v
		}
	}
	return kind, kv
}

func (fig *figures) benchLine(s string, warn io.Writer) error {
	kind, kv := fields(s)
	switch {
	case kind == "" || kind == "retry" || kind == "dlq" || kind == "defaults":
		key, label := kind, rawPathLabels[kind]
		if kind == "" {
			key = "happy"
			if v, ok := kv["p99_added_ms"]; ok && v != "n/a" {
				if _, err := number(kv, "p99_added_ms"); err != nil {
					return err
				}
				fig.p99Added = v
			} else {
				fig.p99Added = ""
			}
		}
		r, err := comparedRow(kv, label, "hopper", "raw", "raw loop")
		if err != nil {
			return err
		}
		fig.rows[key] = r
	case kind == "defaults-fixed":
		setting := "Hopper at a fixed setting"
		if m := bestFixedRE.FindStringSubmatch(s); m != nil {
			setting = fmt.Sprintf("Hopper at prefetch %s / workers %s", m[1], m[2])
		}
		r, err := comparedRow(kv, "defaults against a fixed setting, in the same runs", "defaults", "fixed", setting)
		if err != nil {
			return err
		}
		fig.rows["defaults-fixed"] = r
	case kind == "fair":
		alone, beside, ratio, err := rateRatio(kv, "healthy_alone", "healthy_beside_poison")
		if err != nil {
			return err
		}
		fig.rows["fair"] = row{path: "fair: a healthy queue beside a poison queue, one Hopper",
			hopper: beside, compared: "the same queue alone: " + alone, ratio: ratio, cpu: "—", rss: "—"}
	case strings.HasPrefix(kind, "slow"):
		defaults, best, ratio, err := rateRatio(kv, "defaults", "best_fixed")
		if err != nil {
			return err
		}
		setting := "best fixed setting"
		if m := bestFixedRE.FindStringSubmatch(s); m != nil {
			setting = fmt.Sprintf("best fixed, prefetch %s / workers %s", m[1], m[2])
		}
		delay := strings.TrimPrefix(kind, "slow")
		fig.rows["slow"] = row{path: "slow: app answering after " + delay + ", Hopper at its defaults",
			hopper: defaults, compared: setting + ": " + best, ratio: ratio, cpu: "—", rss: "—"}
	case kind == "big":
		return fig.bigLine(kv)
	case kind == "batch" || kind == "batch-raw" || kind == "batch-retry":
		return fig.batchLine(kind, kv)
	case kind == "deep":
		return fig.deepLine(kv)
	case kind == "console-scan":
		return fig.consoleLine(kv)
	default:
		fmt.Fprintf(warn, "benchtable: ignoring a line of unknown path %q\n", kind)
	}
	return nil
}

// bigLine is the big path's row: how many 1 MiB messages were held at
// once against the bound, and the peak RSS with what it holds beyond them.
func (fig *figures) bigLine(kv map[string]string) error {
	for _, k := range []string{"size_kib", "held_max", "held_bound", "rss_mb", "rss_over_held_mb"} {
		if _, err := number(kv, k); err != nil {
			return err
		}
	}
	if kv["hold"] == "" {
		return errors.New("no hold=")
	}
	fig.rows["big"] = row{
		path:     fmt.Sprintf("big: %s KiB messages the app holds for %s each, Hopper at its defaults", kv["size_kib"], kv["hold"]),
		hopper:   fmt.Sprintf("%s held at once", kv["held_max"]),
		compared: fmt.Sprintf("prefetchBytes bound: %s", kv["held_bound"]),
		ratio:    "—", cpu: "—",
		rss: fmt.Sprintf("%s MiB (%s MiB over what was held)", kv["rss_mb"], kv["rss_over_held_mb"]),
	}
	return nil
}

// deepLine is the deep path's two rows: Hopper per message and in
// batches, each against the raw loop on the same deep backlog.
func (fig *figures) deepLine(kv map[string]string) error {
	n, err := number(kv, "n")
	if err != nil {
		return err
	}
	h, raw, ratio, err := rateRatio(kv, "hopper", "raw")
	if err != nil {
		return err
	}
	b, err := rate(kv, "batch")
	if err != nil {
		return err
	}
	if _, err := number(kv, "batch_ratio"); err != nil {
		return err
	}
	fig.rows["deep"] = row{path: fmt.Sprintf("deep: a backlog of %s messages, one request per message", thousands(int64(n))), hopper: h,
		compared: "raw loop: " + raw, ratio: ratio, cpu: "—", rss: "—"}
	fig.rows["deep-batch"] = row{path: fmt.Sprintf("deep: a backlog of %s messages, in batches of up to the batch path's size", thousands(int64(n))), hopper: b,
		compared: "raw loop: " + raw, ratio: kv["batch_ratio"], cpu: "—", rss: "—"}
	return nil
}

// consoleLine is the DLQ console's row: one scan grouping a DLQ, its
// time and the console's peak RSS.
func (fig *figures) consoleLine(kv map[string]string) error {
	n, err := number(kv, "n")
	if err != nil {
		return err
	}
	secs, err := number(kv, "secs")
	if err != nil {
		return err
	}
	if secs <= 0 {
		return fmt.Errorf("secs=%s is not a duration", kv["secs"])
	}
	_, rss, err := cpuRSS(kv)
	if err != nil {
		return err
	}
	fig.rows["console-scan"] = row{path: fmt.Sprintf("`hopper dlq console`: a scan grouping a DLQ of %s messages", thousands(int64(n))),
		hopper:   fmt.Sprintf("%s s (%s msg/s)", kv["secs"], thousands(int64(math.Round(n/secs)))),
		compared: "—", ratio: "—", cpu: "—", rss: rss}
	return nil
}

// batchLine is a row of the batch path. The batch-raw and batch-retry
// lines hold no rate of Hopper's batches answered 200, which their rows
// show beside theirs: joinBatchRows takes it from the batch line.
func (fig *figures) batchLine(kind string, kv map[string]string) error {
	size, err := number(kv, "size")
	if err != nil {
		return err
	}
	switch kind {
	case "batch":
		h, raw, ratio, err := rateRatio(kv, "hopper", "raw")
		if err != nil {
			return err
		}
		floor, err := rate(kv, "floor")
		if err != nil {
			return err
		}
		of, err := number(kv, "of_floor")
		if err != nil {
			return err
		}
		cpu, rss, err := cpuRSS(kv)
		if err != nil {
			return err
		}
		fig.rows["batch"] = row{path: fmt.Sprintf("batch: %g messages per request, every one answered 200", size), hopper: h,
			compared: fmt.Sprintf("raw loop, one POST per message: %s; broker floor (a consumer process of the same prefetch, no app: consume → multiple-ack every %g): %s, batches at %.2f of it", raw, size, floor, of),
			ratio:    ratio, cpu: cpu, rss: rss}
	case "batch-raw":
		rb, err := rate(kv, "rawbatch")
		if err != nil {
			return err
		}
		if _, err := number(kv, "ratio"); err != nil {
			return err
		}
		fig.rows["batch-raw"] = row{path: fmt.Sprintf("batch: %g messages per request, against a hand-written batching loop", size),
			compared: fmt.Sprintf("raw batching loop (consume %g → one POST → multiple-ack): %s", size, rb),
			ratio:    kv["ratio"], cpu: "—", rss: "—"}
	case "batch-retry":
		h, err := rate(kv, "hopper")
		if err != nil {
			return err
		}
		if _, err := number(kv, "of_happy"); err != nil {
			return err
		}
		fig.rows["batch-retry"] = row{path: fmt.Sprintf("batch-retry: %g messages per request, every 10th answered 503 once, then 200 after the delay tier", size),
			hopper: h, ratio: kv["of_happy"], cpu: "—", rss: "—"}
	}
	return nil
}

// joinBatchRows fills in what the batch-raw and batch-retry rows take from
// the batch row: Hopper's rate with every entry answered 200 ("—" without
// a batch line).
func (fig *figures) joinBatchRows() {
	happy := "—"
	if r, ok := fig.rows["batch"]; ok {
		happy = r.hopper
	}
	if r, ok := fig.rows["batch-raw"]; ok {
		r.hopper = happy
		fig.rows["batch-raw"] = r
	}
	if r, ok := fig.rows["batch-retry"]; ok {
		r.compared = "the same batches, every entry answered 200: " + happy
		fig.rows["batch-retry"] = r
	}
}

var rawPathLabels = map[string]string{
	"":         "happy: every message answered 200",
	"retry":    "retry: 503 once, then 200 after the delay tier",
	"dlq":      "dlq: every message answered 400",
	"defaults": "defaults: Hopper without consumer keys",
}

func (fig *figures) dlqLine(s string) error {
	_, kv := fields(s)
	rep, raw, ratio, err := rateRatio(kv, "replay", "raw")
	if err != nil {
		return err
	}
	_, rss, err := cpuRSS(kv)
	if err != nil {
		return err
	}
	compared := "raw get → publish → ack loop: " + raw
	if _, ok := kv["floor"]; ok {
		// Older dlqbench lines have no floor.
		floor, err := rate(kv, "floor")
		if err != nil {
			return err
		}
		of, err := number(kv, "of_floor")
		if err != nil {
			return err
		}
		compared += fmt.Sprintf("; broker floor (consume → pipelined publish → multiple-ack): %s, replay at %.2f of it", floor, of)
	}
	fig.rows["replay"] = row{path: "`hopper dlq replay`", hopper: rep,
		compared: compared, ratio: ratio, cpu: "—", rss: rss}
	return nil
}

// rateRatio reads two rates and the ratio, all required.
func rateRatio(kv map[string]string, a, b string) (string, string, string, error) {
	ra, err := rate(kv, a)
	if err != nil {
		return "", "", "", err
	}
	rb, err := rate(kv, b)
	if err != nil {
		return "", "", "", err
	}
	if _, err := number(kv, "ratio"); err != nil {
		return "", "", "", err
	}
	return ra, rb, kv["ratio"], nil
}

// comparedRow is the row of a line that compares Hopper's rate (key
// hopper) with another's (key other, named what): both rates, their ratio,
// the CPU ratio and the peak RSS.
func comparedRow(kv map[string]string, path, hopper, other, what string) (row, error) {
	h, o, ratio, err := rateRatio(kv, hopper, other)
	if err != nil {
		return row{}, err
	}
	cpu, rss, err := cpuRSS(kv)
	if err != nil {
		return row{}, err
	}
	return row{path: path, hopper: h, compared: what + ": " + o, ratio: ratio, cpu: cpu, rss: rss}, nil
}

// cpuRSS reads cpu_ratio and rss_mb, each "—" when the line has none,
// and anon_mb, shown beside rss_mb when the line has it.
func cpuRSS(kv map[string]string) (cpu, rss string, err error) {
	cpu, rss = "—", "—"
	if _, ok := kv["cpu_ratio"]; ok {
		if _, err := number(kv, "cpu_ratio"); err != nil {
			return "", "", err
		}
		cpu = kv["cpu_ratio"] + "×"
	}
	if _, ok := kv["rss_mb"]; ok {
		if _, err := number(kv, "rss_mb"); err != nil {
			return "", "", err
		}
		rss = kv["rss_mb"] + " MiB"
		if _, ok := kv["anon_mb"]; ok {
			if _, err := number(kv, "anon_mb"); err != nil {
				return "", "", err
			}
			rss += " (" + kv["anon_mb"] + " anonymous)"
		}
	}
	return cpu, rss, nil
}

// rate reads key=R/s as "R msg/s" with thousands separators.
func rate(kv map[string]string, key string) (string, error) {
	v, ok := kv[key]
	if !ok {
		return "", fmt.Errorf("no %s=", key)
	}
	f, err := strconv.ParseFloat(strings.TrimSuffix(v, "/s"), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return "", fmt.Errorf("%s=%s is not a rate", key, v)
	}
	return thousands(int64(math.Round(f))) + " msg/s", nil
}

// number checks that key holds a finite number.
func number(kv map[string]string, key string) (float64, error) {
	v, ok := kv[key]
	if !ok {
		return 0, fmt.Errorf("no %s=", key)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%s=%s is not a number", key, v)
	}
	return f, nil
}

// thousands formats n with a comma every three digits: 11603 → 11,603.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// table is the markdown table of the rows found.
func (fig *figures) table() string {
	var b strings.Builder
	b.WriteString("| path | Hopper | compared with | ratio | Hopper CPU vs compared | Hopper peak RSS |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, k := range rowOrder {
		if r, ok := fig.rows[k]; ok {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.path, r.hopper, r.compared, r.ratio, r.cpu, r.rss)
		}
	}
	return b.String()
}

// block is what goes between the markers.
func (fig *figures) block(command string) string {
	var b strings.Builder
	b.WriteString("<!-- generated by bench/benchtable from bench output; rerun the command, do not edit by hand -->\n")
	if command != "" {
		fmt.Fprintf(&b, "Figures of one run of `%s`", command)
	} else {
		b.WriteString("Figures of one bench run")
	}
	if fig.settings != "" {
		fmt.Fprintf(&b, "; hopperbench settings: %s", fig.settings)
	}
	b.WriteString(".\n\n")
	b.WriteString(fig.table())
	b.WriteString("\n")
	if fig.p99Added != "" {
		fmt.Fprintf(&b, "Latency Hopper adds at p99 (publish → app receipt, idle queues, hopper − raw): %s ms.\n", fig.p99Added)
	}
	return b.String()
}

// rewrite replaces the lines between the markers of the file at path with
// block; the file is left alone unless both markers are found, once each,
// in order.
func rewrite(path, block string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := replaceBlock(string(data), block)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, []byte(out), st.Mode().Perm())
}

func replaceBlock(text, block string) (string, error) {
	lines := strings.SplitAfter(text, "\n")
	begin, end := -1, -1
	for i, l := range lines {
		switch strings.TrimSpace(l) {
		case beginMarker:
			if begin >= 0 {
				return "", fmt.Errorf("more than one %s line", beginMarker)
			}
			begin = i
		case endMarker:
			if end >= 0 {
				return "", fmt.Errorf("more than one %s line", endMarker)
			}
			end = i
		}
	}
	switch {
	case begin < 0 || end < 0:
		return "", fmt.Errorf("no bench-table block: want a line %s and, below it, a line %s where the table goes", beginMarker, endMarker)
	case end < begin:
		return "", fmt.Errorf("%s comes before %s", endMarker, beginMarker)
	}
	if !strings.HasSuffix(block, "\n") {
		block += "\n"
	}
	return strings.Join(lines[:begin+1], "") + block + strings.Join(lines[end:], ""), nil
}
