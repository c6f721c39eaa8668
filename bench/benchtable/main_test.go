package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sample is bench output as make bench-readme tees it: progress on
// standard error, tables, and the summary lines, out of the table's order.
const sample = `12:00:01 hopperbench: starting a private RabbitMQ node

hopperbench: backlog 100000 (retry, dlq, slow: 20000) x 256 B persistent (classic queue), prefetch 200, workers 64, publish channels 8, 3 run(s) per consumer, 2 CPUs, go1.24.0
happy    raw         13877     13000     14000       1.20       2.10       0.90     12.0     0.10
retry    ratio       1.120 (hopper/raw medians; per run pair: 1.100 1.120 1.130, their median 1.120)   cpu ratio 1.05
bench: slow20ms defaults=9022/s best_fixed=10860/s (prefetch 800/workers 400) ratio=0.831
bench: fair healthy_alone=12000/s healthy_beside_poison=10800/s ratio=0.900
bench: big size_kib=1024 hold=1s held_max=64 held_bound=64 rss_mb=134.6 rss_over_held_mb=70.6
bench: retry hopper=4567/s raw=4078/s ratio=1.120 cpu_ratio=1.05 rss_mb=24.1
bench: dlq hopper=6200.4/s raw=5900/s ratio=1.051 cpu_ratio=0.98 rss_mb=22.9
bench: defaults hopper=11603/s raw=9332/s ratio=1.243 cpu_ratio=1.12 rss_mb=25.4
bench: defaults-fixed defaults=11603/s fixed=12040/s (prefetch 200/workers 64) ratio=0.964 cpu_ratio=1.04 rss_mb=25.4 anon_mb=10.1 fixed_rss_mb=23.0 fixed_anon_mb=9.0
bench: batch-retry size=32 hopper=30100/s of_happy=0.781
bench: batch size=32 hopper=38543/s raw=13877/s floor=52598/s of_floor=0.733 ratio=2.777 cpu_ratio=0.41 rss_mb=19.2
bench: batch-raw size=32 rawbatch=31763/s ratio=1.213
bench: deep n=1000000 hopper=21525/s raw=16415/s ratio=1.311 batch=28894/s batch_ratio=1.760
bench: hopper=18021/s raw=13877/s ratio=1.299 p99_added_ms=0.031 rss_mb=23.7 cpu_ratio=1.13
dlqbench: starting a private RabbitMQ node
dlqbench: run 1/1: filling dlq with 100000 messages of 256 bytes
ratio:               0.95  (replay / raw)
bench: console-scan n=119762 secs=25.8 rss_mb=31.5
dlqbench: replay=1234567/s raw=1300000/s ratio=0.95 rss_mb=19.0 floor=1500000/s of_floor=0.82
`

const wantTable = `| path | Hopper | compared with | ratio | Hopper CPU vs compared | Hopper peak RSS |
|---|---|---|---|---|---|
| happy: every message answered 200 | 18,021 msg/s | raw loop: 13,877 msg/s | 1.299 | 1.13× | 23.7 MiB |
| retry: 503 once, then 200 after the delay tier | 4,567 msg/s | raw loop: 4,078 msg/s | 1.120 | 1.05× | 24.1 MiB |
| dlq: every message answered 400 | 6,200 msg/s | raw loop: 5,900 msg/s | 1.051 | 0.98× | 22.9 MiB |
| defaults: Hopper without consumer keys | 11,603 msg/s | raw loop: 9,332 msg/s | 1.243 | 1.12× | 25.4 MiB |
| defaults against a fixed setting, in the same runs | 11,603 msg/s | Hopper at prefetch 200 / workers 64: 12,040 msg/s | 0.964 | 1.04× | 25.4 MiB (10.1 anonymous) |
| slow: app answering after 20ms, Hopper at its defaults | 9,022 msg/s | best fixed, prefetch 800 / workers 400: 10,860 msg/s | 0.831 | — | — |
| fair: a healthy queue beside a poison queue, one Hopper | 10,800 msg/s | the same queue alone: 12,000 msg/s | 0.900 | — | — |
| big: 1024 KiB messages the app holds for 1s each, Hopper at its defaults | 64 held at once | prefetchBytes bound: 64 | — | — | 134.6 MiB (70.6 MiB over what was held) |
| batch: 32 messages per request, every one answered 200 | 38,543 msg/s | raw loop, one POST per message: 13,877 msg/s; broker floor (a consumer process of the same prefetch, no app: consume → multiple-ack every 32): 52,598 msg/s, batches at 0.73 of it | 2.777 | 0.41× | 19.2 MiB |
| batch: 32 messages per request, against a hand-written batching loop | 38,543 msg/s | raw batching loop (consume 32 → one POST → multiple-ack): 31,763 msg/s | 1.213 | — | — |
| batch-retry: 32 messages per request, every 10th answered 503 once, then 200 after the delay tier | 30,100 msg/s | the same batches, every entry answered 200: 38,543 msg/s | 0.781 | — | — |
| deep: a backlog of 1,000,000 messages, one request per message | 21,525 msg/s | raw loop: 16,415 msg/s | 1.311 | — | — |
| deep: a backlog of 1,000,000 messages, in batches of up to the batch path's size | 28,894 msg/s | raw loop: 16,415 msg/s | 1.760 | — | — |
| ` + "`hopper dlq replay`" + ` | 1,234,567 msg/s | raw get → publish → ack loop: 1,300,000 msg/s; broker floor (consume → pipelined publish → multiple-ack): 1,500,000 msg/s, replay at 0.82 of it | 0.95 | — | 19.0 MiB |
| ` + "`hopper dlq console`" + `: a scan grouping a DLQ of 119,762 messages | 25.8 s (4,642 msg/s) | — | — | — | 31.5 MiB |
`

const readme = `# Hopper

Some prose.

<!-- bench-table:begin -->
(run ` + "`make bench-readme`" + ` to fill this table)
<!-- bench-table:end -->

More prose.
`

func writeReadme(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "README.md")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func runTool(t *testing.T, input string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, strings.NewReader(input), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestTableFromEveryLine(t *testing.T) {
	fig, err := parse(strings.NewReader(sample), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if got := fig.table(); got != wantTable {
		t.Errorf("table:\n%s\nwant:\n%s", got, wantTable)
	}
	if fig.p99Added != "0.031" {
		t.Errorf("p99 added %q, want 0.031", fig.p99Added)
	}
}

func TestRewritesOnlyTheBlock(t *testing.T) {
	path := writeReadme(t, readme)
	cmd := `make bench-readme BENCHFLAGS="--runs 3"`
	code, stdout, stderr := runTool(t, sample, "--readme", path, "--command", cmd)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if stdout != wantTable {
		t.Errorf("stdout:\n%s\nwant the table", stdout)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "# Hopper\n\nSome prose.\n\n" + beginMarker + "\n" +
		"<!-- generated by bench/benchtable from bench output; rerun the command, do not edit by hand -->\n" +
		"Figures of one run of `" + cmd + "`; hopperbench settings: backlog 100000 (retry, dlq, slow: 20000) x 256 B persistent (classic queue), prefetch 200, workers 64, publish channels 8, 3 run(s) per consumer, 2 CPUs, go1.24.0.\n\n" +
		wantTable +
		"\nLatency Hopper adds at p99 (publish → app receipt, idle queues, hopper − raw): 0.031 ms.\n" +
		endMarker + "\n\nMore prose.\n"
	if string(got) != want {
		t.Errorf("README:\n%s\nwant:\n%s", got, want)
	}

	// A second run over its own output gives the same file.
	if code, _, stderr := runTool(t, sample, "--readme", path, "--command", cmd); code != 0 {
		t.Fatalf("second run: exit %d: %s", code, stderr)
	}
	again, _ := os.ReadFile(path)
	if string(again) != want {
		t.Errorf("second run changed the README:\n%s", again)
	}
}

func TestSomePathsOnly(t *testing.T) {
	// An older happy line (no cpu_ratio), the latency test skipped, and
	// dlqbench alone: only those rows, no latency sentence, no settings.
	in := "bench: hopper=2000/s raw=1999.5/s ratio=1.000 p99_added_ms=n/a rss_mb=20.0\n" +
		"dlqbench: replay=950/s raw=1000/s ratio=0.95 rss_mb=18.5\n"
	path := writeReadme(t, readme)
	code, _, stderr := runTool(t, in, "--readme", path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	got, _ := os.ReadFile(path)
	want := beginMarker + "\n" +
		"<!-- generated by bench/benchtable from bench output; rerun the command, do not edit by hand -->\n" +
		"Figures of one bench run.\n\n" +
		"| path | Hopper | compared with | ratio | Hopper CPU vs compared | Hopper peak RSS |\n" +
		"|---|---|---|---|---|---|\n" +
		"| happy: every message answered 200 | 2,000 msg/s | raw loop: 2,000 msg/s | 1.000 | — | 20.0 MiB |\n" +
		"| `hopper dlq replay` | 950 msg/s | raw get → publish → ack loop: 1,000 msg/s | 0.95 | — | 18.5 MiB |\n" +
		"\n" + endMarker + "\n"
	if !strings.Contains(string(got), want) {
		t.Errorf("README:\n%s\nwant it to hold:\n%s", got, want)
	}
}

func TestLastLineOfAPathWins(t *testing.T) {
	in := "bench: retry hopper=1000/s raw=1000/s ratio=1.000 cpu_ratio=1.00 rss_mb=20.0\n" +
		"bench: retry hopper=3000/s raw=2000/s ratio=1.500 cpu_ratio=0.90 rss_mb=21.0\n"
	fig, err := parse(strings.NewReader(in), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if r := fig.rows["retry"]; r.hopper != "3,000 msg/s" || r.ratio != "1.500" || len(fig.rows) != 1 {
		t.Errorf("rows %+v", fig.rows)
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name, readme, input string
		want                []string // in the error message
	}{
		{"no markers", "# Hopper\n\nno table here\n", sample,
			[]string{"no bench-table block", beginMarker, endMarker}},
		{"begin only", "a\n" + beginMarker + "\nb\n", sample,
			[]string{"no bench-table block", beginMarker, endMarker}},
		{"end only", "a\n" + endMarker + "\n", sample,
			[]string{"no bench-table block", beginMarker, endMarker}},
		{"end before begin", endMarker + "\n" + beginMarker + "\n", sample,
			[]string{endMarker + " comes before " + beginMarker}},
		{"two blocks", readme + readme, sample,
			[]string{"more than one " + beginMarker}},
		{"no figures", readme, "hopperbench: backlog 10 x 256 B\ndlqbench: starting a private RabbitMQ node\nsome other line\n",
			[]string{"no figures in the input"}},
		{"empty input", readme, "", []string{"no figures in the input"}},
		{"rate missing", readme, "bench: dlq hopper=100/s ratio=1.0 cpu_ratio=1.0 rss_mb=1.0\n",
			[]string{"no raw=", "bench: dlq"}},
		{"rate not a number", readme, "bench: hopper=fast/s raw=100/s ratio=1.0 p99_added_ms=n/a rss_mb=1.0\n",
			[]string{"hopper=fast/s is not a rate"}},
		{"big without its bound", readme, "bench: big size_kib=1024 hold=1s held_max=64 rss_mb=134.6 rss_over_held_mb=70.6\n",
			[]string{"no held_bound=", "bench: big"}},
		{"batch without its floor", readme, "bench: batch size=32 hopper=100/s raw=50/s of_floor=0.5 ratio=2.0 cpu_ratio=0.5 rss_mb=1.0\n",
			[]string{"no floor=", "bench: batch"}},
		{"batch without its size", readme, "bench: batch-raw rawbatch=100/s ratio=1.0\n",
			[]string{"no size=", "bench: batch-raw"}},
		{"console scan without its time", readme, "bench: console-scan n=1000 rss_mb=20.0\n",
			[]string{"no secs=", "bench: console-scan"}},
		{"console scan in no time", readme, "bench: console-scan n=1000 secs=0.0 rss_mb=20.0\n",
			[]string{"secs=0.0 is not a duration"}},
		{"batch-raw rate not a rate", readme, "bench: batch-raw size=32 rawbatch=-5/s ratio=1.0\n",
			[]string{"rawbatch=-5/s is not a rate"}},
		{"batch-retry without of_happy", readme, "bench: batch-retry size=32 hopper=100/s\n",
			[]string{"no of_happy=", "bench: batch-retry"}},
		{"ratio not a number", readme, "dlqbench: replay=100/s raw=100/s ratio=NaN rss_mb=1.0\n",
			[]string{"ratio=NaN is not a number"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeReadme(t, tc.readme)
			code, stdout, stderr := runTool(t, tc.input, "--readme", path)
			if code == 0 {
				t.Fatalf("exit 0, want an error; stdout:\n%s", stdout)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("error %q does not name %q", stderr, w)
				}
			}
			if got, _ := os.ReadFile(path); string(got) != tc.readme {
				t.Errorf("README changed on error:\n%s", got)
			}
		})
	}
}

func TestMissingReadme(t *testing.T) {
	code, _, stderr := runTool(t, sample, "--readme", filepath.Join(t.TempDir(), "nope.md"))
	if code == 0 || !strings.Contains(stderr, "nope.md") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 7: "7", 999: "999", 1000: "1,000", 11603: "11,603",
		123456: "123,456", 1234567: "1,234,567", -1234: "-1,234"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestUnknownPathIgnored(t *testing.T) {
	var warn bytes.Buffer
	fig, err := parse(strings.NewReader("bench: someday x=1\nbench: dlq hopper=1/s raw=1/s ratio=1.000 cpu_ratio=1.00 rss_mb=1.0\n"), &warn)
	if err != nil {
		t.Fatal(err)
	}
	if len(fig.rows) != 1 || !strings.Contains(warn.String(), `"someday"`) {
		t.Errorf("rows %v, warnings %q", fig.rows, warn.String())
	}
}

func TestBatchRowsWithoutTheBatchLine(t *testing.T) {
	// The batch-raw and batch-retry lines alone: no rate of Hopper's happy
	// batches to show beside them.
	in := "bench: batch-raw size=16 rawbatch=20000/s ratio=1.100\n" +
		"bench: batch-retry size=16 hopper=15000/s of_happy=0.680\n"
	fig, err := parse(strings.NewReader(in), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := "| path | Hopper | compared with | ratio | Hopper CPU vs compared | Hopper peak RSS |\n" +
		"|---|---|---|---|---|---|\n" +
		"| batch: 16 messages per request, against a hand-written batching loop | — | raw batching loop (consume 16 → one POST → multiple-ack): 20,000 msg/s | 1.100 | — | — |\n" +
		"| batch-retry: 16 messages per request, every 10th answered 503 once, then 200 after the delay tier | 15,000 msg/s | the same batches, every entry answered 200: — | 0.680 | — | — |\n"
	if got := fig.table(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}

func TestCurrentOutput(t *testing.T) {
	// The settings line naming the broker, anon_mb on the lines that have
	// it, and the baseline lines of --baseline-bin, which are not rows.
	in := "hopperbench: RabbitMQ 4.3.6, backlog 20000 (retry, dlq, slow: 20000) x 256 B persistent (classic queue), prefetch 200, workers 64\n" +
		"baseline: retry base=900/s raw=1000/s ratio=0.900 cpu_ratio=1.40 rss_mb=27.0 anon_mb=12.5\n" +
		"bench: retry hopper=1000/s raw=1000/s ratio=1.000 cpu_ratio=1.10 rss_mb=21.0 anon_mb=6.5\n" +
		"bench: hopper=2000/s raw=2000/s ratio=1.000 p99_added_ms=n/a rss_mb=20.0 cpu_ratio=1.05 anon_mb=5.9\n"
	var warn bytes.Buffer
	fig, err := parse(strings.NewReader(in), &warn)
	if err != nil {
		t.Fatal(err)
	}
	if want := "RabbitMQ 4.3.6, backlog 20000 (retry, dlq, slow: 20000) x 256 B persistent (classic queue), prefetch 200, workers 64"; fig.settings != want {
		t.Errorf("settings %q, want %q", fig.settings, want)
	}
	if got := fig.rows["retry"].rss; got != "21.0 MiB (6.5 anonymous)" {
		t.Errorf("retry RSS %q", got)
	}
	if got := fig.rows["happy"].rss; got != "20.0 MiB (5.9 anonymous)" {
		t.Errorf("happy RSS %q", got)
	}
	if len(fig.rows) != 2 || warn.Len() != 0 {
		t.Errorf("rows %v, warnings %q", fig.rows, warn.String())
	}
	if _, err := parse(strings.NewReader("bench: dlq hopper=1/s raw=1/s ratio=1.000 cpu_ratio=1.00 rss_mb=1.0 anon_mb=x\n"), &warn); err == nil {
		t.Error("anon_mb=x: no error")
	}
}
