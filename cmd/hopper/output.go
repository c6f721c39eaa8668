package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
)

// checkTextOutput checks -o of the commands whose human form is text:
// config validate, topology, dlq purge.
func checkTextOutput(o string) error {
	if o != "text" && o != "json" {
		return usage(fmt.Errorf("--output %q: want text or json", o))
	}
	return nil
}

// jsonError is one problem in a -o json document. Key is the config key
// path a problem is about, Source the flag it came from (--set, --queue),
// Queue the work queue whose topology failed; each only when known.
type jsonError struct {
	Key     string `json:"key,omitempty"`
	Source  string `json:"source,omitempty"`
	Queue   string `json:"queue,omitempty"`
	Message string `json:"message"`
}

// failer is a -o json document that can carry the errors of a failed run.
type failer interface {
	fail([]jsonError)
}

// jsonResult writes doc as the one JSON document on standard output, with
// err's problems in it when the run failed. err is returned unchanged, so
// the exit status is the same as with -o text.
func jsonResult(cmd *cobra.Command, doc failer, err error) error {
	if err != nil {
		doc.fail(jsonErrors(err))
	}
	if werr := writeJSON(cmd.OutOrStdout(), doc); werr != nil && err == nil {
		return werr
	}
	return err
}

// problemLine is "[--flag: ]key.path[0].x: message", how config problems
// are reported.
var problemLine = regexp.MustCompile(`^(?:(--[a-z-]+): )?([A-Za-z][A-Za-z0-9]*(?:\[\d+\])?(?:\.[A-Za-z0-9]+(?:\[\d+\])?)*): (.*)$`)

// jsonErrors splits err into its problems: the config problems reported
// one per line, each with its key path, or the error itself.
func jsonErrors(err error) []jsonError {
	var rep *reportedProblems
	if !errors.As(err, &rep) {
		return []jsonError{{Message: err.Error()}}
	}
	out := make([]jsonError, 0, len(rep.lines))
	for _, l := range rep.lines {
		if m := problemLine.FindStringSubmatch(l); m != nil {
			out = append(out, jsonError{Source: m[1], Key: m[2], Message: m[3]})
			continue
		}
		out = append(out, jsonError{Message: l})
	}
	return out
}

// reportedProblems are config problems already printed one per line on
// standard error; -o json lists them again in its document.
type reportedProblems struct{ lines []string }

func (r *reportedProblems) Error() string {
	return fmt.Sprintf("invalid configuration: %s", strings.Join(r.lines, "; "))
}

// Is makes the problems errReported: main does not print them twice.
func (r *reportedProblems) Is(target error) bool { return target == errReported }
