package kubecheck

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/hopper-sidecar/hopper/config"
)

// TestKustomizeExample builds examples/kubernetes with Kustomize's own
// library (what `kubectl apply -k` runs) and checks that the component adds
// a working Hopper sidecar to the app's Deployment: both containers, the
// ConfigMap the sidecar mounts, a valid Hopper config, and a grace period
// longer than Hopper's shutdown grace.
func TestKustomizeExample(t *testing.T) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), repoPath("examples", "kubernetes"))
	if err != nil {
		t.Fatalf("kustomize build examples/kubernetes: %v", err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	var dep *appsv1.Deployment
	configMaps := map[string]*corev1.ConfigMap{}
	for _, part := range docSep.Split(string(out), -1) {
		if strings.TrimSpace(part) == "" {
			continue
		}
		j, err := yaml.YAMLToJSONStrict([]byte(part))
		if err != nil {
			t.Fatal(err)
		}
		d := doc{source: "kustomize", json: j}
		switch {
		case strings.Contains(part, "kind: Deployment"):
			d.kind = "Deployment"
			dep = &appsv1.Deployment{}
			if err := decodeStrict(d, dep); err != nil {
				t.Fatal(err)
			}
		case strings.Contains(part, "kind: ConfigMap"):
			d.kind = "ConfigMap"
			cm := &corev1.ConfigMap{}
			if err := decodeStrict(d, cm); err != nil {
				t.Fatal(err)
			}
			configMaps[cm.Name] = cm
		default:
			t.Errorf("unexpected object in the build:\n%s", part)
		}
	}
	if dep == nil {
		t.Fatal("the build has no Deployment")
	}
	pod := dep.Spec.Template.Spec
	names := []string{}
	var hopper *corev1.Container
	for i, c := range pod.Containers {
		names = append(names, c.Name)
		if c.Name == "hopper" {
			hopper = &pod.Containers[i]
		}
	}
	if !slices.Contains(names, "orders-api") || hopper == nil {
		t.Fatalf("containers %v: want the app's and hopper", names)
	}
	if dep.Spec.Template.Annotations["checksum/hopper-config"] == "" {
		t.Error("the pod template lacks checksum/hopper-config")
	}
	var cm *corev1.ConfigMap
	for _, m := range hopper.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				cm = configMaps[v.ConfigMap.Name]
			}
		}
	}
	if cm == nil {
		t.Fatalf("hopper mounts no ConfigMap of the build (have %v)", keys(configMaps))
	}
	cfg := config.Default()
	if err := config.Parse([]byte(cm.Data["hopper.yaml"]), &cfg); err != nil {
		t.Fatalf("hopper.yaml: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("hopper.yaml: %v", err)
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || float64(*g) <= cfg.Shutdown.Grace.D().Seconds() {
		t.Errorf("terminationGracePeriodSeconds %v does not exceed shutdown.grace %s", g, cfg.Shutdown.Grace.D())
	}
}
