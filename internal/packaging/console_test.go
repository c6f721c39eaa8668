package packaging

import (
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// consoleDeployment returns the DLQ console's Deployment, or nil.
func consoleDeployment(ms []manifest) *appsv1.Deployment {
	for _, d := range byKind[*appsv1.Deployment](ms) {
		if strings.HasSuffix(d.Name, "-console") {
			return d
		}
	}
	return nil
}

// TestChartConsole: the DLQ console's Deployment is rendered only when
// console.enabled, runs hopper dlq console on the pod's loopback with the
// sidecar's config and broker credentials, and reads its action tokens
// from the Secret it names.
func TestChartConsole(t *testing.T) {
	minimal := repoPath(chartDir, "ci", "minimal-values.yaml")
	full := repoPath(chartDir, "ci", "full-values.yaml")
	for _, f := range []string{minimal, full} {
		if d := consoleDeployment(renderChart(t, "-f", f)); d != nil {
			t.Errorf("%s: console rendered while console.enabled is false", f)
		}
	}

	ms := renderChart(t, "-f", full, "--set", "console.enabled=true", "--set", "console.traceURL=http://jaeger:16686/trace/{traceId}")
	d := consoleDeployment(ms)
	if d == nil {
		t.Fatalf("console.enabled: no console Deployment in %s", kindsOf(ms))
	}
	if *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("console: %d replicas, strategy %s; want one, recreated", *d.Spec.Replicas, d.Spec.Strategy.Type)
	}
	c, _ := findHopper(t, &d.Spec.Template)
	if c == nil {
		t.Fatal("console pod has no Hopper container")
	}
	args := strings.Join(c.Args, " ")
	if !strings.HasPrefix(args, "dlq console --listen 127.0.0.1:8089 ") || !strings.Contains(args, "--trace-url http://jaeger:16686/trace/{traceId}") || strings.Contains(args, "--allow-actions") {
		t.Errorf("console args %q", args)
	}
	// On loopback the console needs no token for reads, and must not be
	// told that an open address is meant.
	if strings.Contains(args, "--allow-remote-read") || strings.Contains(args, "--reads-need-token") {
		t.Errorf("console args %q", args)
	}
	// A command line the binary accepts: --help parses every flag.
	if stdout, stderr, err := runHopper(t, []string{"PATH=" + os.Getenv("PATH")}, append(slices.Clone(c.Args), "--help")...); err != nil || !strings.Contains(stdout, "Usage:\n  hopper dlq console ") {
		t.Errorf("hopper %s is not a command line hopper accepts: %v\n%s", args, err, stderr)
	}
	if len(c.Ports) != 0 {
		t.Errorf("console exposes ports %v; it listens on loopback only", c.Ports)
	}
	// The same config and broker credentials as the sidecar.
	var main *appsv1.Deployment
	for _, x := range byKind[*appsv1.Deployment](ms) {
		if x != d {
			main = x
		}
	}
	if main == nil {
		t.Fatal("no sidecar Deployment beside the console")
	}
	side, _ := findHopper(t, &main.Spec.Template)
	for _, m := range side.VolumeMounts {
		if !slices.ContainsFunc(c.VolumeMounts, func(x corev1.VolumeMount) bool { return x.MountPath == m.MountPath }) {
			t.Errorf("console lacks the sidecar's mount %s", m.MountPath)
		}
	}
	for _, e := range side.Env {
		if !slices.ContainsFunc(c.Env, func(x corev1.EnvVar) bool { return x.Name == e.Name }) {
			t.Errorf("console lacks the sidecar's variable %s", e.Name)
		}
	}
	if l := d.Spec.Template.Labels["app.kubernetes.io/name"]; l == main.Spec.Template.Labels["app.kubernetes.io/name"] {
		t.Errorf("console pods carry the sidecar pods' name label %q: the sidecar's selectors and policies would take them", l)
	}

	ms = renderChart(t, "-f", minimal, "--set", "console.enabled=true", "--set", "console.allowActions=true", "--set", "console.tokenSecret.name=orders-console")
	d = consoleDeployment(ms)
	c, _ = findHopper(t, &d.Spec.Template)
	i := slices.Index(c.Args, "--token-file")
	if !slices.Contains(c.Args, "--allow-actions") || i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("console with actions: args %q", c.Args)
	}
	secretFile(t, &d.Spec.Template, c, c.Args[i+1], "orders-console", "tokens")

	// Without a token Secret the console generates one: no --token-file.
	ms = renderChart(t, "-f", minimal, "--set", "console.enabled=true", "--set", "console.allowActions=true")
	c, _ = findHopper(t, &consoleDeployment(ms).Spec.Template)
	if slices.Contains(c.Args, "--token-file") {
		t.Errorf("--token-file without a Secret: %q", c.Args)
	}
}
