package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
)

func TestExitCode(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	listen := &net.OpError{Op: "listen", Net: "tcp", Err: syscall.EADDRINUSE}
	for _, c := range []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, exitOK},
		{"plain", errors.New("boom"), exitInternal},
		{"usage", usage(errors.New("--x: bad")), exitUsage},
		{"usage wrapped again", fmt.Errorf("context: %w", usage(errors.New("bad"))), exitUsage},
		{"config reported", badData(errReported), exitDataErr},
		{"temporary", tempFail(errors.New("interrupted")), exitTempFail},
		{"dial refused, wrapped twice", fmt.Errorf("connect to broker: %w", errors.Join(fmt.Errorf("amqp://h:5672/: %w", dial))), exitUnavailable},
		{"admin port in use is not the broker", fmt.Errorf("admin: %w", listen), exitInternal},
		// A run that lost its broker part way is one to run again.
		{"temporary over a dial error", tempFail(fmt.Errorf("replay: %w", dial)), exitTempFail},
	} {
		if got := exitCode(c.err); got != c.want {
			t.Errorf("%s: exitCode(%v) = %d, want %d", c.name, c.err, got, c.want)
		}
	}
	if err := usage(errors.New("--x: bad")); err.Error() != "--x: bad" {
		t.Errorf("a classified error reads %q, want the error alone", err.Error())
	}
	if !errors.Is(badData(errReported), errReported) {
		t.Error("a reported config error is no longer recognised as reported")
	}
}

// checkedLines passes a valid file through byte for byte, and stops at the
// first line the import could not decode, with its number; skipped and
// blank lines are not checked.
func TestCheckedLines(t *testing.T) {
	good, err := dlq.MarshalLine(&msg.Message{MessageID: "a", Body: []byte("x"), Headers: map[string]any{}}, "q.dlq")
	if err != nil {
		t.Fatal(err)
	}
	g := strings.TrimSuffix(string(good), "\n")
	read := func(file string, skip int) (string, error) {
		b, err := io.ReadAll(&checkedLines{r: bufio.NewReader(strings.NewReader(file)), skip: skip})
		return string(b), err
	}

	valid := g + "\n\n  \n" + g // blank lines, no final newline
	if out, err := read(valid, 0); err != nil || out != valid {
		t.Errorf("valid file: %q, %v", out, err)
	}
	// A bad line the import skips with --skip is passed on unchecked.
	if out, err := read("garbage\n"+g+"\n", 1); err != nil || out != "garbage\n"+g+"\n" {
		t.Errorf("skipped bad line: %q, %v", out, err)
	}
	for _, c := range []struct {
		file   string
		before string
		line   int
	}{
		{g + "\n{\"v\":1,\"nope\":2}\n" + g + "\n", g + "\n", 2},
		{g + "\n" + g + "\nnot json", g + "\n" + g + "\n", 3},
		{"[]\n", "", 1},
	} {
		out, err := read(c.file, 0)
		var bad *badLineError
		if !errors.As(err, &bad) || bad.n != c.line {
			t.Errorf("%q: err %v, want a bad line %d", c.file, err, c.line)
		}
		if out != c.before {
			t.Errorf("%q: passed on %q, want only the lines before the bad one %q", c.file, out, c.before)
		}
	}
}
