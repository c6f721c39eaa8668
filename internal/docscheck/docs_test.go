package docscheck

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/config"
)

// root is the repository's top folder, seen from this package.
const root = "../.."

// pages are the Markdown files a reader of the repository is sent to.
func pages(t *testing.T) []string {
	t.Helper()
	out := []string{filepath.Join(root, "README.md")}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, docs...)
	return append(out, filepath.Join(root, "charts", "hopper", "README.md"))
}

// block is one fenced code block of a page.
type block struct {
	page, lang, text string
	line             int  // of the opening fence
	partial          bool // marked as a part of a config, not a whole one
}

// partialMark, on the line before a fence, says the block is deliberately
// a part of a config (a fragment to merge into one), so it is not loaded
// on its own.
const partialMark = "<!-- partial config -->"

func blocks(t *testing.T, page string) []block {
	t.Helper()
	f, err := os.Open(page)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out  []block
		cur  *block
		prev string
		n    int
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			cur = &block{page: page, lang: strings.TrimPrefix(trimmed, "```"), line: n, partial: strings.TrimSpace(prev) == partialMark}
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
		prev = line
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// configKeys are the top-level keys of Hopper's config; a YAML block whose
// keys are all among them is a Hopper config.
var configKeys = func() map[string]bool {
	out := map[string]bool{}
	for _, e := range config.Reference() {
		top, _, _ := strings.Cut(e.Path, ".")
		out[strings.TrimSuffix(top, "[]")] = true
	}
	return out
}()

var topKey = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9]*):`)

// isConfig tells whether a YAML block is a Hopper config: every key at its
// top level is one of the config's, and it has at least one.
func isConfig(text string) bool {
	n := 0
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, " ") || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "-") {
			continue
		}
		m := topKey.FindStringSubmatch(line)
		if m == nil || !configKeys[m[1]] {
			return false
		}
		n++
	}
	return n > 0
}

// TestConfigBlocksValidate: every YAML block of the pages that is a Hopper
// config loads and validates as `hopper config validate` would, unless it is
// marked as a part of one.
func TestConfigBlocksValidate(t *testing.T) {
	checked := 0
	for _, page := range pages(t) {
		for _, b := range blocks(t, page) {
			if b.lang != "yaml" || b.partial || !isConfig(b.text) {
				continue
			}
			checked++
			path := filepath.Join(t.TempDir(), "hopper.yaml")
			if err := os.WriteFile(path, []byte(b.text), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, _, err := config.Load(path, nil)
			if err == nil {
				err = cfg.Validate()
			}
			if err != nil {
				t.Errorf("%s:%d: the config shown does not validate (mark a deliberate fragment with %s on the line before its fence):\n%v",
					rel(page), b.line, partialMark, err)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no config block found in the pages: the check checks nothing")
	}
	t.Logf("%d config blocks validated", checked)
}

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.*)$`)
	anchorRE  = regexp.MustCompile(`<a (?:name|id)="([^"]+)"`)
)

// slug is the anchor a heading gets on the forge and in most renderers:
// lower case, punctuation but hyphens and underscores dropped, spaces as
// hyphens.
func slug(heading string) string {
	heading = strings.ToLower(strings.TrimSpace(heading))
	var b strings.Builder
	for _, r := range heading {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors lists the anchors of a page: its headings' slugs (repeated ones
// numbered -1, -2, …) and explicit <a name> or <a id> tags. Headings inside
// code blocks do not count.
func anchors(t *testing.T, page string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range anchorRE.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(strings.NewReplacer("`", "", "*", "").Replace(m[1]))
		if k := seen[s]; k > 0 {
			out[s+"-"+strconv.Itoa(k)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// TestLinksResolve: every relative link of the pages names a file or folder
// of the repository, and every anchor a heading (or anchor tag) of the page
// it points into.
func TestLinksResolve(t *testing.T) {
	for _, page := range pages(t) {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		fenced := false
		for i, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
			}
			if fenced {
				continue
			}
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				dest := page
				if file != "" {
					dest = filepath.Join(filepath.Dir(page), file)
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: link to %q: no such file", rel(page), i+1, target)
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(dest, ".md") {
					continue
				}
				if !anchors(t, dest)[anchor] {
					t.Errorf("%s:%d: link to %q: %s has no heading or anchor %q", rel(page), i+1, target, rel(dest), anchor)
				}
			}
		}
	}
}

func rel(p string) string {
	r, err := filepath.Rel(root, p)
	if err != nil {
		return p
	}
	return r
}

var (
	eventRE = regexp.MustCompile(`"event", "([A-Z][A-Z_]+)"`)
	alertRE = regexp.MustCompile(`- alert: ([A-Za-z]+)`)
)

// TestOperationsNamesEveryEventAndAlert: every log event the code writes
// and every alert of the chart's rules is explained on the operations page,
// so that an operator who meets one finds it there.
func TestOperationsNamesEveryEventAndAlert(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(data)
	found := map[string]string{}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".cache" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.Contains(path, "/bench/") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range eventRE.FindAllStringSubmatch(string(src), -1) {
			found[m[1]] = rel(path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(filepath.Join(root, "charts", "hopper", "templates", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range alertRE.FindAllStringSubmatch(string(rules), -1) {
		found[m[1]] = "charts/hopper/templates/prometheusrule.yaml"
	}
	if len(found) < 20 {
		t.Fatalf("found only %d events and alerts: the scan is broken", len(found))
	}
	for name, where := range found {
		if !strings.Contains(page, "`"+name+"`") {
			t.Errorf("%s (from %s) is not explained in docs/operations.md", name, where)
		}
	}
}
