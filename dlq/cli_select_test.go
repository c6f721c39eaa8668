package dlq_test

// --message-id on replay and export, --limit on export: what a script uses
// to pull out the few messages an incident is about.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/dlq"
)

// fillIDs fills the test's DLQ with dead-lettered messages of these ids,
// in order.
func (e *env) fillIDs(ids ...string) {
	e.t.Helper()
	for _, id := range ids {
		e.fill(e.DLQ, deadMsg(id, e.Work, "k", "max-attempts", 503, time.Hour))
	}
}

// without is all minus drop, in all's order.
func without(all []string, drop ...string) []string {
	var out []string
	for _, s := range all {
		if !slices.Contains(drop, s) {
			out = append(out, s)
		}
	}
	return out
}

// fileIDs are the message ids of an export file's lines, in order.
func fileIDs(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if l == "" {
			continue
		}
		m, err := dlq.UnmarshalLine([]byte(l))
		if err != nil {
			t.Fatalf("export line %q: %v", l, err)
		}
		out = append(out, m.MessageID)
	}
	return out
}

func TestCLIReplayMessageID(t *testing.T) {
	all := []string{"m0", "m1", "m2", "m3", "m4", "m5"}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"repeated", []string{"--message-id", "m1", "--message-id", "m4"}, []string{"m1", "m4"}},
		{"comma list", []string{"--message-id", "m5,m0,m3"}, []string{"m0", "m3", "m5"}},
		{"both, with an id not present", []string{"--message-id", "m2,absent", "--message-id", "m3"}, []string{"m2", "m3"}},
		{"with another filter", []string{"--message-id", "m1,m2", "--reason", "non-retriable"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.fillIDs(all...)
			res, r := e.replayJSON(append([]string{"--dlq", e.DLQ}, tc.args...)...)
			if r.code != 0 {
				t.Fatalf("exit %d\n%s", r.code, r.stderr)
			}
			moved := ids(e.browse(e.Work))
			slices.Sort(moved)
			if !slices.Equal(moved, tc.want) {
				t.Errorf("moved %v, want %v", moved, tc.want)
			}
			if got, want := ids(e.browse(e.DLQ)), without(all, tc.want...); !slices.Equal(got, want) {
				t.Errorf("DLQ after %v, want %v in their order", got, want)
			}
			if res.Recovered != len(tc.want) || res.Skipped != len(all)-len(tc.want) {
				t.Errorf("recovered %d, skipped %d; want %d, %d", res.Recovered, res.Skipped, len(tc.want), len(all)-len(tc.want))
			}
		})
	}
}

func TestCLIExportMessageIDAndLimit(t *testing.T) {
	all := []string{"e0", "e1", "e2", "e3", "e4", "e5", "e6"}
	for _, tc := range []struct {
		name string
		args []string
		want []string // exported, in DLQ order
	}{
		{"message ids", []string{"--message-id", "e5,e1", "--message-id", "e3"}, []string{"e1", "e3", "e5"}},
		{"limit", []string{"--limit", "3"}, []string{"e0", "e1", "e2"}},
		{"limit counts matches only", []string{"--message-id", "e2,e4,e6", "--limit", "2"}, []string{"e2", "e4"}},
		{"limit above the depth", []string{"--limit", "100"}, all},
	} {
		for _, remove := range []bool{false, true} {
			name := tc.name
			if remove {
				name += " --remove"
			}
			t.Run(name, func(t *testing.T) {
				e := newEnv(t)
				e.fillIDs(all...)
				file := filepath.Join(t.TempDir(), "out.jsonl")
				args := append([]string{"export", "--dlq", e.DLQ, "--file", file, "-o", "json"}, tc.args...)
				if remove {
					args = append(args, "--remove")
				}
				r := e.ok(args...)
				var res dlq.ExportResult
				if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
					t.Fatalf("summary is not JSON: %v\n%s", err, r.stdout)
				}
				if got := fileIDs(t, file); !slices.Equal(got, tc.want) {
					t.Errorf("file holds %v, want %v", got, tc.want)
				}
				if res.Exported != len(tc.want) {
					t.Errorf("summary says %d exported, want %d", res.Exported, len(tc.want))
				}
				wantDLQ := all
				if remove {
					wantDLQ = without(all, tc.want...)
					if res.Removed != len(tc.want) {
						t.Errorf("summary says %d removed, want %d", res.Removed, len(tc.want))
					}
				}
				if got := ids(e.browse(e.DLQ)); !slices.Equal(got, wantDLQ) {
					t.Errorf("DLQ after %v, want %v in their order", got, wantDLQ)
				}
			})
		}
	}
}

// On a quorum DLQ messages are handed back by rotation, so an export that
// stops at --limit still goes round the rest: the DLQ keeps its order.
func TestCLIExportLimitQuorumKeepsOrder(t *testing.T) {
	e := newEnv(t)
	qdlq := e.quorumDLQ(5)
	var all []string
	for i := range 6 {
		id := "q" + strconv.Itoa(i)
		all = append(all, id)
		e.fill(qdlq, deadMsg(id, e.Work, "k", "max-attempts", 503, time.Hour))
	}
	file := filepath.Join(t.TempDir(), "out.jsonl")
	e.ok("export", "--dlq", qdlq, "--file", file, "--limit", "2", "--remove")
	if got := fileIDs(t, file); !slices.Equal(got, all[:2]) {
		t.Errorf("file holds %v, want %v", got, all[:2])
	}
	if got := ids(e.drain(qdlq)); !slices.Equal(got, all[2:]) {
		t.Errorf("quorum DLQ after %v, want %v", got, all[2:])
	}
}

// Bad selections are refused before anything connects.
func TestCLISelectionFlagsRefused(t *testing.T) {
	e := newEnv(t)
	e.fillIDs("x0", "x1")
	for _, args := range [][]string{
		{"export", "--file", "-", "--limit", "-1"},
		{"export", "--file", "-", "--message-id", ""},
		{"export", "--file", "-", "--message-id", "a,,b"},
		{"replay", "--message-id", ""},
		{"replay", "--reason", ""},
	} {
		r := e.run(append(args, "--dlq", e.DLQ)...)
		if r.code != 64 {
			t.Errorf("hopper dlq %s: exit %d, want 64\n%s", strings.Join(args, " "), r.code, r.stderr)
		}
		if !strings.Contains(r.stderr, "--limit") && !strings.Contains(r.stderr, "--message-id") && !strings.Contains(r.stderr, "--reason") {
			t.Errorf("hopper dlq %s: the error does not name the flag:\n%s", strings.Join(args, " "), r.stderr)
		}
	}
	if got := ids(e.browse(e.DLQ)); !slices.Equal(got, []string{"x0", "x1"}) {
		t.Errorf("DLQ after refused commands %v", got)
	}
}
