package main

import (
	"errors"
	"net"

	"github.com/hopper-sidecar/hopper/streamsrc"
)

// Exit statuses are a contract scripts branch on. They follow sysexits(3),
// as rabbitmqctl does, so one wrapper script can handle both tools.
const (
	exitOK          = 0
	exitInternal    = 1  // anything not classified below
	exitForced      = 2  // run stopped by a second signal, without waiting for in-flight messages
	exitUsage       = 64 // EX_USAGE: unknown command, bad flag or flag value, missing argument
	exitDataErr     = 65 // EX_DATAERR: config invalid or unreadable, import file not valid
	exitUnavailable = 69 // EX_UNAVAILABLE: the broker could not be connected to
	exitTempFail    = 75 // EX_TEMPFAIL: a tool stopped part way or was interrupted; run it again
)

// exitCodes is the table in `hopper --help`.
const exitCodes = `Exit status:
  0   success
  1   internal error (anything not listed here)
  2   run: stopped at once by a second signal (nothing undelivered is acked)
  64  usage: unknown command, bad flag or flag value, missing argument
  65  bad config or data: config invalid or unreadable, import file not valid
  69  broker unavailable: no connection could be made
  75  temporary failure: a DLQ tool moved some messages and not others, was
      interrupted, or found the DLQ owned by another tool; run it again`

// Classes of failure, wrapped around an error where it arises (usage,
// badData, tempFail) so that exitCode can tell them apart wherever the
// error ends up.
var (
	errUsage    = errors.New("usage")
	errBadData  = errors.New("bad config or data")
	errTempFail = errors.New("temporary failure")
)

// classified is an error marked with its class; it reads as the error
// alone.
type classified struct {
	class, err error
}

func (c *classified) Error() string   { return c.err.Error() }
func (c *classified) Unwrap() []error { return []error{c.class, c.err} }

func classify(class, err error) error {
	if err == nil {
		return nil
	}
	return &classified{class: class, err: err}
}

// usage marks a mistake in the command line.
func usage(err error) error { return classify(errUsage, err) }

// badData marks config or input data that cannot be used as it is.
func badData(err error) error { return classify(errBadData, err) }

// tempFail marks a run that stopped before its end and may be run again.
func tempFail(err error) error { return classify(errTempFail, err) }

// exitCode maps an error to the process's exit status: the one place every
// subcommand's outcome becomes a number. An explicit class wins; a failed
// dial to the broker is recognised by the network error under the broker
// package's "connect to broker" (only the dial step reports Op "dial", so
// an admin port already in use, a "listen" error, is not mistaken for it).
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	switch {
	case errors.Is(err, errUsage):
		return exitUsage
	case errors.Is(err, errBadData), errors.Is(err, streamsrc.ErrNoSingleActive), errors.Is(err, streamsrc.ErrNoSuperStream):
		// The config asks for what this broker cannot do.
		return exitDataErr
	case errors.Is(err, errTempFail):
		return exitTempFail
	case brokerUnavailable(err):
		return exitUnavailable
	}
	return exitInternal
}

// brokerUnavailable reports whether err is a failure to reach the broker
// at all: refused, unreachable, a name that does not resolve, or a dial
// that timed out.
func brokerUnavailable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
