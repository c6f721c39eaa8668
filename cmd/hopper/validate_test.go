package main_test

import (
	"path/filepath"
	"strings"
	"testing"
)

// problems returns the "  - " lines of an invalid-configuration report.
func problems(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if p, ok := strings.CutPrefix(l, "  - "); ok {
			out = append(out, p)
		}
	}
	return out
}

// A missing config file is the problem to fix first: it is named as not
// found, and not buried under the required keys it would have set.
func TestConfigValidateMissingFileFirst(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent.yaml")
	for _, args := range [][]string{
		{"config", "validate", "--config", missing},
		{"config", "validate", "-c", missing, "--set", "nokey=1"},
		{"dlq", "stats", "--config", missing},
	} {
		r := hopper(t, args...)
		if r.code != exitDataErr {
			t.Errorf("hopper %s: exit %d, want %d\n%s", strings.Join(args, " "), r.code, exitDataErr, r.stderr)
			continue
		}
		ps := problems(r.stderr)
		if len(ps) == 0 || ps[0] != "config file "+missing+" not found" {
			t.Errorf("hopper %s: first problem is not the missing file:\n%s", strings.Join(args, " "), r.stderr)
		}
		if strings.Contains(r.stderr, "queue.name: required") {
			t.Errorf("hopper %s: reports queue.name as required although the file that would set it is missing:\n%s", strings.Join(args, " "), r.stderr)
		}
	}
	// Other problems of the command line still show in the same run.
	r := hopper(t, "config", "validate", "-c", missing, "--set", "nokey=1")
	if !strings.Contains(r.stderr, "nokey: unknown key") {
		t.Errorf("a bad --set next to a missing file is not reported:\n%s", r.stderr)
	}
}

// A negative duration is reported as given, from a flag as from a file.
func TestConfigValidateNegativeDurationAsGiven(t *testing.T) {
	r := hopper(t, "config", "validate", "--queue", "q", "--set", "app.timeout=-5s")
	if r.code != exitDataErr || !strings.Contains(r.stderr, "app.timeout: must be positive, got -5s") {
		t.Errorf("exit %d, want %d and the value as given:\n%s", r.code, exitDataErr, r.stderr)
	}
	file := configFile(t, "queue:\n  name: q\nbroker:\n  heartbeat: \"-30s\"\n")
	r = hopper(t, "config", "validate", "--config", file)
	if r.code != exitDataErr || !strings.Contains(r.stderr, "broker.heartbeat: must be positive, got -30s") {
		t.Errorf("exit %d, want %d and the value as given:\n%s", r.code, exitDataErr, r.stderr)
	}
}
