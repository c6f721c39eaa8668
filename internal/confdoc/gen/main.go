// Command gen writes the generated configuration reference:
// docs/configuration.md and config/docs_gen.go (see package confdoc).
// `go generate ./config/` and `make docs` run it.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/hopper-sidecar/hopper/internal/confdoc"
)

func main() {
	root := flag.String("root", ".", "the repository's root")
	flag.Parse()
	if err := run(*root); err != nil {
		fmt.Fprintln(os.Stderr, "confdoc:", err)
		os.Exit(1)
	}
}

func run(root string) error {
	files, err := confdoc.Generate(root)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		path := filepath.Join(root, name)
		old, err := os.ReadFile(path)
		if err == nil && bytes.Equal(old, files[name]) {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		if err := os.WriteFile(path, files[name], 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		fmt.Println("confdoc: wrote", name)
	}
	return nil
}
