package config

import (
	"os"
	"testing"

	"go.yaml.in/yaml/v3"
)

// yamlPaths lists the dotted paths of every mapping key in a YAML tree,
// without going into lists, each with its value's node.
func yamlPaths(n *yaml.Node, prefix string, out map[string]*yaml.Node) {
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	if n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		p := join(prefix, n.Content[i].Value)
		out[p] = n.Content[i+1]
		yamlPaths(n.Content[i+1], p, out)
	}
}

// TestExampleListsEveryDefault fails when examples/hopper.yaml, the file
// that lists every key with its default, leaves a key out, shows a default
// that is not Default()'s, or does not load.
func TestExampleListsEveryDefault(t *testing.T) {
	data, err := os.ReadFile("../examples/hopper.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		t.Fatalf("examples/hopper.yaml: %v", err)
	}
	present := map[string]*yaml.Node{}
	yamlPaths(&root, "", present)

	cfg := Default()
	if err := Parse(data, &cfg); err != nil {
		t.Fatalf("examples/hopper.yaml: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("examples/hopper.yaml invalid: %v", err)
	}
	got, want := KeyValues(cfg), KeyValues(Default())
	for _, k := range Reference() {
		if k.InItem || k.Object && !k.List {
			continue
		}
		if present[k.Path] == nil {
			t.Errorf("examples/hopper.yaml lacks %s (default %s)", k.Path, want[k.Path])
			continue
		}
		if k.Required {
			continue // an example value: it has no default
		}
		if got[k.Path] != want[k.Path] {
			t.Errorf("examples/hopper.yaml shows %s: %s, but its default is %s", k.Path, got[k.Path], want[k.Path])
		}
	}
}
