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
