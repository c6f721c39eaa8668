package packaging

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/telemetry"
)

const (
	// kubeVersion is the cluster version the chart is rendered for: the
	// oldest that has everything the ci values use (native sidecars 1.29,
	// lifecycle.preStop.sleep 1.30). A go-installed helm otherwise assumes 1.20.
	kubeVersion = "1.30.0"
	release     = "rel"
	namespace   = "orders-ns"
	// chartConfigPath is where the chart mounts hopper.yaml (and the image's
	// ENV HOPPER_CONFIG).
	chartConfigPath = "/etc/hopper/hopper.yaml"
	chartDir        = "charts/hopper"
)

// renderCase is one `helm template` run.
type renderCase struct {
	name   string
	chart  string   // chart folder
	args   []string // extra helm args (-f, --set)
	native bool     // Hopper is expected as a native sidecar
	parent bool     // rendered through the parent test chart
}

// renderCases are every values file in charts/hopper/ci plus the parent
// chart that includes hopper.sidecar in its own Deployment (twice: regular
// and native sidecar).
func renderCases(t *testing.T) []renderCase {
	t.Helper()
	files, err := filepath.Glob(repoPath(chartDir, "ci", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []renderCase
	var names []string
	for _, f := range files {
		var v map[string]any
		if err := yaml.Unmarshal([]byte(readRepoFile(t, chartDir, "ci", filepath.Base(f))), &v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		native, _ := dig(v, "nativeSidecar").(bool)
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		names = append(names, name)
		cases = append(cases, renderCase{name: name, chart: repoPath(chartDir), args: []string{"-f", f}, native: native})
	}
	for _, want := range []string{"minimal-values", "full-values", "native-sidecar-values"} {
		if !slices.Contains(names, want) {
			t.Errorf("charts/hopper/ci/%s.yaml is missing", want)
		}
	}
	// examples/hopper.yaml (every config key with its default) as
	// hopper.config: the schema must accept all of it.
	var example map[string]any
	if err := yaml.Unmarshal([]byte(readRepoFile(t, "examples", "hopper.yaml")), &example); err != nil {
		t.Fatalf("examples/hopper.yaml: %v", err)
	}
	exValues, err := yaml.Marshal(map[string]any{
		"app":    map[string]any{"image": map[string]any{"repository": "registry.example.com/app", "tag": "1"}},
		"config": example,
	})
	if err != nil {
		t.Fatal(err)
	}
	exFile := filepath.Join(scratch, "examples-hopper-yaml-values.yaml")
	if err := os.WriteFile(exFile, exValues, 0o644); err != nil {
		t.Fatal(err)
	}
	cases = append(cases, renderCase{name: "examples-hopper-yaml", chart: repoPath(chartDir), args: []string{"-f", exFile}})

	parent := parentChart(t)
	cases = append(cases,
		renderCase{name: "parent", chart: parent, parent: true},
		renderCase{name: "parent-native", chart: parent, parent: true, native: true,
			args: []string{"--set", "hopper.nativeSidecar=true"}},
	)
	return cases
}

func dig(m map[string]any, path ...string) any {
	var cur any = m
	for _, p := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = mm[p]
	}
	return cur
}

// parentOnce is set by the first (sequential) call of parentChart.
var parentOnce struct {
	dir string
	ok  bool
}

// parentChart copies internal/packaging/testdata/parent to a temporary
// folder with charts/hopper as its unpacked dependency (what `helm
// dependency build` would fetch from the file:// repository).
func parentChart(t *testing.T) string {
	t.Helper()
	if parentOnce.ok {
		return parentOnce.dir
	}
	dir := filepath.Join(scratch, "parent")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	src := repoPath("internal", "packaging", "testdata", "parent")
	for _, f := range []string{"Chart.yaml", "values.yaml", "templates"} {
		if err := copyTree(filepath.Join(src, f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := copyTree(repoPath(chartDir), filepath.Join(dir, "charts", "hopper")); err != nil {
		t.Fatal(err)
	}
	parentOnce.dir, parentOnce.ok = dir, true
	return dir
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
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}

func templateArgs(c renderCase) []string {
	return append([]string{"template", release, c.chart, "--namespace", namespace, "--kube-version", kubeVersion}, c.args...)
}

func TestChartLint(t *testing.T) {
	cases := renderCases(t)
	// The chart with its defaults alone lints too (required values are only
	// reported as info by helm lint).
	cases = append(cases, renderCase{name: "defaults", chart: repoPath(chartDir)})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"lint", "--strict", c.chart, "--namespace", namespace, "--kube-version", kubeVersion}, c.args...)
			stdout, stderr, err := runHelm(t, args...)
			if err != nil {
				t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout, stderr)
			}
			if c.name == "defaults" {
				return
			}
			// helm lint turns fail and required into [INFO] lines; with real
			// values none may fire.
			for _, l := range strings.Split(stdout+stderr, "\n") {
				if strings.Contains(l, "[INFO] Fail") || strings.Contains(l, "Missing required value") || strings.Contains(l, "[WARNING]") || strings.Contains(l, "[ERROR]") {
					t.Errorf("helm lint: %s", l)
				}
			}
		})
	}
}

func TestChartRender(t *testing.T) {
	for _, c := range renderCases(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := templateArgs(c)
			stdout, stderr, err := runHelm(t, args...)
			if err != nil {
				t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr)
			}
			ms := decodeManifests(t, stdout)
			checkRelease(t, c, ms)
		})
	}
}

// checkRelease checks what the API types cannot: references between the
// objects, the pod's wiring and the Hopper config (run through `hopper
// config validate`).
func checkRelease(t *testing.T, c renderCase, ms []manifest) {
	deps := byKind[*appsv1.Deployment](ms)
	var cms []*corev1.ConfigMap // Hopper's config (not the dashboard's)
	for _, cm := range byKind[*corev1.ConfigMap](ms) {
		if _, ok := cm.Data["hopper.yaml"]; ok {
			cms = append(cms, cm)
		}
	}
	if len(deps) != 1 || len(cms) != 1 {
		t.Fatalf("want one Deployment and one ConfigMap holding hopper.yaml, got %s", kindsOf(ms))
	}
	for _, m := range ms {
		for _, e := range validation.IsDNS1123Subdomain(m.name) {
			t.Errorf("%s: name: %s", m, e)
		}
		if mo, ok := m.obj.(metav1.Object); ok {
			for k, v := range mo.GetLabels() {
				for _, e := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
					t.Errorf("%s: label %s=%s: %s", m, k, v, e)
				}
			}
			if mo.GetNamespace() != "" {
				t.Errorf("%s: sets metadata.namespace; leave it to helm --namespace", m)
			}
		}
	}
	d, cm := deps[0], cms[0]
	pod := &d.Spec.Template
	checkSelector(t, "Deployment "+d.Name, d.Spec.Selector, pod.Labels)

	hopper, native := findHopper(t, pod)
	if hopper == nil {
		return
	}
	if native != c.native {
		t.Errorf("Hopper as native sidecar = %v, want %v", native, c.native)
	}
	checkPod(t, pod)
	checkHopperContainer(t, pod, hopper, native)

	// The config: mounted from the ConfigMap, whose checksum rolls the pods.
	data, ok := cm.Data["hopper.yaml"]
	if !ok {
		t.Fatalf("ConfigMap %s has no hopper.yaml (keys %v)", cm.Name, mapKeys(cm.Data))
	}
	vol := volumeOf(pod, hopper, chartConfigPath)
	if vol == nil || vol.ConfigMap == nil || vol.ConfigMap.Name != cm.Name {
		t.Errorf("%s is not mounted from ConfigMap %s", chartConfigPath, cm.Name)
	}
	sum := sha256.Sum256([]byte(data))
	if got := pod.Annotations["checksum/hopper-config"]; got != hex.EncodeToString(sum[:]) {
		t.Errorf("pod annotation checksum/hopper-config = %q, want sha256 of the ConfigMap's hopper.yaml %s", got, hex.EncodeToString(sum[:]))
	}
	cfg := config.Default()
	if err := config.Parse([]byte(data), &cfg); err != nil {
		t.Errorf("rendered hopper.yaml does not parse: %v\n%s", err, data)
	}

	// Probes and ports agree with admin.listen.
	_, portStr, err := net.SplitHostPort(cfg.Admin.Listen)
	if err != nil {
		t.Fatalf("admin.listen %q: %v", cfg.Admin.Listen, err)
	}
	adminPort, _ := strconv.Atoi(portStr)
	var hopperAdmin *corev1.ContainerPort
	for i := range hopper.Ports {
		if hopper.Ports[i].Name == "hopper-admin" {
			hopperAdmin = &hopper.Ports[i]
		}
	}
	if hopperAdmin == nil || int(hopperAdmin.ContainerPort) != adminPort {
		t.Errorf("Hopper's container port hopper-admin = %v, want admin.listen's %d", hopperAdmin, adminPort)
	}

	// Delivery goes to a port of an app container on localhost.
	if u, err := url.Parse(cfg.App.URL); err != nil || u.Hostname() != "127.0.0.1" {
		t.Errorf("app.url %q: want http://127.0.0.1:<app port>/...", cfg.App.URL)
	} else if !slices.ContainsFunc(pod.Spec.Containers, func(ct corev1.Container) bool {
		return ct.Name != hopper.Name && slices.ContainsFunc(ct.Ports, func(p corev1.ContainerPort) bool { return strconv.Itoa(int(p.ContainerPort)) == u.Port() })
	}) {
		t.Errorf("app.url %q: no app container listens on port %s", cfg.App.URL, u.Port())
	}

	// SIGTERM: the pod waits longer than Hopper's drain.
	grace := int64(math.Ceil(cfg.Shutdown.Grace.D().Seconds()))
	if tg := pod.Spec.TerminationGracePeriodSeconds; tg == nil || *tg <= grace {
		t.Errorf("terminationGracePeriodSeconds %v must exceed shutdown.grace %s", tg, cfg.Shutdown.Grace)
	}

	checkServices(t, ms, d)
	var rendered struct {
		Broker struct {
			URLs []string `json:"urls"`
		} `json:"broker"`
	}
	if err := yaml.Unmarshal([]byte(data), &rendered); err != nil {
		t.Errorf("rendered hopper.yaml: %v", err)
	}
	checkNetworkPolicies(t, ms, d, hopper, adminPort, rendered.Broker.URLs)
	for _, j := range byKind[*batchv1.Job](ms) {
		checkToolJob(t, j, cm)
	}
	var queues []string
	for _, s := range cfg.SubscriptionConfigs() {
		queues = append(queues, s.Queue.Name)
	}
	validateRenderedConfig(t, pod, hopper, data, cfg.Multi(), queues)
}

func mapKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}

func checkSelector(t *testing.T, what string, sel *metav1.LabelSelector, podLabels map[string]string) {
	t.Helper()
	if sel == nil {
		t.Errorf("%s: no selector", what)
		return
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Errorf("%s: selector: %v", what, err)
		return
	}
	if s.Empty() || !s.Matches(labels.Set(podLabels)) {
		t.Errorf("%s: selector %s does not select the pods (labels %v)", what, s, podLabels)
	}
}

// findHopper returns the Hopper container (named hopper, image .../hopper)
// and whether it is a native sidecar (an init container with restartPolicy
// Always).
func findHopper(t *testing.T, pod *corev1.PodTemplateSpec) (*corev1.Container, bool) {
	t.Helper()
	isHopper := func(c corev1.Container) bool {
		return slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "HOPPER_CONFIG" })
	}
	var found []*corev1.Container
	native := false
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; isHopper(*c) {
			found = append(found, c)
			native = true
			if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
				t.Errorf("Hopper is an init container without restartPolicy: Always: it would block the app from starting")
			}
		}
	}
	for i := range pod.Spec.Containers {
		if c := &pod.Spec.Containers[i]; isHopper(*c) {
			found = append(found, c)
		}
	}
	if len(found) != 1 {
		t.Errorf("want exactly one Hopper container in the pod, found %d", len(found))
		return nil, false
	}
	return found[0], native
}

// checkPod checks references inside the pod spec that the API server's
// validation would reject (names, ports, volumes, env) and the security
// settings the chart promises.
func checkPod(t *testing.T, pod *corev1.PodTemplateSpec) {
	t.Helper()
	spec := &pod.Spec
	all := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		if _, dup := volumes[v.Name]; dup {
			t.Errorf("duplicate volume %q", v.Name)
		}
		for _, e := range validation.IsDNS1123Label(v.Name) {
			t.Errorf("volume %q: %s", v.Name, e)
		}
		volumes[v.Name] = v
	}
	used := map[string]bool{}
	names := map[string]bool{}
	portNames := map[string]bool{}
	for _, c := range all {
		if names[c.Name] {
			t.Errorf("duplicate container name %q", c.Name)
		}
		names[c.Name] = true
		for _, e := range validation.IsDNS1123Label(c.Name) {
			t.Errorf("container %q: %s", c.Name, e)
		}
		if c.Image == "" {
			t.Errorf("container %q: no image", c.Name)
		}
		ports := map[string]int32{}
		for _, p := range c.Ports {
			if p.Name != "" {
				for _, e := range validation.IsValidPortName(p.Name) {
					t.Errorf("container %q port %q: %s", c.Name, p.Name, e)
				}
				if portNames[p.Name] {
					t.Errorf("container %q: port name %q is used twice in the pod", c.Name, p.Name)
				}
				portNames[p.Name] = true
				ports[p.Name] = p.ContainerPort
			}
			for _, e := range validation.IsValidPortNum(int(p.ContainerPort)) {
				t.Errorf("container %q port %d: %s", c.Name, p.ContainerPort, e)
			}
		}
		for what, pr := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
			if pr == nil {
				continue
			}
			var port *intstr.IntOrString
			switch {
			case pr.HTTPGet != nil:
				port = &pr.HTTPGet.Port
			case pr.TCPSocket != nil:
				port = &pr.TCPSocket.Port
			case pr.GRPC == nil && pr.Exec == nil:
				t.Errorf("container %q %s probe has no handler", c.Name, what)
			}
			if port != nil && port.Type == intstr.String {
				if _, ok := ports[port.StrVal]; !ok {
					t.Errorf("container %q %s probe uses port %q, which the container does not name", c.Name, what, port.StrVal)
				}
			}
		}
		mounts := map[string]bool{}
		for _, m := range c.VolumeMounts {
			if _, ok := volumes[m.Name]; !ok {
				t.Errorf("container %q mounts volume %q, which the pod does not have", c.Name, m.Name)
			}
			if mounts[m.MountPath] {
				t.Errorf("container %q mounts %s twice", c.Name, m.MountPath)
			}
			mounts[m.MountPath] = true
			used[m.Name] = true
		}
		defined := map[string]bool{}
		for _, e := range c.Env {
			for _, msg := range validation.IsEnvVarName(e.Name) {
				t.Errorf("container %q env %q: %s", c.Name, e.Name, msg)
			}
			if e.Value != "" && e.ValueFrom != nil {
				t.Errorf("container %q env %q: value and valueFrom both set", c.Name, e.Name)
			}
			for _, ref := range regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).FindAllStringSubmatch(e.Value, -1) {
				if !defined[ref[1]] {
					t.Errorf("container %q env %q refers to $(%s) before it is defined", c.Name, e.Name, ref[1])
				}
			}
			defined[e.Name] = true
		}
		if c.RestartPolicy != nil && !slices.ContainsFunc(spec.InitContainers, func(ic corev1.Container) bool { return ic.Name == c.Name }) {
			t.Errorf("container %q: restartPolicy is only allowed on init containers", c.Name)
		}
	}
	for name, v := range volumes {
		if !used[name] {
			t.Errorf("volume %q is mounted by no container", name)
		}
		if v.Secret != nil && v.Secret.SecretName == "" {
			t.Errorf("volume %q: secret without secretName", name)
		}
	}
	if spec.AutomountServiceAccountToken != nil && *spec.AutomountServiceAccountToken && spec.ServiceAccountName == "" {
		t.Log("note: the default service account's token is mounted")
	}
}

// checkHopperContainer checks the sidecar itself: probes on the admin port,
// the config file and the hardened securityContext.
func checkHopperContainer(t *testing.T, pod *corev1.PodTemplateSpec, c *corev1.Container, native bool) {
	t.Helper()
	if !slices.Equal(c.Args, []string{"run"}) || len(c.Command) != 0 {
		t.Errorf("Hopper command %q args %q: want the image's entrypoint with args [run]", c.Command, c.Args)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if env["HOPPER_CONFIG"].Value != chartConfigPath {
		t.Errorf("HOPPER_CONFIG = %q, want %s", env["HOPPER_CONFIG"].Value, chartConfigPath)
	}
	if m := volumeMountAt(c, chartConfigPath); m == nil || !m.ReadOnly || m.SubPath != "hopper.yaml" {
		t.Errorf("hopper.yaml should be mounted read-only at %s (subPath hopper.yaml), got %+v", chartConfigPath, m)
	}
	for _, p := range []struct {
		what string
		pr   *corev1.Probe
		path string
	}{{"liveness", c.LivenessProbe, "/livez"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.pr == nil || p.pr.HTTPGet == nil || p.pr.HTTPGet.Path != p.path || p.pr.HTTPGet.Port.StrVal != "hopper-admin" {
			t.Errorf("Hopper %s probe: want GET %s on port hopper-admin, got %+v", p.what, p.path, p.pr)
		}
	}
	if c.StartupProbe != nil && native && c.StartupProbe.HTTPGet != nil && c.StartupProbe.HTTPGet.Path == "/readyz" {
		t.Error("a native sidecar's startup probe on /readyz deadlocks: the app starts only after it passes, and Hopper is ready only once the app is")
	}
	// Secret files must be readable by UID 65532: they are root-owned, and
	// group-readable only helps when the pod sets an fsGroup.
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			mode := int32(0o644)
			if v.Secret.DefaultMode != nil {
				mode = *v.Secret.DefaultMode
			}
			psc := pod.Spec.SecurityContext
			if mode&0o004 == 0 && (psc == nil || psc.FSGroup == nil || mode&0o040 == 0) {
				t.Errorf("secret volume %s has mode %#o: Hopper (UID 65532) cannot read it", v.Name, mode)
			}
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("Hopper resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	}
	sc := c.SecurityContext
	psc := pod.Spec.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("Hopper has no securityContext")
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
		t.Error("Hopper securityContext: runAsNonRoot must be true")
	case sc.RunAsUser == nil || *sc.RunAsUser != 65532:
		t.Errorf("Hopper securityContext: runAsUser %v, want 65532 (the image's user)", sc.RunAsUser)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("Hopper securityContext: readOnlyRootFilesystem must be true")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("Hopper securityContext: allowPrivilegeEscalation must be false")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("Hopper securityContext: capabilities %+v, want drop [ALL] and nothing added", sc.Capabilities)
	case (sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault) &&
		(psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault):
		t.Error("Hopper: seccompProfile RuntimeDefault is set neither on the container nor on the pod")
	case sc.Privileged != nil && *sc.Privileged:
		t.Error("Hopper must not be privileged")
	}
}

func volumeMountAt(c *corev1.Container, path string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == path {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func volumeOf(pod *corev1.PodTemplateSpec, c *corev1.Container, path string) *corev1.Volume {
	m := volumeMountAt(c, path)
	if m == nil {
		return nil
	}
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == m.Name {
			return &pod.Spec.Volumes[i]
		}
	}
	return nil
}

// checkServices checks the optional objects point at the Deployment's pods.
func checkServices(t *testing.T, ms []manifest, d *appsv1.Deployment) {
	t.Helper()
	pod := d.Spec.Template
	podPorts := map[string]bool{}
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		for _, p := range c.Ports {
			podPorts[p.Name] = true
		}
	}
	services := byKind[*corev1.Service](ms)
	for _, s := range services {
		checkSelector(t, "Service "+s.Name, &metav1.LabelSelector{MatchLabels: s.Spec.Selector}, pod.Labels)
		for _, p := range s.Spec.Ports {
			if p.TargetPort.Type == intstr.String && !podPorts[p.TargetPort.StrVal] {
				t.Errorf("Service %s targets port %q, which no container names", s.Name, p.TargetPort.StrVal)
			}
		}
	}
	for _, sm := range byKind[*serviceMonitor](ms) {
		checkServiceMonitor(t, sm, services)
	}
	for _, pdb := range byKind[*policyv1.PodDisruptionBudget](ms) {
		checkSelector(t, "PodDisruptionBudget "+pdb.Name, pdb.Spec.Selector, pod.Labels)
		if (pdb.Spec.MinAvailable == nil) == (pdb.Spec.MaxUnavailable == nil) {
			t.Errorf("PodDisruptionBudget %s: set exactly one of minAvailable and maxUnavailable", pdb.Name)
		}
	}
	hpas := byKind[*autoscalingv2.HorizontalPodAutoscaler](ms)
	for _, h := range hpas {
		ref := h.Spec.ScaleTargetRef
		if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name != d.Name {
			t.Errorf("HPA %s targets %+v, want the Deployment %s", h.Name, ref, d.Name)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 1 || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
			t.Errorf("HPA %s: replicas min %v max %d", h.Name, h.Spec.MinReplicas, h.Spec.MaxReplicas)
		}
		if len(h.Spec.Metrics) == 0 {
			t.Errorf("HPA %s has no metrics", h.Name)
		}
		for _, m := range h.Spec.Metrics {
			if m.Type == autoscalingv2.ResourceMetricSourceType {
				for _, c := range pod.Spec.Containers {
					if _, ok := c.Resources.Requests[m.Resource.Name]; !ok {
						t.Errorf("HPA %s scales on %s utilization but container %q has no %s request", h.Name, m.Resource.Name, c.Name, m.Resource.Name)
					}
				}
			}
		}
	}
	scaled := len(hpas) > 0
	for _, o := range byKind[*crdObject](ms) {
		scaled = scaled || o.Kind == "ScaledObject"
	}
	if scaled && d.Spec.Replicas != nil {
		t.Error("Deployment sets replicas while an HPA or KEDA manages them: every upgrade would reset the scale")
	}
	for _, sa := range byKind[*corev1.ServiceAccount](ms) {
		if pod.Spec.ServiceAccountName != sa.Name {
			t.Errorf("ServiceAccount %s is rendered but the pods use %q", sa.Name, pod.Spec.ServiceAccountName)
		}
	}
}

var promDuration = regexp.MustCompile(`^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$`)

func checkServiceMonitor(t *testing.T, sm *serviceMonitor, services []*corev1.Service) {
	t.Helper()
	if sm.APIVersion != "monitoring.coreos.com/v1" || sm.Kind != "ServiceMonitor" {
		t.Errorf("ServiceMonitor type %s/%s", sm.APIVersion, sm.Kind)
	}
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil || sel.Empty() {
		t.Fatalf("ServiceMonitor %s: selector %v: %v", sm.Name, sel, err)
	}
	var target *corev1.Service
	for _, s := range services {
		if sel.Matches(labels.Set(s.Labels)) {
			if target != nil {
				t.Errorf("ServiceMonitor %s selects several Services", sm.Name)
			}
			target = s
		}
	}
	if target == nil {
		t.Fatalf("ServiceMonitor %s selects no rendered Service", sm.Name)
	}
	if ns := sm.Spec.NamespaceSelector; ns == nil || !slices.Equal(ns.MatchNames, []string{namespace}) {
		t.Errorf("ServiceMonitor %s: namespaceSelector %+v, want the release namespace %s", sm.Name, ns, namespace)
	}
	if len(sm.Spec.Endpoints) == 0 {
		t.Errorf("ServiceMonitor %s has no endpoints", sm.Name)
	}
	actions := []string{"replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep", "lowercase", "uppercase", "keepequal", "dropequal"}
	for _, e := range sm.Spec.Endpoints {
		if !slices.ContainsFunc(target.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == e.Port }) {
			t.Errorf("ServiceMonitor %s scrapes port %q, which Service %s does not name", sm.Name, e.Port, target.Name)
		}
		if !strings.HasPrefix(e.Path, "/") {
			t.Errorf("ServiceMonitor %s: path %q", sm.Name, e.Path)
		}
		for _, d := range []string{e.Interval, e.ScrapeTimeout} {
			if d != "" && !promDuration.MatchString(d) {
				t.Errorf("ServiceMonitor %s: %q is not a Prometheus duration", sm.Name, d)
			}
		}
		if e.Interval != "" && e.ScrapeTimeout != "" {
			iv, err1 := timeParse(e.Interval)
			st, err2 := timeParse(e.ScrapeTimeout)
			if err1 == nil && err2 == nil && st > iv {
				t.Errorf("ServiceMonitor %s: scrapeTimeout %s exceeds interval %s", sm.Name, e.ScrapeTimeout, e.Interval)
			}
		}
		for _, r := range append(append([]relabeling{}, e.Relabelings...), e.MetricRelabelings...) {
			if r.Action != "" && !slices.Contains(actions, strings.ToLower(r.Action)) {
				t.Errorf("ServiceMonitor %s: relabel action %q", sm.Name, r.Action)
			}
			if r.Regex != "" {
				if _, err := regexp.Compile(r.Regex); err != nil {
					t.Errorf("ServiceMonitor %s: relabel regex %q: %v", sm.Name, r.Regex, err)
				}
			}
		}
	}
}

func timeParse(s string) (float64, error) {
	d, err := config.ParseDuration(s)
	return d.D().Seconds(), err
}

// validateRenderedConfig runs `hopper config validate` on the rendered
// hopper.yaml with the Hopper container's environment, as the pod would
// (it must report the work queues, several with subscriptions):
// HOPPER_CONFIG names the file, secrets are mounted as files (stand-ins
// here, at the same paths under a temporary root) and secretKeyRef
// variables get stand-in values.
func validateRenderedConfig(t *testing.T, pod *corev1.PodTemplateSpec, c *corev1.Container, data string, multi bool, queues []string) {
	t.Helper()
	root := t.TempDir()
	mounted := map[string]string{} // mount path/ -> stand-in folder/
	for _, m := range c.VolumeMounts {
		if m.MountPath == chartConfigPath {
			continue
		}
		var v *corev1.Volume
		for i := range pod.Spec.Volumes {
			if pod.Spec.Volumes[i].Name == m.Name {
				v = &pod.Spec.Volumes[i]
			}
		}
		if v == nil || v.Secret == nil && v.Projected == nil {
			continue
		}
		dir := filepath.Join(root, m.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		files := map[string][]byte{}
		if v.Secret != nil {
			for _, it := range v.Secret.Items {
				files[it.Path] = standInSecret(t, it)
			}
		} else {
			for _, src := range v.Projected.Sources {
				if src.ServiceAccountToken != nil {
					files[src.ServiceAccountToken.Path] = []byte("stand-in service-account token")
				}
			}
		}
		for p, b := range files {
			if err := os.WriteFile(filepath.Join(dir, p), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		// The config and the environment name files under the mount; point
		// them at the stand-ins.
		data = strings.ReplaceAll(data, m.MountPath+"/", filepath.Join(root, m.MountPath)+"/")
		mounted[m.MountPath+"/"] = filepath.Join(root, m.MountPath) + "/"
	}
	cfgPath := filepath.Join(root, chartConfigPath)
	if err := os.MkdirAll(filepath.Dir(cfgPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, e := range c.Env {
		val := e.Value
		switch {
		case e.Name == "HOPPER_CONFIG":
			val = cfgPath
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			val = "stand-in"
			switch e.Name {
			case "HOPPER_BROKER_URLS":
				val = "amqp://orders:stand-in@rabbitmq.test:5672/orders"
			case "OTEL_EXPORTER_OTLP_HEADERS":
				val = "authorization=stand-in"
			}
		case e.ValueFrom != nil:
			val = "stand-in"
		}
		for mp, dir := range mounted {
			if strings.HasPrefix(val, mp) {
				val = dir + strings.TrimPrefix(val, mp)
			}
		}
		env = append(env, e.Name+"="+val)
	}
	checkOtelEnv(t, env)
	stdout, stderr, err := runHopper(t, env, "config", "validate")
	if err != nil {
		t.Errorf("hopper config validate rejects the rendered config: %v\n%s%s\nconfig:\n%s", err, stdout, stderr, data)
		return
	}
	if !multi {
		if want := `config OK: queue "` + queues[0] + `"`; !strings.Contains(stdout, want) {
			t.Errorf("hopper config validate: %q, want %q", stdout, want)
		}
	} else if !strings.HasPrefix(stdout, "config OK") {
		t.Errorf("hopper config validate: %q, want config OK", stdout)
	}
	for _, q := range queues {
		if !strings.Contains(stdout, strconv.Quote(q)) {
			t.Errorf("hopper config validate: %q does not name the work queue %q", stdout, q)
		}
	}
	if strings.Contains(stderr, "matches no config key") {
		t.Errorf("the chart sets HOPPER_* variables Hopper does not know:\n%s", stderr)
	}
}

// checkOtelEnv checks the OTEL_* variables as Hopper reads them: tracing is
// on exactly when the chart enabled it (telemetry.TracingFromEnv accepts the
// protocol and finds the endpoint), and OTEL_RESOURCE_ATTRIBUTES, once the
// kubelet has expanded $(VAR), is a list of key=value.
func checkOtelEnv(t *testing.T, env []string) {
	t.Helper()
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		// The kubelet expands $(VAR) from the variables defined before.
		vars[k] = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(v, func(ref string) string {
			return vars[ref[2:len(ref)-1]]
		})
	}
	wantOn := vars["OTEL_SDK_DISABLED"] != "true"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tr, err := telemetry.TracingFromEnv(ctx, func(k string) string { return vars[k] }, "test")
	if err != nil {
		t.Errorf("Hopper rejects the OTEL_* variables: %v", err)
		return
	}
	defer tr.Shutdown(ctx)
	if tr.Enabled != wantOn {
		t.Errorf("tracing enabled = %v from the rendered OTEL_* variables, want %v", tr.Enabled, wantOn)
	}
	if attrs, ok := vars["OTEL_RESOURCE_ATTRIBUTES"]; ok {
		for _, kv := range strings.Split(attrs, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" || v == "" {
				t.Errorf("OTEL_RESOURCE_ATTRIBUTES %q: entry %q is not key=value", attrs, kv)
			}
		}
	}
}

// TestChartRejects checks that mistakes fail the render with a clear
// message, from the schema or from the templates.
func TestChartRejects(t *testing.T) {
	minimal := repoPath(chartDir, "ci", "minimal-values.yaml")
	native := repoPath(chartDir, "ci", "native-sidecar-values.yaml")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown top-level key", []string{"-f", minimal, "--set", "replicaCount=2"}, "additional properties 'replicaCount' not allowed"},
		{"unknown top-level key", []string{"-f", minimal, "--set", "imgae.tag=x"}, "additional properties 'imgae' not allowed"},
		{"unknown config key", []string{"-f", minimal, "--set", "config.queue.nmae=x"}, "additional properties 'nmae' not allowed"},
		{"unknown config section", []string{"-f", minimal, "--set", "config.metrics.enabled=true"}, "additional properties 'metrics' not allowed"},
		{"wrong type", []string{"-f", minimal, "--set", "config.consumer.prefetch=fifty"}, "/config/consumer/prefetch"},
		{"duration without unit", []string{"-f", minimal, "--set", "config.shutdown.grace=25"}, "/config/shutdown/grace"},
		{"bad duration", []string{"-f", minimal, "--set-string", "config.retry.tiers={1s,5 minutes}"}, "/config/retry/tiers/1"},
		{"bad outcome action", []string{"-f", minimal, "--set", "config.retry.outcomes.4xx=explode"}, "/config/retry/outcomes/4xx"},
		{"bad outcome key", []string{"-f", minimal, "--set", "config.retry.outcomes.4XX=retry"}, "invalid propertyName '4XX'"},
		{"bad attempts", []string{"-f", minimal, "--set", "config.retry.maxAttempts=0"}, "/config/retry/maxAttempts"},
		{"forward bound under Hopper's own headers", []string{"-f", minimal, "--set", "config.app.forward.maxHeaders=20"}, "/config/app/forward/maxHeaders"},
		{"unknown forward key", []string{"-f", minimal, "--set", "config.app.forward.maxHeader=20"}, "additional properties 'maxHeader' not allowed"},
		{"policy without match", []string{"-f", minimal, "--set", "config.retry.policies[0].name=x"}, "missing property 'match'"},
		{"queue type", []string{"-f", minimal, "--set", "config.queue.type=fifo"}, "/config/queue/type"},
		{"admin on loopback", []string{"-f", minimal, "--set", "config.admin.listen=127.0.0.1:9090"}, "/config/admin/listen"},
		{"broker url scheme", []string{"-f", minimal, "--set", "config.broker.urls={http://rabbitmq}"}, "/config/broker/urls/0"},
		{"pull policy", []string{"-f", minimal, "--set", "image.pullPolicy=Sometimes"}, "/image/pullPolicy"},
		{"no queue", []string{"--set", "app.image.repository=x"}, "config.queue.name or config.subscriptions is required"},
		{"no app image", []string{"--set", "config.queue.name=orders"}, "app.image.repository is required"},
		{"no app tag", []string{"-f", minimal, "--set", "app.image.tag="}, "app.image.tag (or app.image.digest) is required"},
		{"otel without endpoint", []string{"-f", minimal, "--set", "otel.enabled=true"}, "otel.endpoint is required"},
		{"otel protocol Hopper lacks", []string{"-f", minimal, "--set", "otel.enabled=true", "--set", "otel.endpoint=http://c:4318", "--set", "otel.protocol=http/json"}, "/otel/protocol"},
		{"grace period too short", []string{"-f", minimal, "--set", "terminationGracePeriodSeconds=25"}, "must exceed config.shutdown.grace (25s)"},
		{"native sidecar on old cluster", []string{"-f", native, "--kube-version", "1.28.0"}, "needs Kubernetes >= 1.29"},
		{"secret keys without secret", []string{"-f", minimal, "--set", "broker.existingSecret="}, "broker.existingSecret is required"},
		{"credential files without urls", []string{"-f", minimal, "--set", "broker.urlKey=", "--set", "broker.passwordKey=password"}, "config.broker.urls must name the broker"},
		{"password twice", []string{"-f", minimal, "--set", "broker.passwordKey=password", "--set", "config.broker.passwordFile=/x"}, "not both"},
		{"keda and hpa", []string{"-f", minimal, "--set", "keda.enabled=true", "--set", "autoscaling.enabled=true"}, "keda.enabled and autoscaling.enabled both scale the Deployment"},
		{"keda message rate over amqp", []string{"-f", minimal, "--set", "keda.enabled=true", "--set", "keda.mode=MessageRate", "--set", "keda.protocol=amqp"}, "set keda.protocol to http"},
		{"keda without broker secret", []string{"-f", minimal, "--set", "keda.enabled=true", "--set", "keda.protocol=amqp", "--set", "broker.existingSecret=", "--set", "broker.urlKey="}, "needs the broker's URL from a Secret"},
		{"keda in sidecar mode without target", []string{"-f", minimal, "--set", "deployment.enabled=false", "--set", "keda.enabled=true"}, "keda.scaleTargetName is required"},
		{"keda bad value", []string{"-f", minimal, "--set", "keda.enabled=true", "--set-string", "keda.value=lots"}, "/keda/value"},
		{"pod monitor in sidecar mode without selector", []string{"-f", minimal, "--set", "deployment.enabled=false", "--set", "metrics.podMonitor.enabled=true"}, "metrics.selector is required"},
		{"eviction policy", []string{"-f", minimal, "--set", "podDisruptionBudget.unhealthyPodEvictionPolicy=Never"}, "/podDisruptionBudget/unhealthyPodEvictionPolicy"},
		{"alert duration", []string{"-f", minimal, "--set", "metrics.prometheusRule.breakerOpenFor=ten"}, "/metrics/prometheusRule/breakerOpenFor"},
		{"client cert without key", []string{"-f", minimal, "--set", "broker.tls.existingSecret=tls", "--set", "broker.tls.certKey=tls.crt"}, "certKey and keyKey must be given together"},
		{"hpa without requests", []string{"-f", minimal, "--set", "autoscaling.enabled=true"}, "app.resources.requests.cpu"},
		{"network policy without broker ports", []string{"-f", minimal, "--set-json", "networkPolicy.broker.ports=[]"}, "/networkPolicy/broker/ports"},
		{"network policy port out of range", []string{"-f", minimal, "--set", "networkPolicy.broker.ports={70000}"}, "/networkPolicy/broker/ports/0"},
		{"unknown network policy key", []string{"-f", minimal, "--set", "networkPolicy.ingress=x"}, "additional properties 'ingress' not allowed"},
		{"network policy metrics peer removed", []string{"-f", minimal, "--set", "networkPolicy.enabled=true", "--set", "networkPolicy.metrics.namespaceSelector=null"}, "networkPolicy.metrics: set namespaceSelector or podSelector"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"template", release, repoPath(chartDir), "--namespace", namespace, "--kube-version", kubeVersion}, c.args...)
			stdout, stderr, err := runHelm(t, args...)
			if err == nil {
				t.Fatalf("helm %s rendered; want an error containing %q\n%s", strings.Join(args, " "), c.want, stdout)
			}
			if !strings.Contains(stderr, c.want) {
				t.Errorf("helm template failed with\n%s\nwant it to mention %q", stderr, c.want)
			}
		})
	}
}

// TestChartSchemaMirrorsConfig checks that values.schema.json's
// hopper.config lists exactly the keys of Hopper's config (config.Config's
// yaml fields), so a new config key cannot be rejected by the chart and a
// removed one cannot linger; and that every object in the hopper section is
// closed (additionalProperties: false).
func TestChartSchemaMirrorsConfig(t *testing.T) {
	var schema map[string]any
	if err := json.Unmarshal([]byte(readRepoFile(t, chartDir, "values.schema.json")), &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	if schema["$schema"] != "http://json-schema.org/draft-07/schema#" {
		t.Errorf("values.schema.json $schema = %v, want draft-07", schema["$schema"])
	}
	defs, _ := schema["definitions"].(map[string]any)
	resolve := func(n map[string]any) map[string]any {
		for {
			ref, ok := n["$ref"].(string)
			if !ok {
				return n
			}
			d, _ := defs[strings.TrimPrefix(ref, "#/definitions/")].(map[string]any)
			if d == nil {
				t.Fatalf("unresolved $ref %s", ref)
			}
			n = d
		}
	}
	cfgSchema := resolve(dig(schema, "properties", "config").(map[string]any))

	var want, got []string
	var walkType func(reflect.Type, string)
	walkType = func(rt reflect.Type, prefix string) {
		for rt.Kind() == reflect.Pointer || rt.Kind() == reflect.Slice {
			rt = rt.Elem()
		}
		if rt.Kind() != reflect.Struct {
			return
		}
		for i := 0; i < rt.NumField(); i++ {
			f := rt.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" || !f.IsExported() {
				continue
			}
			want = append(want, prefix+name)
			walkType(f.Type, prefix+name+".")
		}
	}
	walkType(reflect.TypeOf(config.Config{}), "")

	var walkSchema func(map[string]any, string)
	walkSchema = func(n map[string]any, prefix string) {
		n = resolve(n)
		if items, ok := n["items"].(map[string]any); ok {
			walkSchema(items, prefix)
		}
		props, ok := n["properties"].(map[string]any)
		if !ok {
			return
		}
		if n["additionalProperties"] != false {
			t.Errorf("schema for config.%s is open: set additionalProperties false", strings.TrimSuffix(prefix, "."))
		}
		for k, v := range props {
			got = append(got, prefix+k)
			walkSchema(v.(map[string]any), prefix+k+".")
		}
	}
	walkSchema(cfgSchema, "")
	sort.Strings(want)
	sort.Strings(got)
	for _, k := range want {
		if !slices.Contains(got, k) {
			t.Errorf("config key %s is missing from charts/hopper/values.schema.json (config): the chart would reject it", k)
		}
	}
	for _, k := range got {
		if !slices.Contains(want, k) {
			t.Errorf("charts/hopper/values.schema.json lists config.%s, which Hopper's config does not have", k)
		}
	}

	// Every object schema is closed, except the Kubernetes pass-through
	// objects (resources, securityContext, ...) and label maps.
	var closed func(map[string]any, string)
	closed = func(n map[string]any, path string) {
		n = resolve(n)
		if props, ok := n["properties"].(map[string]any); ok {
			// global is shared with a parent chart and its other
			// dependencies: Helm hands this chart their keys too.
			if n["additionalProperties"] != false && path != "values.global" {
				t.Errorf("schema for %s is open: set additionalProperties false", path)
			}
			for k, v := range props {
				closed(v.(map[string]any), path+"."+k)
			}
		}
		if items, ok := n["items"].(map[string]any); ok {
			closed(items, path+"[]")
		}
		for _, k := range []string{"allOf", "oneOf", "anyOf"} {
			if l, ok := n[k].([]any); ok {
				for _, s := range l {
					closed(s.(map[string]any), path)
				}
			}
		}
	}
	closed(schema, "values")
	if schema["additionalProperties"] != false {
		t.Error("values.schema.json: the top level should reject unknown keys too")
	}
}

// TestChartDefaults ties the chart's defaults to Hopper's and the image's.
func TestChartDefaults(t *testing.T) {
	var chart struct {
		AppVersion string `json:"appVersion"`
		APIVersion string `json:"apiVersion"`
	}
	if err := yaml.Unmarshal([]byte(readRepoFile(t, chartDir, "Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	if chart.APIVersion != "v2" {
		t.Errorf("Chart.yaml apiVersion %q, want v2 (Helm 3)", chart.APIVersion)
	}
	var values map[string]any
	if err := yaml.Unmarshal([]byte(readRepoFile(t, chartDir, "values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	if tag := dig(values, "image", "tag"); tag != chart.AppVersion {
		t.Errorf("values.yaml image.tag %v, want Chart.yaml appVersion %q", tag, chart.AppVersion)
	}
	if uid := dig(values, "securityContext", "runAsUser"); uid != float64(65532) {
		t.Errorf("securityContext.runAsUser %v, want the image's 65532", uid)
	}
	// The minimal render: default admin port and grace are Hopper's.
	stdout, stderr, err := runHelm(t, templateArgs(renderCase{chart: repoPath(chartDir), args: []string{"-f", repoPath(chartDir, "ci", "minimal-values.yaml")}})...)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	ms := decodeManifests(t, stdout)
	d := byKind[*appsv1.Deployment](ms)
	cms := byKind[*corev1.ConfigMap](ms)
	if len(d) != 1 || len(cms) != 1 {
		t.Fatalf("got %s", kindsOf(ms))
	}
	def := config.Default()
	var rendered map[string]any
	if err := yaml.Unmarshal([]byte(cms[0].Data["hopper.yaml"]), &rendered); err != nil {
		t.Fatal(err)
	}
	if got := dig(rendered, "admin", "listen"); got != def.Admin.Listen {
		t.Errorf("chart's default admin.listen %v, Hopper's %q", got, def.Admin.Listen)
	}
	if dig(rendered, "shutdown") != nil {
		t.Errorf("the minimal render sets shutdown: %v; it should keep Hopper's default", dig(rendered, "shutdown"))
	}
	tg := d[0].Spec.Template.Spec.TerminationGracePeriodSeconds
	if tg == nil || *tg != int64(def.Shutdown.Grace.D().Seconds())+5 {
		t.Errorf("terminationGracePeriodSeconds %v, want shutdown.grace %s + 5s margin", tg, def.Shutdown.Grace)
	}
}

// TestChartReadmeValuesTable checks charts/hopper/README.md documents every
// value in values.yaml and nothing that is not there.
func TestChartReadmeValuesTable(t *testing.T) {
	readme := readRepoFile(t, chartDir, "README.md")
	_, readme, ok := strings.Cut(readme, "\n## Values\n")
	if !ok {
		t.Fatal("charts/hopper/README.md has no \"## Values\" section")
	}
	readme, _, _ = strings.Cut(readme, "\n## ")
	var values map[string]any
	if err := yaml.Unmarshal([]byte(readRepoFile(t, chartDir, "values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	var documented []string
	row := regexp.MustCompile("(?m)^\\| `([A-Za-z0-9_.]+)` \\|")
	for _, m := range row.FindAllStringSubmatch(readme, -1) {
		documented = append(documented, m[1])
	}
	if len(documented) == 0 {
		t.Fatal("charts/hopper/README.md has no values table (rows starting with | `key` |)")
	}
	var leaves []string
	var walk func(map[string]any, string)
	walk = func(m map[string]any, prefix string) {
		for k, v := range m {
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
				walk(sub, prefix+k+".")
				continue
			}
			leaves = append(leaves, prefix+k)
		}
	}
	walk(values, "")
	sort.Strings(leaves)
	covered := func(leaf string) bool {
		return slices.ContainsFunc(documented, func(d string) bool { return leaf == d || strings.HasPrefix(leaf, d+".") })
	}
	for _, l := range leaves {
		if !covered(l) {
			t.Errorf("value %s is not in charts/hopper/README.md's values table", l)
		}
	}
	for _, d := range documented {
		if !slices.ContainsFunc(leaves, func(l string) bool { return l == d || strings.HasPrefix(l, d+".") }) {
			t.Errorf("charts/hopper/README.md documents %s, which values.yaml does not have", d)
		}
	}
}

// TestChartNotes renders templates/NOTES.txt, which helm template skips: a
// copy of the chart turns it into a ConfigMap so that a template error or a
// missing value in it fails here instead of at install time.
func TestChartNotes(t *testing.T) {
	dir := filepath.Join(scratch, "notes-chart")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := copyTree(repoPath(chartDir), dir); err != nil {
		t.Fatal(err)
	}
	notes := readRepoFile(t, chartDir, "templates", "NOTES.txt")
	wrapped := "{{- define \"packagingtest.notes\" }}\n" + notes + "\n{{- end }}\n" +
		"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: {{ include \"packagingtest.notes\" . | toJson }}\n"
	if err := os.WriteFile(filepath.Join(dir, "templates", "zz-notes.yaml"), []byte(wrapped), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "templates", "NOTES.txt")); err != nil {
		t.Fatal(err)
	}
	minimal := repoPath(chartDir, "ci", "minimal-values.yaml")
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"minimal", []string{"-f", minimal}, []string{`Hopper consumes queue "orders"`, "http://127.0.0.1:8080/", "Grace period:    30s", "regular container"}},
		{"full", []string{"-f", repoPath(chartDir, "ci", "full-values.yaml")}, []string{"port-forward deployment/rel-orders 9191", "verified (topology.declare: false)", "Traces: OTLP"}},
		{"native", []string{"-f", repoPath(chartDir, "ci", "native-sidecar-values.yaml")}, []string{"native sidecar", "Grace period:    110s"}},
		{"no broker secret", []string{"-f", minimal, "--set", "broker.existingSecret=", "--set", "broker.urlKey="}, []string{"WARNING: no broker Secret", "Hopper will try amqp://127.0.0.1:5672"}},
		{"sidecar mode", []string{"-f", minimal, "--set", "deployment.enabled=false"}, []string{"include \"hopper.sidecar\"", "ConfigMap rel-hopper"}},
		{"keda", []string{"-f", repoPath(chartDir, "ci", "keda-values.yaml")}, []string{"KEDA 0-8 replica(s)", "KEDA counts:     ready + unacknowledged messages (management API)"}},
		{"console", []string{"-f", minimal, "--set", "console.enabled=true", "--set", "console.allowActions=true"}, []string{"port-forward deployment/rel-hopper-console 8089", "the token is in its log"}},
		{"console read-only", []string{"-f", minimal, "--set", "console.enabled=true"}, []string{"DLQ console (read-only: a quorum DLQ shows its depth only)"}},
		{"subscriptions", []string{"-f", repoPath(chartDir, "ci", "subscriptions-values.yaml")}, []string{"Hopper consumes 2 queue(s)", "KEDA counts:     ready messages only over AMQP", "at http://127.0.0.1:8080/messages/{queue}",
			`"wms.queue.billing" -> /billing/{routingKey}`, `"wms.queue.shipping" -> (the path of app.url)`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"template", release, dir, "--namespace", namespace, "--kube-version", kubeVersion, "--show-only", "templates/zz-notes.yaml"}, c.args...)
			stdout, stderr, err := runHelm(t, args...)
			if err != nil {
				t.Fatalf("NOTES.txt does not render: %v\n%s", err, stderr)
			}
			cms := byKind[*corev1.ConfigMap](decodeManifests(t, stdout))
			if len(cms) != 1 {
				t.Fatalf("rendered:\n%s", stdout)
			}
			got := cms[0].Data["notes"]
			if strings.Contains(got, "<no value>") || strings.Contains(got, "%!") {
				t.Errorf("NOTES.txt shows a missing value:\n%s", got)
			}
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("NOTES.txt lacks %q:\n%s", w, got)
				}
			}
		})
	}
}

// checkToolJob checks the one-shot tool Job: it mounts Hopper's ConfigMap,
// never restarts a half-done run, and its command line is one the hopper
// binary accepts (run with --help, which parses every flag and subcommand).
func checkToolJob(t *testing.T, j *batchv1.Job, cm *corev1.ConfigMap) {
	t.Helper()
	pod := &j.Spec.Template
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("Job %s: restartPolicy %q, want Never (a tool run is not repeated behind the operator's back)", j.Name, pod.Spec.RestartPolicy)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("Job %s: %d containers", j.Name, len(pod.Spec.Containers))
	}
	c := &pod.Spec.Containers[0]
	vol := volumeOf(pod, c, chartConfigPath)
	if vol == nil || vol.ConfigMap == nil || vol.ConfigMap.Name != cm.Name {
		t.Errorf("Job %s does not mount ConfigMap %s at %s", j.Name, cm.Name, chartConfigPath)
	}
	for _, m := range c.VolumeMounts {
		if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name }) {
			t.Errorf("Job %s mounts volume %s, which its pod lacks", j.Name, m.Name)
		}
	}
	for k, v := range pod.Labels {
		if k == "app.kubernetes.io/name" && v == "hopper" {
			t.Errorf("Job %s: its pods carry the Deployment's selector labels; the PDB and Services would count them", j.Name)
		}
	}
	stdout, stderr, err := runHopper(t, []string{"PATH=" + os.Getenv("PATH")}, append(append([]string{}, c.Args...), "--help")...)
	if err != nil {
		t.Errorf("Job %s: hopper %s is not a command line hopper accepts: %v\n%s", j.Name, strings.Join(c.Args, " "), err, stderr)
	}
	// A misspelt subcommand with --help shows its parent's help: the usage
	// line must name the whole command.
	var path []string
	for _, a := range c.Args {
		if strings.HasPrefix(a, "-") {
			break
		}
		path = append(path, a)
	}
	if want := "Usage:\n  hopper " + strings.Join(path, " ") + " "; !strings.Contains(stdout, want) {
		t.Errorf("Job %s: hopper %s is not a hopper command (its help does not show %q)", j.Name, strings.Join(c.Args, " "), want)
	}
}
