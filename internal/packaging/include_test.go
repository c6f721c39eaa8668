package packaging

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestChartReadmeIncludeStory: a parent chart needs two includes in its own
// Deployment, hopper.sidecar in the containers and hopper.volumes in the
// volumes; without the second the pod mounts volumes it does not have and
// the API server refuses it. The chart README must say two, show both in
// the snippet it calls required, and name every include the parent test
// chart (the complete, tested example) uses.
func TestChartReadmeIncludeStory(t *testing.T) {
	readme := readRepoFile(t, chartDir, "README.md")
	if m := regexp.MustCompile(`(?i)\bone include\b`).FindString(readme); m != "" {
		t.Errorf("charts/hopper/README.md says %q: a parent chart needs two (hopper.sidecar and hopper.volumes)", m)
	}
	_, section, ok := strings.Cut(readme, "\n## As a dependency")
	if !ok {
		t.Fatal("charts/hopper/README.md has no \"## As a dependency\" section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	if !strings.Contains(section, "two includes") {
		t.Error("the dependency section does not say two includes are required")
	}
	// The first snippet with includes is the required one.
	var required string
	for _, block := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(section, -1) {
		if strings.Contains(block[1], "include ") {
			required = block[1]
			break
		}
	}
	for _, name := range []string{"hopper.sidecar", "hopper.volumes"} {
		if !strings.Contains(required, `include "`+name+`"`) {
			t.Errorf("the dependency section's first include snippet lacks %s:\n%s", name, required)
		}
	}
	parentTpl := readRepoFile(t, "internal", "packaging", "testdata", "parent", "templates", "deployment.yaml")
	for _, m := range regexp.MustCompile(`include "(hopper\.[A-Za-z]+)"`).FindAllStringSubmatch(parentTpl, -1) {
		if !strings.Contains(section, `include "`+m[1]+`"`) {
			t.Errorf("the parent test chart uses %s, which the dependency section does not show", m[1])
		}
	}

	// Without hopper.volumes the pod is not valid.
	dir := filepath.Join(t.TempDir(), "parent")
	if err := copyTree(parentChart(t), dir); err != nil {
		t.Fatal(err)
	}
	tpl := filepath.Join(dir, "templates", "deployment.yaml")
	var kept []string
	for _, l := range strings.Split(parentTpl, "\n") {
		if strings.Contains(l, `include "hopper.volumes"`) || strings.TrimSpace(l) == "volumes:" {
			continue
		}
		kept = append(kept, l)
	}
	if len(kept) != len(strings.Split(parentTpl, "\n"))-2 {
		t.Fatalf("the parent test chart's deployment.yaml has no volumes: block with the hopper.volumes include")
	}
	if err := os.WriteFile(tpl, []byte(strings.Join(kept, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := runHelm(t, templateArgs(renderCase{chart: dir})...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr)
	}
	deps := byKind[*appsv1.Deployment](decodeManifests(t, stdout))
	if len(deps) != 1 {
		t.Fatalf("want the parent's Deployment, got %d", len(deps))
	}
	pod := deps[0].Spec.Template
	h, _ := findHopper(t, &pod)
	if h == nil {
		t.Fatal("no Hopper container")
	}
	var missing []string
	for _, m := range h.VolumeMounts {
		if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name }) {
			missing = append(missing, m.Name)
		}
	}
	if !slices.Contains(missing, "hopper-config") {
		t.Errorf("without hopper.volumes the Hopper container still finds its volumes (missing: %v): the README's second required include would be unneeded", missing)
	}
}
