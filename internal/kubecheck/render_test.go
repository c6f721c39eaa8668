package kubecheck

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const (
	kubeVersion = "1.30.0"
	release     = "rel"
	namespace   = "orders-ns"
)

// repoRoot is the repository's top folder (two levels above this file).
var repoRoot = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}()

func repoPath(parts ...string) string {
	return filepath.Join(append([]string{repoRoot}, parts...)...)
}

// helmBin is the pinned helm that `make tools` (scripts/install-helm.sh)
// installs, or $HELM. Its absence is a failure, never a skip.
func helmBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("HELM"); p != "" {
		return p
	}
	p := repoPath(".cache", "bin", "helm")
	if fi, err := os.Stat(p); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("helm is not installed at %s: run `make tools` (make test does)", p)
	}
	return p
}

// doc is one rendered manifest.
type doc struct {
	source     string
	apiVersion string
	kind       string
	name       string
	json       []byte
}

var (
	docSep   = regexp.MustCompile(`(?m)^---[ \t]*$`)
	sourceRE = regexp.MustCompile(`(?m)^# Source: (\S+)`)
)

// render runs `helm template` on chart with args and splits the output.
func render(t *testing.T, chart string, args ...string) []doc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	home := t.TempDir()
	all := append([]string{"template", release, chart, "--namespace", namespace, "--kube-version", kubeVersion}, args...)
	cmd := exec.CommandContext(ctx, helmBin(t), all...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home,
		"HELM_CACHE_HOME=" + filepath.Join(home, "cache"), "HELM_CONFIG_HOME=" + filepath.Join(home, "config"),
		"HELM_DATA_HOME=" + filepath.Join(home, "data")}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(all, " "), err, stderr.String())
	}
	var docs []doc
	for _, part := range docSep.Split(stdout.String(), -1) {
		if strings.TrimSpace(sourceRE.ReplaceAllString(part, "")) == "" {
			continue
		}
		src := ""
		if m := sourceRE.FindStringSubmatch(part); m != nil {
			src = m[1]
		}
		j, err := yaml.YAMLToJSONStrict([]byte(part))
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := kjson.UnmarshalCaseSensitivePreserveInts(j, &head); err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		docs = append(docs, doc{source: src, apiVersion: head.APIVersion, kind: head.Kind, name: head.Metadata.Name, json: j})
	}
	return docs
}

// decodeStrict decodes like the API server with fieldValidation=Strict:
// unknown, duplicate and wrongly cased fields are errors.
func decodeStrict(d doc, into any) error {
	strict, err := kjson.UnmarshalStrict(d.json, into)
	if err != nil {
		return fmt.Errorf("%s %s (%s): %w", d.kind, d.name, d.source, err)
	}
	if len(strict) > 0 {
		return fmt.Errorf("%s %s (%s): %v", d.kind, d.name, d.source, strict)
	}
	return nil
}

// renderCase is one way the chart is rendered.
type renderCase struct {
	name  string
	chart string
	args  []string
}

// renderCases: every values file in charts/hopper/ci, the full values with
// the DLQ console on, and the parent test chart that includes the sidecar in
// its own Deployment.
func renderCases(t *testing.T) []renderCase {
	t.Helper()
	files, err := filepath.Glob(repoPath("charts", "hopper", "ci", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("charts/hopper/ci: %v (%d files)", err, len(files))
	}
	var cases []renderCase
	for _, f := range files {
		cases = append(cases, renderCase{name: strings.TrimSuffix(filepath.Base(f), ".yaml"), chart: repoPath("charts", "hopper"), args: []string{"-f", f}})
	}
	// The DLQ console's Deployment is off in every values file.
	cases = append(cases, renderCase{name: "console", chart: repoPath("charts", "hopper"), args: []string{
		"-f", repoPath("charts", "hopper", "ci", "full-values.yaml"),
		"--set", "console.enabled=true", "--set", "console.allowActions=true",
		"--set", "console.tokenSecret.name=hopper-console-tokens",
		"--set", "console.resources.limits.memory=256Mi",
	}})
	// A stream subscription scaled on its lag as well.
	cases = append(cases, renderCase{name: "stream-lag", chart: repoPath("charts", "hopper"), args: []string{
		"-f", repoPath("charts", "hopper", "ci", "keda-values.yaml"),
		"--set", "config.queue.name=events", "--set", "config.queue.type=stream", "--set", "config.queue.stream.consumer=billing",
		"--set", "config.broker.urls={amqp://rabbitmq.messaging:5672/orders}",
		"--set", "keda.streamLag.serverAddress=http://prometheus.monitoring:9090",
	}})
	parent := filepath.Join(t.TempDir(), "parent")
	if err := copyTree(repoPath("internal", "packaging", "testdata", "parent"), parent); err != nil {
		t.Fatal(err)
	}
	if err := copyTree(repoPath("charts", "hopper"), filepath.Join(parent, "charts", "hopper")); err != nil {
		t.Fatal(err)
	}
	return append(cases, renderCase{name: "parent", chart: parent})
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}
