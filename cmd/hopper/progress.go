package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/hopper-sidecar/hopper/internal/progress"
)

// registerProgress adds --progress to a long-running DLQ tool.
func registerProgress(fs *pflag.FlagSet, mode *string) {
	fs.StringVar(mode, "progress", progress.Auto,
		"progress on standard error: auto (a bar on a terminal, else a line every 5s), bar, plain or none")
}

// checkProgress refuses an unknown --progress before anything runs.
func checkProgress(mode string) error {
	if !slices.Contains(progress.Modes, mode) {
		return usage(fmt.Errorf("--progress %q: want one of %s", mode, strings.Join(progress.Modes, ", ")))
	}
	return nil
}

// newProgress is the reporter of one run, on the command's standard error.
func newProgress(cmd *cobra.Command, what, mode string) (progress.Reporter, error) {
	return progress.New(cmd.ErrOrStderr(), progress.Options{What: what, Mode: mode})
}

// usesBar reports whether mode draws a bar on w.
func usesBar(w io.Writer, mode string) bool {
	return mode == progress.Bar || (mode == progress.Auto && progress.IsTerminal(w))
}

// countLines counts the lines of a file, for an import's total; 0 when it
// cannot tell (standard input).
func countLines(path string) int64 {
	if path == "-" {
		return 0
	}
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	var n int64
	r := bufio.NewReaderSize(f, 1<<20)
	buf := make([]byte, 1<<20)
	last := byte('\n')
	for {
		k, err := r.Read(buf)
		if k > 0 {
			n += int64(bytes.Count(buf[:k], []byte{'\n'}))
			last = buf[k-1]
		}
		if err != nil {
			break
		}
	}
	if last != '\n' {
		n++
	}
	return n
}
