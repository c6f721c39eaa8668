package main

// The broker-backed tests of the dlq commands run the built binary from
// dlq/cli_test.go; these cover the pieces that need no broker.

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/dlq"
)

func TestConfirmPurge(t *testing.T) {
	for _, tc := range []struct {
		in       string
		terminal bool
		want     bool
		err      error
	}{
		{"yes\n", true, true, nil},
		{"orders.dlq\n", true, true, nil},
		{"  yes  \n", true, true, nil},
		{"y\n", true, false, nil},
		{"\n", true, false, nil},
		{"", true, false, nil},
		{"yes\n", false, false, errNoTerminal},
	} {
		var out bytes.Buffer
		got, err := confirmPurge(strings.NewReader(tc.in), &out, tc.terminal, "orders.dlq", 42)
		if got != tc.want || !errors.Is(err, tc.err) {
			t.Errorf("%q terminal=%v: %v %v, want %v %v", tc.in, tc.terminal, got, err, tc.want, tc.err)
		}
		if tc.terminal && !strings.Contains(out.String(), "Delete all 42 message(s) in orders.dlq?") {
			t.Errorf("prompt %q", out.String())
		}
	}
}

func TestIsTerminal(t *testing.T) {
	if isTerminal(strings.NewReader("yes")) {
		t.Error("a reader is a terminal")
	}
	f, err := os.CreateTemp(t.TempDir(), "stdin")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isTerminal(f) {
		t.Error("a regular file is a terminal")
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if isTerminal(null) {
		t.Error("/dev/null (a container's standard input) is a terminal")
	}
}

func TestFilterFlags(t *testing.T) {
	ff := filterFlags{headers: []string{"tenant=acme", "flag"}, statuses: []string{"5xx"}, olderThan: time.Hour}
	f, err := ff.filter()
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Headers) != 2 || f.Headers[0].Value != "acme" || !f.Headers[1].AnyValue || f.OlderThan != time.Hour {
		t.Errorf("filter %+v", f)
	}
	for _, bad := range []filterFlags{
		{headers: []string{"=v"}},
		{statuses: []string{"5x"}},
		{olderThan: time.Hour, newerThan: time.Minute},
	} {
		if _, err := bad.filter(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// A typo at any level is an error with a suggestion, never a help page
// and exit 0; each tool lists only the flags it uses; version prints.
func TestCLITyposAndFlags(t *testing.T) {
	for _, args := range [][]string{{"dlq", "purg"}, {"config", "validat"}, {"topology", "plna"}} {
		var out, errb bytes.Buffer
		root := newRoot(&out, &errb)
		root.SetArgs(args)
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), "Did you mean this?") {
			t.Errorf("hopper %s: err %v, want an unknown-command error with a suggestion", strings.Join(args, " "), err)
		}
	}
	var out, errb bytes.Buffer
	root := newRoot(&out, &errb)
	root.SetArgs([]string{"dlq", "purge", "--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "--workers") || !strings.Contains(out.String(), "--dlq") {
		t.Errorf("dlq purge --help lists flags of run, or lacks its own:\n%s", out.String())
	}
	out.Reset()
	root = newRoot(&out, &errb)
	root.SetArgs([]string{"version"})
	if err := root.Execute(); err != nil || !strings.HasPrefix(out.String(), "hopper ") {
		t.Errorf("version: %q, %v", out.String(), err)
	}
}

// helpOf runs `hopper <args> --help` in process and returns what it
// printed.
func helpOf(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	root := newRoot(&out, &errb)
	root.SetArgs(append(args, "--help"))
	if err := root.Execute(); err != nil {
		t.Fatalf("hopper %s --help: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}

// Each subcommand's help lists the flags it acts on and none it would
// ignore: the app URL means nothing to a tool that never calls the app,
// nor the broker URL to one that never connects.
func TestHelpListsOnlyUsedFlags(t *testing.T) {
	for _, tc := range []struct {
		cmd        []string
		want, none []string
	}{
		{[]string{"run"}, []string{"--app-url", "--broker-url", "--queue", "--prefetch", "--workers", "--admin-listen", "--log-level"}, nil},
		{[]string{"config", "validate"}, []string{"--app-url", "--broker-url", "--queue", "--prefetch", "--workers", "--admin-listen"}, nil},
		{[]string{"topology", "plan"}, []string{"--queue", "--config", "--set", "--output"}, []string{"--app-url", "--broker-url", "--prefetch", "--workers", "--admin-listen", "--log-level"}},
		{[]string{"topology", "apply"}, []string{"--queue", "--broker-url", "--log-level"}, []string{"--app-url", "--prefetch", "--workers", "--admin-listen"}},
		{[]string{"topology", "verify"}, []string{"--queue", "--broker-url", "--log-level"}, []string{"--app-url", "--prefetch", "--workers", "--admin-listen"}},
		{[]string{"dlq", "stats"}, []string{"--dlq", "--queue", "--broker-url", "--output"}, []string{"--app-url", "--prefetch", "--workers", "--admin-listen"}},
		{[]string{"dlq", "peek"}, []string{"--dlq", "--broker-url"}, []string{"--app-url", "--workers"}},
		{[]string{"dlq", "replay"}, []string{"--dlq", "--broker-url", "--reason", "--status"}, []string{"--app-url", "--workers"}},
		{[]string{"dlq", "export"}, []string{"--dlq", "--broker-url", "--reason", "--file"}, []string{"--app-url", "--workers"}},
		{[]string{"dlq", "import"}, []string{"--dlq", "--broker-url", "--file"}, []string{"--app-url", "--workers", "--reason"}},
		{[]string{"dlq", "purge"}, []string{"--dlq", "--broker-url", "--yes"}, []string{"--app-url", "--workers", "--reason"}},
	} {
		help := helpOf(t, tc.cmd...)
		for _, f := range tc.want {
			if !strings.Contains(help, f+" ") {
				t.Errorf("hopper %s --help lacks %s:\n%s", strings.Join(tc.cmd, " "), f, help)
			}
		}
		for _, f := range tc.none {
			if strings.Contains(help, f+" ") {
				t.Errorf("hopper %s --help lists %s, which it does not use:\n%s", strings.Join(tc.cmd, " "), f, help)
			}
		}
	}
}

// The --reason help lists every reason once: expired is both Hopper's
// (deadline) and the broker's (TTL), and used to show twice.
func TestReasonHelpListsEachOnce(t *testing.T) {
	help := helpOf(t, "dlq", "replay")
	var line string
	for _, l := range strings.Split(help, "\n") {
		if strings.Contains(l, "--reason") {
			line = l
		}
	}
	for _, r := range dlq.Reasons() {
		if n := strings.Count(line, r); n != 1 {
			t.Errorf("--reason help names %q %d times:\n%s", r, n, line)
		}
	}
	seen := map[string]bool{}
	for _, r := range dlq.Reasons() {
		if seen[r] {
			t.Errorf("dlq.Reasons() lists %q twice: %v", r, dlq.Reasons())
		}
		seen[r] = true
	}
}

// -v is not --version: kubectl and most tools around a broker use -v for
// verbosity, so Hopper leaves it unassigned (a usage error) rather than
// have scripts come to rely on another meaning. --version and the version
// command print the version.
func TestShortVVersionConvention(t *testing.T) {
	var out, errb bytes.Buffer
	root := newRoot(&out, &errb)
	root.SetArgs([]string{"-v"})
	err := root.Execute()
	if err == nil || exitCode(err) != exitUsage {
		t.Errorf("hopper -v: err %v (exit %d), output %q; want a usage error", err, exitCode(err), out.String())
	}
	out.Reset()
	root = newRoot(&out, &errb)
	root.SetArgs([]string{"--version"})
	if err := root.Execute(); err != nil || !strings.Contains(out.String(), "hopper") {
		t.Errorf("hopper --version: %q, %v", out.String(), err)
	}
	if help := helpOf(t); strings.Contains(help, "-v,") {
		t.Errorf("hopper --help offers -v:\n%s", help)
	}
}

// A --status outside what the filter accepts is refused before anything
// connects, naming the flag, the value as given and what is accepted.
func TestStatusFilterRefusedWithWhatIsAccepted(t *testing.T) {
	for _, given := range []string{"7xx", "600", "5x", "abc", "99"} {
		ff := filterFlags{statuses: []string{"5xx", given}}
		_, err := ff.filter()
		if err == nil {
			t.Errorf("--status %s accepted", given)
			continue
		}
		if exitCode(err) != exitUsage {
			t.Errorf("--status %s: exit %d, want %d", given, exitCode(err), exitUsage)
		}
		msg := err.Error()
		for _, want := range []string{`--status "` + given + `"`, "100-599", "1xx-5xx", "0 for no response"} {
			if !strings.Contains(msg, want) {
				t.Errorf("--status %s: error %q lacks %q", given, msg, want)
			}
		}
	}
}
