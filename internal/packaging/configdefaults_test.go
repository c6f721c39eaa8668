package packaging

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/hopper-sidecar/hopper/config"
)

// chartFilled are the config keys values.yaml shows with a value of the
// chart's own rather than Hopper's default: examples (a queue name, a
// broker address, bindings, subscriptions) and what the chart fills in
// (app.healthPath from app.healthPath of the values).
var chartFilled = map[string]bool{
	"queue.name":        true,
	"broker.urls":       true,
	"topology.bindings": true,
	"subscriptions":     true,
	"app.healthPath":    true,
}

// TestChartValuesConfigShowsDefaults checks the commented config of
// values.yaml, which shows Hopper's defaults to whoever sets
// hopper.config: uncommented, it is a config Hopper loads (no key that
// does not exist), and every key it shows holds Default()'s value, unless
// the chart fills it in or it is an example (chartFilled).
func TestChartValuesConfigShowsDefaults(t *testing.T) {
	values := readRepoFile(t, chartDir, "values.yaml")
	var block []string
	in := false
	for _, l := range strings.Split(values, "\n") {
		if l == "config:" {
			in = true
			continue
		}
		if !in {
			continue
		}
		if !strings.HasPrefix(l, "  #") {
			break
		}
		l = strings.TrimPrefix(l, "  #")
		block = append(block, strings.TrimPrefix(l, " "))
	}
	if len(block) < 50 {
		t.Fatalf("values.yaml: found %d commented lines under config:, want the commented config (is it still laid out as `  # key: value`?)", len(block))
	}
	data := []byte(strings.Join(block, "\n"))

	cfg := config.Default()
	if err := config.Parse(data, &cfg); err != nil {
		t.Fatalf("values.yaml's commented config does not load:\n%v", err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		if n.Kind == yaml.DocumentNode {
			n = n.Content[0]
		}
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			p := n.Content[i].Value
			if prefix != "" {
				p = prefix + "." + p
			}
			shown[p] = true
			walk(n.Content[i+1], p)
		}
	}
	walk(&root, "")

	got, want := config.KeyValues(cfg), config.KeyValues(config.Default())
	checked := 0
	for path := range shown {
		w, isKey := want[path]
		if !isKey || chartFilled[path] {
			continue
		}
		checked++
		if got[path] != w {
			t.Errorf("values.yaml shows config.%s: %s, but Hopper's default is %s", path, got[path], w)
		}
	}
	if checked < 40 {
		t.Errorf("only %d keys of values.yaml's commented config were checked", checked)
	}
}

// TestChartSchemaTypesFollowConfig checks that values.schema.json gives
// every key of hopper.config the type Hopper reads it as, so that a key
// whose type changes (a number that becomes a duration) cannot be refused
// by the chart while Hopper takes it, or the other way round; and that a
// key's enum, where it has one, holds Hopper's default. Which keys there
// are is TestChartSchemaMirrorsConfig's; the schema's own bounds and
// patterns are its own.
func TestChartSchemaTypesFollowConfig(t *testing.T) {
	var schema map[string]any
	if err := json.Unmarshal([]byte(readRepoFile(t, chartDir, "values.schema.json")), &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	defs, _ := schema["definitions"].(map[string]any)
	var resolve func(n map[string]any) map[string]any
	resolve = func(n map[string]any) map[string]any {
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
	// types is every JSON type a schema node lets through.
	var types func(n map[string]any, out map[string]bool)
	types = func(n map[string]any, out map[string]bool) {
		n = resolve(n)
		switch ty := n["type"].(type) {
		case string:
			out[ty] = true
		case []any:
			for _, x := range ty {
				out[x.(string)] = true
			}
		}
		if enum, ok := n["enum"].([]any); ok && n["type"] == nil {
			for _, v := range enum {
				switch v.(type) {
				case string:
					out["string"] = true
				case float64:
					out["number"] = true
				case bool:
					out["boolean"] = true
				}
			}
		}
		for _, k := range []string{"allOf", "oneOf", "anyOf"} {
			list, _ := n[k].([]any)
			for _, x := range list {
				types(x.(map[string]any), out)
			}
		}
	}
	nodes := map[string]map[string]any{}
	var walk func(n map[string]any, prefix string)
	walk = func(n map[string]any, prefix string) {
		n = resolve(n)
		props, _ := n["properties"].(map[string]any)
		for k, v := range props {
			vn := v.(map[string]any)
			nodes[prefix+k] = vn
			r := resolve(vn)
			walk(r, prefix+k+".")
			if items, ok := r["items"].(map[string]any); ok {
				walk(items, prefix+k+"[].")
			}
		}
	}
	walk(dig(schema, "properties", "config").(map[string]any), "")

	want := func(goType string) []string {
		switch {
		case strings.HasPrefix(goType, "[]"):
			return []string{"array"}
		case strings.HasPrefix(goType, "map["), goType == "object":
			return []string{"object"}
		case goType == "duration":
			return []string{"string"}
		case goType == `integer or "unlimited"`:
			return []string{"integer", "string"}
		}
		return []string{goType}
	}
	checked := 0
	for _, k := range config.Reference() {
		n, ok := nodes[k.Path]
		if !ok {
			continue // a missing key is TestChartSchemaMirrorsConfig's to report
		}
		checked++
		if enum, ok := resolve(n)["enum"].([]any); ok && k.Default != "" {
			// Hopper's default must pass: a config stating it (as
			// examples/hopper.yaml does) is a config the chart must take.
			var def any
			if err := yaml.Unmarshal([]byte(k.Default), &def); err != nil {
				t.Fatalf("default of %s: %v", k.Path, err)
			}
			if !slices.Contains(enum, def) {
				t.Errorf("values.schema.json: config.%s allows only %v, not Hopper's default %s", k.Path, enum, k.Default)
			}
		}
		got := map[string]bool{}
		types(n, got)
		for _, w := range want(k.Type) {
			if !got[w] && !(w == "number" && got["integer"]) {
				t.Errorf("values.schema.json: config.%s lets through %v, but Hopper reads it as %s (want JSON type %s)", k.Path, slices.Sorted(maps.Keys(got)), k.Type, w)
			}
		}
	}
	if checked < 150 {
		t.Errorf("only %d keys of values.schema.json's config were checked against Hopper's types", checked)
	}
}
