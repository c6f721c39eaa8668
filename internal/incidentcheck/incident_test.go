package incidentcheck

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/console"
	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/internal/testbroker"
	"github.com/hopper-sidecar/hopper/internal/waitfor"
	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/topology"
)

var node testbroker.Lazy

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

func TestMain(m *testing.M) {
	code := testbroker.RunLazy(m, &node)
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// hopper builds the binary once per run, into a folder of its own that the
// page's commands find first on their PATH.
func hopper(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "hopper-incidentcheck-")
		if binErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, "hopper"), "github.com/hopper-sidecar/hopper/cmd/hopper").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binDir
}

// The page and what it works with.
const (
	root = "../.."
	page = "docs/incident.md"
	// configFile is the name the page's commands give the config, whose
	// text is the page's one yaml block.
	configFile = "orders.yaml"
)

// ---- The page ----
//
// Every ```console block of the page is run. A line starting with "$ " is
// a command (one ending in a backslash goes on to the next line, as in the
// shell), and the lines after it, up to the next command or the end of
// the block, are what it prints: standard output and standard error
// together, as they interleave on a terminal. A command that exits other
// than 0 must be followed by `echo $?` showing its status. Blocks of other
// languages are shown, not run.

// step is one command of the page and what the page shows it printing.
type step struct {
	line    int // of the command on the page
	outLine int // of the first line of its output
	cmd     string
	want    []string
}

// readPage returns the page's config (its one yaml block) and its
// commands, in order.
func readPage(t *testing.T) (conf string, steps []step) {
	t.Helper()
	f, err := os.Open(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		open       bool   // inside a fenced block
		lang       string // of the open block
		blockLine  int
		cur        *step
		more       bool // the command's last line ended in a backslash
		yamlBlocks int
		n          int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case !open && strings.HasPrefix(trimmed, "```"):
			open, lang, blockLine, cur = true, strings.TrimPrefix(trimmed, "```"), n, nil
			if lang == "yaml" {
				yamlBlocks++
			}
		case open && trimmed == "```":
			if lang == "console" && cur == nil {
				t.Fatalf("%s:%d: a console block without a command ($ …)", page, blockLine)
			}
			if cur != nil {
				steps = append(steps, *cur)
			}
			open, cur = false, nil
		case open && lang == "yaml":
			conf += line + "\n"
		case open && lang == "console" && more:
			cur.cmd += "\n" + line
			cur.outLine = n + 1
			more = strings.HasSuffix(line, `\`)
		case open && lang == "console" && strings.HasPrefix(line, "$ "):
			if cur != nil {
				steps = append(steps, *cur)
			}
			cur = &step{line: n, outLine: n + 1, cmd: strings.TrimPrefix(line, "$ ")}
			more = strings.HasSuffix(line, `\`)
		case open && lang == "console":
			if cur == nil {
				t.Fatalf("%s:%d: output before any command in a console block", page, n)
			}
			cur.want = append(cur.want, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if open {
		t.Fatalf("%s:%d: block never closed", page, blockLine)
	}
	if yamlBlocks != 1 {
		t.Fatalf("%s: %d yaml blocks; want exactly one, the config the commands name (%s)", page, yamlBlocks, configFile)
	}
	if len(steps) == 0 {
		t.Fatalf("%s: no command found", page)
	}
	return conf, steps
}

// ---- Matching ----
//
// What a command prints is compared line by line with what the page shows,
// exactly, but for what no run can reproduce, and only that:
//
//   - durations: the ages of stats and peek ("3h02m ago", "in DLQ for"),
//     elapsed times and ETAs ("after 59.4s", "ETA 41s"). Any duration
//     matches any other; everything around it must be the same.
//   - rates: "N msg/s" matches any N.
//   - progress lines, which come every few seconds with the counts reached
//     by then: a run of them on the page (where "..." may stand for the
//     lines left out) matches a run of any length in the output whose last
//     line, the count at the end, is the page's last one. The lines before
//     it need only have the shape of one of the page's (the same text with
//     other numbers).
//   - trailing spaces, which the tools' aligned columns can leave and an
//     editor strips.
//
// Every timestamp the page shows is fixed by the seeded messages, so none
// is normalised.

var (
	// durationRE is a duration as Go prints one (1m2.5s, 850ms) and as the
	// DLQ tools print an age (3h02m, 18m35s, 150d03h).
	durationRE = regexp.MustCompile(`\b\d+(?:\.\d+)?(?:d\d+h|h\d+m(?:\d+(?:\.\d+)?s)?|m\d+(?:\.\d+)?s|ms|µs|s)\b`)
	rateRE     = regexp.MustCompile(`\b\d+ msg/s\b`)
	// progressRE is a progress line of replay (dlq.WriteProgress) or of
	// export and import (internal/progress, plain).
	progressRE = regexp.MustCompile(`^(?:replay|export|import) \S+: \d+/\d+ `)
	numberRE   = regexp.MustCompile(`\d+`)
)

// elided, alone on a line of the page, stands for progress lines left out.
const elided = "..."

func normalise(line string) string {
	line = strings.TrimRight(line, " \t")
	line = rateRE.ReplaceAllString(line, "<rate> msg/s")
	return durationRE.ReplaceAllString(line, "<duration>")
}

func shape(line string) string { return numberRE.ReplaceAllString(normalise(line), "N") }

func isProgress(line string) bool { return progressRE.MatchString(line) }

// match compares a command's output with the page's lines, and says where
// the first difference is (i is the index of the page's line).
func match(want, got []string) (i int, err error) {
	j := 0
	for i < len(want) {
		if isProgress(want[i]) || want[i] == elided {
			k := i
			for k < len(want) && (isProgress(want[k]) || want[k] == elided) {
				k++
			}
			run := want[i:k]
			last := run[len(run)-1]
			if last == elided {
				return k - 1, errors.New(`"..." must be followed by the last progress line of the run`)
			}
			l := j
			for l < len(got) && isProgress(got[l]) {
				l++
			}
			if l == j {
				return i, fmt.Errorf("want progress lines, got %s", quoted(got, j))
			}
			if normalise(got[l-1]) != normalise(last) {
				return k - 1, fmt.Errorf("last progress line:\n  want %q\n  got  %q", last, got[l-1])
			}
			for _, g := range got[j : l-1] {
				if !slices.ContainsFunc(run, func(w string) bool { return w != elided && shape(w) == shape(g) }) {
					return i, fmt.Errorf("progress line %q has the shape of none shown", g)
				}
			}
			i, j = k, l
			continue
		}
		if j >= len(got) || normalise(want[i]) != normalise(got[j]) {
			return i, fmt.Errorf("\n  want %q\n  got  %s", want[i], quoted(got, j))
		}
		i++
		j++
	}
	if j < len(got) {
		return i, fmt.Errorf("more output than the page shows: %q", got[j])
	}
	return 0, nil
}

func quoted(lines []string, j int) string {
	if j >= len(lines) {
		return "the end of the output"
	}
	return fmt.Sprintf("%q", lines[j])
}

// ---- The DLQ the page starts from ----
//
// An order service's DLQ after its payment service was down for the night:
// every order placed meanwhile failed with 503 on each of its 10 attempts
// and was dead-lettered (max-attempts); among them, orders the order
// service refused by itself with 422 on their first attempt
// (non-retriable), and orders of orders-v1, the old checkout's queue,
// which has since been deleted. Everything is fixed by the message's
// place: ids, bodies, headers, times, so that what the tools print is the
// same on every run but for ages and speeds.

const (
	total    = 119_762
	rejected = 1_500 // 422, non-retriable
	retired  = 262   // 503, max-attempts, from the deleted orders-v1

	workQueue    = "orders"
	retiredQueue = "orders-v1"
)

type kind int

const (
	unavailable kind = iota
	refused
	orphaned
)

// layout is the kind of each message of the full DLQ, in order: a refused
// order every 79th message from the second on (1,500 of them), an orphaned
// one every 150th from the eighth on where no refused one is (262 of
// them), the rest unavailable.
func layout() []kind {
	out := make([]kind, total)
	nr, no := 0, 0
	for i := range out {
		switch {
		case i%79 == 1 && nr < rejected:
			out[i] = refused
			nr++
		case i%150 == 7 && no < retired:
			out[i] = orphaned
			no++
		}
	}
	if nr != rejected || no != retired {
		panic(fmt.Sprintf("layout: %d refused, %d orphaned", nr, no))
	}
	return out
}

// ---- Full and reduced ----
//
// The page's figures are those of the full DLQ, and HOPPER_INCIDENT_FULL=1
// (`make incident`) runs it: seeding and replaying 119,762 messages takes
// minutes. By default (`make check`) the run is reduced: the same DLQ with
// only the unavailable orders whose place is a multiple of thinning, and
// the first and the last message. Every refused and orphaned order is there, with the same
// place, id, body and headers, so that peek, the replay of orders-v1, the
// export and the last stats print exactly what the page shows; so do the
// oldest and newest times. What the thinning changes is four figures, each
// a count of unavailable orders plus fixed ones: the page's figure is
// rewritten to the reduced run's (rewrite) before the comparison, and, since
// the tools align their columns to the widest number, runs of spaces are
// compared as one space. The full run compares the page as it is.

// thinning keeps about one unavailable order in so many in a reduced run.
const thinning = 40

// scenario is the DLQ a run seeds: positions in the full DLQ, in order.
type scenario struct {
	full  bool
	index []int  // of each message in the full DLQ
	kinds []kind // of each message
}

func newScenario(full bool) *scenario {
	s := &scenario{full: full}
	all := layout()
	for i, k := range all {
		if full || k != unavailable || i%thinning == 0 || i == len(all)-1 {
			s.index = append(s.index, i)
			s.kinds = append(s.kinds, k)
		}
	}
	return s
}

func (s *scenario) count(k kind) int {
	n := 0
	for _, x := range s.kinds {
		if x == k {
			n++
		}
	}
	return n
}

// ids returns the message ids of the given kind, in DLQ order.
func (s *scenario) ids(k kind) []string {
	var out []string
	for j, x := range s.kinds {
		if x == k {
			out = append(out, messageID(s.index[j]))
		}
	}
	return out
}

// standsAlone says whether the number at line[i:j] stands alone: not part
// of a time, a date, a decimal or a name.
func standsAlone(line string, i, j int) bool {
	joins := func(c byte) bool {
		return c == '.' || c == ':' || c == '-' || c == '_' ||
			'0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
	}
	return (i == 0 || !joins(line[i-1])) && (j == len(line) || !joins(line[j]))
}

// rewrite turns a line of the page, written for the full DLQ, into what
// this run prints: the four counts that depend on the number of
// unavailable orders become this run's. A number is rewritten only where
// it stands alone, so that a time or an id never is.
func (s *scenario) rewrite(line string) string {
	if s.full {
		return line
	}
	unav := s.count(unavailable)
	figures := map[string]string{
		fmt.Sprint(total):                      fmt.Sprint(len(s.kinds)),
		fmt.Sprint(total - retired):            fmt.Sprint(len(s.kinds) - retired),  // from orders
		fmt.Sprint(total - rejected):           fmt.Sprint(len(s.kinds) - rejected), // 503, max-attempts
		fmt.Sprint(total - rejected - retired): fmt.Sprint(unav),                    // replayed
	}
	var b strings.Builder
	last := 0
	for _, m := range numberRE.FindAllStringIndex(line, -1) {
		to, ok := figures[line[m[0]:m[1]]]
		if !ok || !standsAlone(line, m[0], m[1]) {
			continue
		}
		b.WriteString(line[last:m[0]])
		b.WriteString(to)
		last = m[1]
	}
	b.WriteString(line[last:])
	return b.String()
}

var spacesRE = regexp.MustCompile(` {2,}`)

// lines returns the page's lines and the output's as this run compares
// them.
func (s *scenario) lines(want, got []string) ([]string, []string) {
	if s.full {
		return want, got
	}
	w := make([]string, len(want))
	for i, l := range want {
		w[i] = spacesRE.ReplaceAllString(s.rewrite(l), " ")
	}
	g := make([]string, len(got))
	for i, l := range got {
		g[i] = spacesRE.ReplaceAllString(l, " ")
	}
	return w, g
}

// firstDeadLetter is when the DLQ's first message was dead-lettered; one
// followed every 82 ms, so the last came 2h43m40s later.
var firstDeadLetter = time.Date(2025, 10, 12, 0, 2, 41, 0, time.UTC)

func messageID(i int) string { return fmt.Sprintf("ord-%07d", 4_180_000+i) }

// deadLetter is message i of the full DLQ, as Hopper dead-lettered it.
func deadLetter(i int, k kind) *msg.Message {
	id := messageID(i)
	at := firstDeadLetter.Add(time.Duration(i) * 82 * time.Millisecond)
	sku := 1000 + i*7919%9000
	queue, status, reason, attempts := workQueue, 503, "max-attempts", 10
	errText := `{"error":"payment capture failed: payments answered 503 Service Unavailable"}`
	// Ten attempts through the delay tiers took 14m37s.
	published := at.Add(-14*time.Minute - 37*time.Second)
	firstFailure := published.Add(180 * time.Millisecond)
	switch k {
	case refused:
		status, reason, attempts = 422, "non-retriable", 1
		errText = fmt.Sprintf(`{"error":"unknown sku SKU-%04d"}`, sku)
		published, firstFailure = at.Add(-140*time.Millisecond), at
	case orphaned:
		queue = retiredQueue
	}
	body := fmt.Sprintf(`{"orderId":"%s","customerId":"c-%06d","sku":"SKU-%04d","qty":%d,"total":"%d.%02d","currency":"EUR"}`,
		id, 100_000+i*31%900_000, sku, 1+i%3, 10+i%190, i*37%100)
	m := &msg.Message{
		MessageID: id, ContentType: "application/json", DeliveryMode: 2, AppID: "checkout",
		Timestamp: published.Truncate(time.Second), Headers: map[string]any{}, Body: []byte(body),
	}
	msg.RecordFailure(m.Headers, attempts, status, firstFailure)
	return msg.DLQCopy(m, msg.Info{Queue: queue, Exchange: "shop", RoutingKey: "order.placed"},
		msg.DeadLetter{Reason: reason, Status: status, Error: errText, Retries: attempts, Now: at})
}

// seed declares the config's queues and fills its DLQ, in order: one
// channel, many publishes awaiting their confirm at once.
func seed(t *testing.T, opts broker.Options, plan *topology.Plan, sc *scenario) {
	t.Helper()
	ctx := context.Background()
	if err := broker.Apply(ctx, opts, plan, true); err != nil {
		t.Fatal(err)
	}
	pub := broker.NewPublisher(broker.PublisherOptions{Options: opts, Channels: 1, ConfirmTimeout: time.Minute})
	defer pub.Close()
	// Fewer than the publisher's 256 publishes in flight, or Send would
	// wait for room that only these waits make.
	const window = 128
	var waits []func() error
	settle := func(w func() error) {
		if err := w(); err != nil {
			t.Fatalf("seed %s: %v", plan.DLQ.Name, err)
		}
	}
	for j, k := range sc.kinds {
		waits = append(waits, pub.Send(ctx, "", plan.DLQ.Name, deadLetter(sc.index[j], k)))
		if len(waits) == window {
			settle(waits[0])
			waits = waits[1:]
		}
	}
	for _, w := range waits {
		settle(w)
	}
}

// ---- Running the page ----

// shell runs the page's commands one by one with bash, in one folder, with
// the hopper just built first on the PATH and the broker's address in
// HOPPER_BROKER_URLS, as in the sidecar's pod.
type shell struct {
	bin  string
	dir  string
	env  []string
	last int // exit status of the previous command, which `echo $?` shows
}

func newShell(bin, dir, brokerURL string) *shell {
	s := &shell{bin: bin, dir: dir}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOPPER_") && !strings.HasPrefix(kv, "PATH=") {
			s.env = append(s.env, kv)
		}
	}
	s.env = append(s.env, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "HOPPER_BROKER_URLS="+brokerURL)
	return s
}

// run runs one command and returns what it printed, standard output and
// error on one pipe, in the order written, and its exit status.
func (s *shell) run(t *testing.T, st step) (lines []string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// `(exit N)` sets $? to the previous command's status.
	cmd := exec.CommandContext(ctx, "bash", "-c", fmt.Sprintf("(exit %d); %s", s.last, st.cmd))
	cmd.Dir, cmd.Env = s.dir, s.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%s:%d: %s: still running after 10 minutes; output so far:\n%s", page, st.line, st.cmd, out.String())
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%s:%d: %s: %v", page, st.line, st.cmd, err)
	}
	s.last = code
	text := strings.TrimSuffix(out.String(), "\n")
	if text == "" {
		return nil, code
	}
	return strings.Split(text, "\n"), code
}

// TestIncidentPage runs docs/incident.md against the DLQ it starts from,
// full or reduced (see above), and checks where its messages end: the
// replayed ones in the work queue, the refused ones in the export file,
// the orphaned ones still in the DLQ.
func TestIncidentPage(t *testing.T) {
	conf, steps := readPage(t)
	sc := newScenario(os.Getenv("HOPPER_INCIDENT_FULL") == "1")
	if !sc.full {
		t.Logf("reduced run: %d of the page's %d messages (HOPPER_INCIDENT_FULL=1 runs them all)", len(sc.kinds), total)
	}
	rb := node.Get(t)
	bin := hopper(t)
	dir := t.TempDir()
	path := filepath.Join(dir, configFile)
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := config.Load(path, nil)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		t.Fatalf("%s: the page's config: %v", page, err)
	}
	plan := topology.FromConfig(&cfg)
	if plan.Work.Name != workQueue {
		t.Fatalf("%s: the page's config consumes %q; the DLQ seeded is %q's", page, plan.Work.Name, workQueue)
	}
	opts := broker.Options{URLs: []string{rb.URL()}, ConnectTimeout: 10 * time.Second, Name: "incidentcheck"}

	began := time.Now()
	seed(t, opts, &plan, sc)
	t.Logf("seeded %s with %d messages in %s", plan.DLQ.Name, len(sc.kinds), time.Since(began).Round(time.Millisecond))

	// A command that held messages hands them back when it ends; the
	// time the broker takes to put them back grows faster than their
	// number, and the full DLQ's dry run holds 119,762.
	handBack := time.Minute
	if sc.full {
		handBack = 20 * time.Minute
	}
	sh := newShell(bin, dir, rb.URL())
	// The console of step 2, on the DLQ as the page's first commands
	// leave it: as seeded.
	checkConsole(t, sh, sc, plan.DLQ.Name, handBack)
	waitfor.Until(t, handBack, "every message the console held to be back in "+plan.DLQ.Name, func() bool {
		_, unacked, err := rb.QueueCounts(plan.DLQ.Name)
		return err == nil && unacked == 0
	})
	for k, st := range steps {
		began := time.Now()
		got, code := sh.run(t, st)
		t.Logf("%s:%d: %s (exit %d, %s)", page, st.line, st.cmd, code, time.Since(began).Round(time.Millisecond))
		if i, err := match(sc.lines(st.want, got)); err != nil {
			t.Errorf("%s:%d: %s: output differs from the page at line %d: %v\nwhole output:\n%s",
				page, st.line, st.cmd, st.outLine+i, err, strings.Join(got, "\n"))
		}
		if code != 0 && (k+1 == len(steps) || steps[k+1].cmd != "echo $?") {
			t.Errorf("%s:%d: %s: exit status %d, and the page does not show it (follow the command with `$ echo $?`)", page, st.line, st.cmd, code)
		}
		// A tool that has ended has handed back every message it held:
		// the next command sees the whole DLQ, as the page says.
		began = time.Now()
		waitfor.Until(t, handBack, fmt.Sprintf("every message %q held to be back in %s (no unacked message left)", st.cmd, plan.DLQ.Name), func() bool {
			_, unacked, err := rb.QueueCounts(plan.DLQ.Name)
			return err == nil && unacked == 0
		})
		t.Logf("handed back in %s", time.Since(began).Round(time.Millisecond))
	}

	checkEnd(t, opts, sc, plan.DLQ.Name, filepath.Join(dir, exportFile))
}

// exportFile is where the page exports the refused orders.
const exportFile = "orders-422.jsonl"

// checkEnd checks, apart from what the tools said, that nothing was lost:
// the work queue holds exactly the replayed orders (counted), the export
// file exactly the refused ones, and the DLQ exactly the orphaned ones.
func checkEnd(t *testing.T, opts broker.Options, sc *scenario, dlqName, file string) {
	t.Helper()
	want := map[kind][]string{}
	for _, k := range []kind{unavailable, refused, orphaned} {
		want[k] = sc.ids(k)
	}
	in, err := broker.OpenInspector(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if n, err := in.Depth(workQueue); err != nil || n != len(want[unavailable]) {
		t.Errorf("%s holds %d messages (%v); want the %d replayed", workQueue, n, err, len(want[unavailable]))
	}
	var left []string
	for {
		d, ok, err := in.Get(dlqName)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		left = append(left, d.Message().MessageID)
	}
	if !slices.Equal(left, want[orphaned]) {
		t.Errorf("%s holds %d messages; want the %d of %s, in order", dlqName, len(left), retired, retiredQueue)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var exported []string
	for _, line := range bytes.SplitAfter(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
		m, err := dlq.UnmarshalLine(line)
		if err != nil {
			t.Fatalf("%s: %v", exportFile, err)
		}
		exported = append(exported, m.MessageID)
	}
	if !slices.Equal(exported, want[refused]) {
		t.Errorf("%s holds %d messages; want the %d refused ones, in order", exportFile, len(exported), rejected)
	}
}

// TestMatch: a run matches the page when only durations, rates and the
// progress lines before a run's last differ, and not when anything else
// does.
func TestMatch(t *testing.T) {
	shown := []string{
		"replay: 119762 message(s) present in orders.dlq; this run handles at most those",
		"replay orders.dlq: 3998/119762 taken, 3934 recovered, 0 failed, 0 kept, 0 skipped, 64 in flight, 1967 msg/s, 2s, ETA 58s",
		elided,
		"replay orders.dlq: 119762/119762 taken, 118000 recovered, 0 failed, 0 kept, 1762 skipped, 0 in flight, 1998 msg/s, 59.061s",
		"Replay of orders.dlq: done after 59.061s",
		"recovered         118000  (1998 msg/s)",
		"oldest  2025-10-12T00:02:41Z  (3h02m ago)",
	}
	run := func(edit func([]string) []string) []string { return edit(slices.Clone(shown)) }
	same := []struct {
		name string
		got  []string
	}{
		{"as shown, but the elision", run(func(l []string) []string { return slices.Delete(l, 2, 3) })},
		{"no progress line before the last", run(func(l []string) []string { return slices.Delete(l, 1, 3) })},
		{"other times, rates and progress", []string{
			shown[0],
			"replay orders.dlq: 2001/119762 taken, 1937 recovered, 0 failed, 0 kept, 0 skipped, 64 in flight, 968 msg/s, 2.001s, ETA 1m58s",
			"replay orders.dlq: 4001/119762 taken, 3937 recovered, 0 failed, 0 kept, 0 skipped, 64 in flight, 984 msg/s, 4s, ETA 1m57s",
			"replay orders.dlq: 119762/119762 taken, 118000 recovered, 0 failed, 0 kept, 1762 skipped, 0 in flight, 999 msg/s, 1m58.1s",
			"Replay of orders.dlq: done after 1m58.1s",
			"recovered         118000  (999 msg/s)   ",
			"oldest  2025-10-12T00:02:41Z  (250d03h ago)",
		}},
	}
	for _, c := range same {
		if i, err := match(shown, c.got); err != nil {
			t.Errorf("%s: line %d: %v", c.name, i, err)
		}
	}
	differ := []struct {
		name string
		got  []string
	}{
		{"a count", run(func(l []string) []string { l[5] = "recovered         117999  (1998 msg/s)"; return l })},
		{"the last progress line's count", run(func(l []string) []string { l[3] = strings.Replace(l[3], "1762 skipped", "1761 skipped", 1); return l })},
		{"a timestamp", run(func(l []string) []string { l[6] = strings.Replace(l[6], "00:02:41Z", "00:02:42Z", 1); return l })},
		{"a word", run(func(l []string) []string { l[4] = strings.Replace(l[4], "done", "empty", 1); return l })},
		{"a progress line of another shape", run(func(l []string) []string {
			l[2] = "replay orders.dlq: 5000/119762 taken, 4936 recovered, 3 failed"
			return l
		})},
		{"no progress line", run(func(l []string) []string { return slices.Delete(l, 1, 4) })},
		{"a line missing", run(func(l []string) []string { return l[:len(l)-1] })},
		{"a line more", run(func(l []string) []string { return append(l, "newest  2025-10-12T02:46:21Z  (18m35s ago)") })},
	}
	for _, c := range differ {
		if _, err := match(shown, c.got); err == nil {
			t.Errorf("%s: matched the page", c.name)
		}
	}
}

// TestRewrite: a reduced run rewrites the four counts that depend on the
// number of unavailable orders, wherever they stand alone, and nothing
// else.
func TestRewrite(t *testing.T) {
	sc := newScenario(false)
	n, unav := len(sc.kinds), sc.count(unavailable)
	if sc.count(refused) != rejected || sc.count(orphaned) != retired || unav >= total/thinning+2 {
		t.Fatalf("reduced DLQ: %d refused, %d orphaned, %d unavailable", sc.count(refused), sc.count(orphaned), unav)
	}
	if sc.index[0] != 0 || sc.index[n-1] != total-1 {
		t.Fatalf("reduced DLQ runs from message %d to %d; want the first and the last", sc.index[0], sc.index[n-1])
	}
	cases := []struct{ page, want string }{
		{"depth   119762", fmt.Sprintf("depth   %d", n)},
		{"  orders           119500", fmt.Sprintf("  orders           %d", n-retired)},
		{"  503            118262", fmt.Sprintf("  503            %d", n-rejected)},
		{"replay orders.dlq: 119762/119762 taken, 118000 recovered, 0 failed, 0 kept, 1762 skipped, 0 in flight, 662 msg/s, 2m58.261s",
			fmt.Sprintf("replay orders.dlq: %d/%d taken, %d recovered, 0 failed, 0 kept, 1762 skipped, 0 in flight, 662 msg/s, 2m58.261s", n, n, unav)},
		{"--- 2 of 119762 message(s) in orders.dlq shown ---", fmt.Sprintf("--- 2 of %d message(s) in orders.dlq shown ---", n)},
		{"newest  2025-10-12T02:46:21Z  (18m39s ago)", "newest  2025-10-12T02:46:21Z  (18m39s ago)"},
		{"message-id:       ord-4180000", "message-id:       ord-4180000"},
		{"recovered          0     (0 msg/s)", "recovered          0     (0 msg/s)"},
	}
	for _, c := range cases {
		if got := sc.rewrite(c.page); got != c.want {
			t.Errorf("rewrite(%q)\n  = %q\n want %q", c.page, got, c.want)
		}
	}
	if full := newScenario(true); full.rewrite(cases[0].page) != cases[0].page || len(full.kinds) != total {
		t.Errorf("a full run rewrites the page, or seeds %d messages", len(full.kinds))
	}
}

// ---- The console ----
//
// Step 2 of the page opens the console on the DLQ as it is then and says
// what to look at: two failure groups, the 503s (all of orders' and
// orders-v1's, listing both queues) and the 422s (one group although every
// SKU differs). checkConsole starts `hopper dlq console` as the page
// does, waits for its scan and reads the groups from its API.

var listening = regexp.MustCompile(`listening on (http://[^ ]+/)`)

func checkConsole(t *testing.T, sh *shell, sc *scenario, dlqName string, scanFor time.Duration) {
	t.Helper()
	cmd := exec.Command(filepath.Join(sh.bin, "hopper"), "dlq", "console", "-c", configFile, "--listen", "127.0.0.1:0")
	cmd.Dir, cmd.Env = sh.dir, sh.env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	var logMu sync.Mutex
	urls := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			logMu.Lock()
			log.WriteString(s.Text() + "\n")
			logMu.Unlock()
			if m := listening.FindStringSubmatch(s.Text()); m != nil {
				urls <- m[1]
			}
		}
		close(urls)
	}()
	defer func() {
		cmd.Process.Signal(os.Interrupt) //nolint:errcheck // it may have exited already
		cmd.Wait()                       //nolint:errcheck // what it printed is what counts
		if t.Failed() {
			logMu.Lock()
			t.Logf("console log:\n%s", log.String())
			logMu.Unlock()
		}
	}()
	var base string
	select {
	case u, ok := <-urls:
		if !ok {
			t.Fatal("the console exited before listening")
		}
		base = u
	case <-time.After(time.Minute):
		t.Fatal("the console is not listening after 1m0s")
	}

	type groupsPage struct {
		Scanned   int              `json:"scanned"`
		ScannedAt time.Time        `json:"scannedAt"`
		Groups    []console.Group  `json:"groups"`
		Scan      *console.JobView `json:"scan"`
	}
	var (
		page groupsPage
		seen string // the last answer, for the failure message
	)
	defer func() {
		if t.Failed() {
			t.Logf("console: last answer %s", seen)
		}
	}()
	began := time.Now()
	waitfor.Until(t, scanFor, "the console's scan at start to end", func() bool {
		req, err := http.NewRequest(http.MethodGet, base+"api/dlqs/"+dlqName+"/groups", nil)
		if err != nil {
			t.Fatal(err)
		}
		// What the console's own page sends; its API answers nothing else.
		req.Header.Set("Hopper-Console", "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			seen = err.Error()
			return false
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		seen = fmt.Sprintf("%s: %s", resp.Status, body)
		page = groupsPage{}
		if err != nil || resp.StatusCode != http.StatusOK || json.Unmarshal(body, &page) != nil {
			return false
		}
		return !page.ScannedAt.IsZero() && (page.Scan == nil || page.Scan.State != console.StateRunning)
	})
	t.Logf("console: scanned %d messages in about %s", page.Scanned, time.Since(began).Round(time.Second))
	if page.Scan != nil && page.Scan.State != console.StateDone {
		t.Fatalf("console: the scan at start ended %s: %s", page.Scan.State, page.Scan.Error)
	}
	if page.Scanned != len(sc.kinds) {
		t.Errorf("console: scanned %d messages; want the %d of the DLQ", page.Scanned, len(sc.kinds))
	}
	want := map[string]struct {
		count  int
		queues []string
	}{
		"503": {len(sc.kinds) - rejected, []string{workQueue, retiredQueue}},
		"422": {rejected, []string{workQueue}},
	}
	if len(page.Groups) != len(want) {
		t.Errorf("console: %d failure groups; the page shows %d (503 and 422): %+v", len(page.Groups), len(want), page.Groups)
	}
	for _, g := range page.Groups {
		w, ok := want[g.Key.Status]
		queues := slices.Sorted(slices.Values(g.Queues))
		if !ok || g.Count != w.count || !slices.Equal(queues, w.queues) {
			t.Errorf("console: group %+v (%d messages from %v); want %d messages from %v", g.Key, g.Count, queues, w.count, w.queues)
		}
	}
}
