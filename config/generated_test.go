package config_test

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/internal/confdoc"
)

// TestGeneratedFilesUpToDate fails while a generated file differs from
// what the generator makes of the source as it stands: the reference
// (docs/configuration.md) and the doc comments the binary carries
// (config/docs_gen.go). Both follow config.go's doc comments, types and
// Default, so an edit there needs the generator run again.
func TestGeneratedFilesUpToDate(t *testing.T) {
	files, err := confdoc.Generate("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		want := files[name]
		got, err := os.ReadFile(filepath.Join("..", name))
		if err != nil {
			t.Errorf("%s: %v; run %s", name, err, confdoc.Regenerate)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale (it differs from what the config's source makes of it): run %s and commit the result%s",
				name, confdoc.Regenerate, firstDifference(string(got), string(want)))
		}
	}
}

// firstDifference shows the first line where got and want part, from a
// little before the first character that differs.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl == wl {
			continue
		}
		from := 0
		for from < min(len(gl), len(wl)) && gl[from] == wl[from] {
			from++
		}
		from = max(0, from-40)
		return "\nfirst difference, line " + strconv.Itoa(i+1) + ":\n  file:      …" + clip(gl[min(from, len(gl)):]) + "\n  generated: …" + clip(wl[min(from, len(wl)):])
	}
	return ""
}

func clip(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}
