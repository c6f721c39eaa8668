package dlq_test

// --dry-run on the tools that change the broker: each reads, counts and
// filters like the real run, and changes nothing; the counts it prints are
// what the real run then does.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/dlq"
	"github.com/hopper-sidecar/hopper/msg"
)

// jsonOut runs a command that must succeed and decodes its stdout.
func jsonOut[T any](e *env, args ...string) (T, result) {
	e.t.Helper()
	r := e.ok(args...)
	var v T
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		e.t.Fatalf("hopper dlq %s: stdout is not one JSON document (%v):\n%s", strings.Join(args, " "), err, r.stdout)
	}
	return v, r
}

// purgeDoc is the JSON document of dlq purge.
type purgeDoc struct {
	OK         bool   `json:"ok"`
	DLQ        string `json:"dlq"`
	DryRun     bool   `json:"dryRun"`
	Purged     int    `json:"purged"`
	WouldPurge int    `json:"wouldPurge"`
}

func TestCLIPurgeDryRun(t *testing.T) {
	e := newEnv(t)
	all := []string{"p0", "p1", "p2", "p3", "p4"}
	e.fillIDs(all...)
	// No --yes and no terminal: a dry run deletes nothing, so it needs no
	// confirmation.
	r := e.ok("purge", "--dlq", e.DLQ, "--dry-run")
	if !strings.Contains(r.stdout, "would purge 5 message(s) from "+e.DLQ) {
		t.Errorf("dry run output:\n%s", r.stdout)
	}
	dry, _ := jsonOut[purgeDoc](e, "purge", "--dlq", e.DLQ, "--dry-run", "-o", "json")
	if !dry.OK || !dry.DryRun || dry.WouldPurge != 5 || dry.Purged != 0 || dry.DLQ != e.DLQ {
		t.Errorf("dry run document %+v", dry)
	}
	if got := ids(e.browse(e.DLQ)); !slices.Equal(got, all) {
		t.Fatalf("DLQ after dry runs %v, want %v", got, all)
	}
	// A refused purge is a document too, with the exit status of text.
	r = e.run("purge", "--dlq", e.DLQ, "-o", "json")
	var refused struct {
		OK     bool `json:"ok"`
		Errors []struct {
			Message string `json:"message"`
		} `json:"errors"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &refused); err != nil || r.code != 64 || refused.OK ||
		len(refused.Errors) != 1 || !strings.Contains(refused.Errors[0].Message, "not a terminal") {
		t.Errorf("purge -o json without --yes: exit %d, %v, %+v\n%s", r.code, err, refused, r.stdout)
	}
	// -o text is the human form on every command.
	if r := e.ok("stats", "--dlq", e.DLQ, "-o", "text"); !strings.Contains(r.stdout, e.DLQ) {
		t.Errorf("stats -o text:\n%s", r.stdout)
	}
	real, _ := jsonOut[purgeDoc](e, "purge", "--dlq", e.DLQ, "--yes", "-o", "json")
	if !real.OK || real.DryRun || real.Purged != dry.WouldPurge {
		t.Errorf("real purge %+v after a dry run that would purge %d", real, dry.WouldPurge)
	}
	if n := e.depth(e.DLQ); n != 0 {
		t.Errorf("%d left after the purge", n)
	}
}

func TestCLIImportDryRun(t *testing.T) {
	e := newEnv(t)
	all := []string{"i0", "i1", "i2", "i3"}
	e.fillIDs(all...)
	file := filepath.Join(t.TempDir(), "in.jsonl")
	e.ok("export", "--dlq", e.DLQ, "--file", file)
	dest := e.Work + ".restore"
	e.declare(dest, nil)

	r := e.ok("import", "--dlq", e.DLQ, "--to", dest, "--file", file, "--skip", "1", "--dry-run")
	if !strings.Contains(r.stdout, "would import 3 message(s) to "+dest) {
		t.Errorf("dry run output:\n%s", r.stdout)
	}
	dry, _ := jsonOut[dlq.ImportResult](e, "import", "--dlq", e.DLQ, "--to", dest, "--file", file, "--skip", "1", "--dry-run", "-o", "json")
	if !dry.DryRun || dry.WouldPublish != 3 || dry.Published != 0 || dry.Lines != 4 || dry.Skipped != 1 {
		t.Errorf("dry run result %+v", dry)
	}
	if n := e.depth(dest); n != 0 {
		t.Fatalf("dry run published %d", n)
	}
	real, _ := jsonOut[dlq.ImportResult](e, "import", "--dlq", e.DLQ, "--to", dest, "--file", file, "--skip", "1", "--parallel", "1", "-o", "json")
	if real.Published != dry.WouldPublish || real.DryRun {
		t.Errorf("real import %+v after a dry run that would publish %d", real, dry.WouldPublish)
	}
	if got := ids(e.browse(dest)); !slices.Equal(got, all[1:]) {
		t.Errorf("destination holds %v, want %v", got, all[1:])
	}

	// A file that is not an export fails the dry run as it would the run.
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, append(data, []byte("not json\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := e.run("import", "--dlq", e.DLQ, "--to", dest, "--file", bad, "--dry-run"); r.code != 65 {
		t.Errorf("dry run of a bad file: exit %d, want 65\n%s", r.code, r.stderr)
	}
	// So does a destination that does not exist.
	if r := e.run("import", "--dlq", e.DLQ, "--to", "no-such-"+e.Work, "--file", file, "--dry-run"); r.code == 0 || !strings.Contains(r.stderr, "no-such-"+e.Work) {
		t.Errorf("dry run to a missing queue: exit %d\n%s", r.code, r.stderr)
	}
	if got := ids(e.browse(dest)); !slices.Equal(got, all[1:]) {
		t.Errorf("failed dry runs changed the destination: %v", got)
	}
}

func TestCLIExportRemoveDryRun(t *testing.T) {
	e := newEnv(t)
	var all []*msg.Message
	for i, reason := range []string{"expired", "max-attempts", "expired", "non-retriable", "expired", "max-attempts"} {
		all = append(all, deadMsg("x"+string(rune('0'+i)), e.Work, "k", reason, 503, time.Hour))
	}
	e.fill(e.DLQ, all...)
	want := ids(all)
	dir := t.TempDir()
	file := filepath.Join(dir, "out.jsonl")

	dry, _ := jsonOut[dlq.ExportResult](e, "export", "--dlq", e.DLQ, "--file", file, "--remove", "--reason", "expired", "--dry-run", "-o", "json")
	if !dry.DryRun || dry.WouldExport != 3 || dry.WouldRemove != 3 || dry.Exported != 0 || dry.Removed != 0 || dry.Skipped != 3 {
		t.Errorf("dry run result %+v", dry)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("dry run wrote the export file (%v)", err)
	}
	r := e.ok("export", "--dlq", e.DLQ, "--file", file, "--remove", "--reason", "expired", "--dry-run")
	if !strings.Contains(r.stdout, "would export 3 of 6") || !strings.Contains(r.stdout, "remove 3") {
		t.Errorf("dry run output:\n%s", r.stdout)
	}
	if got := ids(e.browse(e.DLQ)); !slices.Equal(got, want) {
		t.Fatalf("DLQ after dry runs %v, want %v", got, want)
	}
	real, _ := jsonOut[dlq.ExportResult](e, "export", "--dlq", e.DLQ, "--file", file, "--remove", "--reason", "expired", "-o", "json")
	if real.Removed != dry.WouldRemove || real.Exported != dry.WouldExport || real.DryRun {
		t.Errorf("real export %+v after a dry run %+v", real, dry)
	}
	if got := ids(e.browse(e.DLQ)); !slices.Equal(got, []string{"x1", "x3", "x5"}) {
		t.Errorf("DLQ after the real run %v", got)
	}
	// A dry run refuses what the run would refuse: an existing file.
	if r := e.run("export", "--dlq", e.DLQ, "--file", file, "--remove", "--dry-run"); r.code == 0 || !strings.Contains(r.stderr, "--overwrite") {
		t.Errorf("dry run onto an existing file: exit %d\n%s", r.code, r.stderr)
	}
}
