package packaging

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// defaultsArgs are the only values the chart cannot default: the app's image
// and the queue. Everything else comes from values.yaml.
var defaultsArgs = []string{
	"--set", "config.queue.name=orders",
	"--set", "app.image.repository=registry.example.com/app",
	"--set", "app.image.tag=1",
}

// templateArtefacts are what Go's text/template and fmt print for a value
// that is not there: a missing map key (<no value>), a nil printed with a
// verb (%!s(<nil>)) or a wrong verb (%!d(string=...)). None of them is ever
// meant to reach a manifest.
var templateArtefacts = []string{"%!", "<nil>", "<no value>"}

// TestChartRendersNoTemplateArtefacts renders the chart with every values
// file in charts/hopper/ci, through the parent chart, and with the defaults
// (tracing off and on), and fails on any line that holds a template
// artefact: a value the templates read from a key that does not exist still
// renders, so neither helm nor the API types notice it.
func TestChartRendersNoTemplateArtefacts(t *testing.T) {
	cases := renderCases(t)
	cases = append(cases,
		renderCase{name: "defaults", chart: repoPath(chartDir), args: defaultsArgs},
		renderCase{name: "defaults-otel", chart: repoPath(chartDir), args: append(slices.Clone(defaultsArgs),
			"--set", "otel.enabled=true", "--set", "otel.endpoint=http://collector:4318")},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := templateArgs(c)
			stdout, stderr, err := runHelm(t, args...)
			if err != nil {
				t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr)
			}
			if len(decodeManifests(t, stdout)) == 0 {
				t.Fatalf("helm %s rendered nothing", strings.Join(args, " "))
			}
			for i, l := range strings.Split(stdout, "\n") {
				for _, a := range templateArtefacts {
					if strings.Contains(l, a) {
						t.Errorf("line %d holds the template artefact %q (a missing value):\n%s", i+1, a, strings.TrimSpace(l))
					}
				}
			}
		})
	}
}

// TestChartOtelResourceAttributes pins the OTEL_* resource environment of
// every Hopper container the chart renders (the Deployment's sidecar, the
// tool Job's container, the sidecar a parent chart includes):
// resourceAttributes in key order, then the downward-API k8s.* attributes
// and k8s.container.name, which is the name of the very container the
// variable is set in.
func TestChartOtelResourceAttributes(t *testing.T) {
	const k8sAttrs = "k8s.pod.name=$(K8S_POD_NAME),k8s.namespace.name=$(K8S_NAMESPACE_NAME),k8s.node.name=$(K8S_NODE_NAME)"
	full := repoPath(chartDir, "ci", "full-values.yaml")
	otelOn := []string{"--set", "otel.enabled=true", "--set", "otel.endpoint=http://collector:4318"}
	cases := []struct {
		name        string
		chart       string
		args        []string
		containers  int    // Hopper containers rendered (Deployment, Job)
		container   string // their name
		serviceName string // OTEL_SERVICE_NAME; "" when tracing is off
		attrs       string // OTEL_RESOURCE_ATTRIBUTES; "" when not set
	}{
		{name: "defaults", chart: repoPath(chartDir), args: defaultsArgs, containers: 1, container: "hopper"},
		{name: "defaults-otel", chart: repoPath(chartDir), args: append(slices.Clone(defaultsArgs), otelOn...),
			containers: 1, container: "hopper", serviceName: "rel-hopper",
			attrs: k8sAttrs + ",k8s.container.name=hopper"},
		{name: "defaults-otel-no-k8s", chart: repoPath(chartDir),
			args:       append(append(slices.Clone(defaultsArgs), otelOn...), "--set", "otel.kubernetesAttributes=false", "--set", "otel.resourceAttributes.team=payments"),
			containers: 1, container: "hopper", serviceName: "rel-hopper", attrs: "team=payments"},
		{name: "full-values", chart: repoPath(chartDir), args: []string{"-f", full},
			containers: 2, container: "hopper", serviceName: "orders-hopper",
			attrs: "deployment.environment=production,service.namespace=payments," + k8sAttrs + ",k8s.container.name=hopper"},
		{name: "full-values-container-name", chart: repoPath(chartDir), args: []string{"-f", full, "--set", "containerName=queue-sidecar"},
			containers: 2, container: "queue-sidecar", serviceName: "orders-hopper",
			attrs: "deployment.environment=production,service.namespace=payments," + k8sAttrs + ",k8s.container.name=queue-sidecar"},
		{name: "parent-otel", chart: parentChart(t),
			args:       []string{"--set", "hopper.otel.enabled=true", "--set", "hopper.otel.endpoint=http://collector:4318", "--set", "hopper.containerName=hopper-sidecar"},
			containers: 1, container: "hopper-sidecar", serviceName: "rel-hopper", attrs: k8sAttrs + ",k8s.container.name=hopper-sidecar"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := templateArgs(renderCase{chart: c.chart, args: c.args})
			stdout, stderr, err := runHelm(t, args...)
			if err != nil {
				t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr)
			}
			ms := decodeManifests(t, stdout)
			var hoppers []*corev1.Container
			for _, d := range byKind[*appsv1.Deployment](ms) {
				if h, _ := findHopper(t, &d.Spec.Template); h != nil {
					hoppers = append(hoppers, h)
				}
			}
			for _, j := range byKind[*batchv1.Job](ms) {
				if h, _ := findHopper(t, &j.Spec.Template); h != nil {
					hoppers = append(hoppers, h)
				}
			}
			if len(hoppers) != c.containers {
				t.Fatalf("found %d Hopper containers in %s, want %d", len(hoppers), kindsOf(ms), c.containers)
			}
			for _, h := range hoppers {
				if h.Name != c.container {
					t.Errorf("Hopper container named %q, want %q", h.Name, c.container)
				}
				env := map[string]corev1.EnvVar{}
				for _, e := range h.Env {
					env[e.Name] = e
				}
				if c.serviceName == "" {
					if env["OTEL_SDK_DISABLED"].Value != "true" {
						t.Errorf("container %s: tracing off but OTEL_SDK_DISABLED is %q", h.Name, env["OTEL_SDK_DISABLED"].Value)
					}
				} else if got := env["OTEL_SERVICE_NAME"].Value; got != c.serviceName {
					t.Errorf("container %s: OTEL_SERVICE_NAME %q, want %q", h.Name, got, c.serviceName)
				}
				got, ok := env["OTEL_RESOURCE_ATTRIBUTES"]
				if c.attrs == "" {
					if ok {
						t.Errorf("container %s: OTEL_RESOURCE_ATTRIBUTES %q, want it unset", h.Name, got.Value)
					}
					continue
				}
				if got.Value != c.attrs {
					t.Errorf("container %s: OTEL_RESOURCE_ATTRIBUTES\n got %q\nwant %q", h.Name, got.Value, c.attrs)
				}
				if want := "k8s.container.name=" + h.Name; strings.Contains(c.attrs, "k8s.container.name=") && !slices.Contains(strings.Split(got.Value, ","), want) {
					t.Errorf("container %s: OTEL_RESOURCE_ATTRIBUTES %q lacks %q, the container's own name", h.Name, got.Value, want)
				}
				checkEnvRefs(t, h)
			}
		})
	}
}

// checkEnvRefs checks that every $(VAR) in OTEL_RESOURCE_ATTRIBUTES names a
// variable defined before it (the kubelet leaves any other reference as it
// is), and that the K8S_* ones come from the downward API field they stand
// for.
func checkEnvRefs(t *testing.T, c *corev1.Container) {
	t.Helper()
	fields := map[string]string{
		"K8S_POD_NAME":       "metadata.name",
		"K8S_NAMESPACE_NAME": "metadata.namespace",
		"K8S_NODE_NAME":      "spec.nodeName",
	}
	defined := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		if e.Name == "OTEL_RESOURCE_ATTRIBUTES" {
			for _, m := range regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).FindAllStringSubmatch(e.Value, -1) {
				ref, ok := defined[m[1]]
				if !ok {
					t.Errorf("container %s: OTEL_RESOURCE_ATTRIBUTES refers to $(%s), which is not defined before it", c.Name, m[1])
					continue
				}
				if want, ok := fields[m[1]]; ok && (ref.ValueFrom == nil || ref.ValueFrom.FieldRef == nil || ref.ValueFrom.FieldRef.FieldPath != want) {
					t.Errorf("container %s: %s is not the downward API field %s: %+v", c.Name, m[1], want, ref.ValueFrom)
				}
			}
		}
		defined[e.Name] = e
	}
}
