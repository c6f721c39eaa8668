package config

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestReferenceDocsInStep fails when a config key is added or renamed
// without updating the README's reference and examples/hopper.yaml.
func TestReferenceDocsInStep(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for env, path := range EnvVars() {
		if !strings.Contains(string(readme), "`"+path+"`") {
			t.Errorf("README config reference lacks key %s", path)
		}
		if !strings.Contains(string(readme), "`"+env+"`") {
			t.Errorf("README config reference lacks variable %s", env)
		}
	}
	for _, k := range []string{"retry.policies", "topology.bindings", "subscriptions"} {
		if !strings.Contains(string(readme), "`"+k+"`") {
			t.Errorf("README lacks %s", k)
		}
	}
	data, err := os.ReadFile("../examples/hopper.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	if err := Parse(data, &cfg); err != nil {
		t.Fatalf("examples/hopper.yaml: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("examples/hopper.yaml invalid: %v", err)
	}
	want := Default()
	want.Queue.Name = "orders"
	want.Retry.Outcomes = map[string]string{}
	want.Retry.Policies = []Policy{}
	want.Topology.Bindings = []Binding{}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("examples/hopper.yaml does not state the defaults:\n got %+v\nwant %+v", cfg, want)
	}
}
