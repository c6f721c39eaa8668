package config

import (
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// yamlKeys lists the path of every key the config types have, list items
// written with [], as the file would name them.
func yamlKeys(t reflect.Type, prefix string, out *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name := yamlName(f)
		if name == "" {
			continue
		}
		p := prefix + name
		*out = append(*out, p)
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			yamlKeys(ft.Elem(), p+"[].", out)
		case ft.Kind() == reflect.Struct && ft != argumentType:
			yamlKeys(ft, p+".", out)
		}
	}
}

// Every key of the file is in the reference, documented, with the
// variable and flag that set it.
func TestReferenceCoversEveryKey(t *testing.T) {
	ref := Reference()
	var want []string
	yamlKeys(reflect.TypeOf(Config{}), "", &want)
	var got []string
	for _, k := range ref {
		got = append(got, k.Path)
		if strings.TrimSpace(k.Doc) == "" {
			t.Errorf("%s has no description: give its field (or its type) a doc comment in config.go", k.Path)
		}
		if k.Type == "" {
			t.Errorf("%s has no type", k.Path)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("reference keys differ from the config's:\n got %v\nwant %v", got, want)
	}
	for env, path := range EnvVars() {
		if i := slices.IndexFunc(ref, func(k KeyDoc) bool { return k.Path == path }); i < 0 || ref[i].Env != env {
			t.Errorf("%s sets %s, which the reference does not say", env, path)
		}
	}
	for _, f := range Flags() {
		if i := slices.IndexFunc(ref, func(k KeyDoc) bool { return k.Path == f.Key }); i < 0 || ref[i].Flag != "--"+f.Name {
			t.Errorf("--%s sets %s, which the reference does not say", f.Name, f.Key)
		}
		if _, ok := EnvVars()[EnvName(f.Key)]; !ok {
			t.Errorf("--%s sets %s, which no flag can set (SetKey refuses it)", f.Name, f.Key)
		}
	}
}

// statedDefault finds the default a doc comment states: the value after
// "Default" (a list in brackets, a quoted string, or a word), "" when the
// doc states none.
var statedDefault = regexp.MustCompile(`\bDefault\s+(\[[^\]]*\]|"[^"]*"|(?:[^\s:;,(]|:[^\s])+)`)

// A doc comment that states its key's default states Default()'s, and
// every key outside list items states one: the reference shows both, and
// they must not disagree.
func TestDocsStateTheDefault(t *testing.T) {
	for _, k := range Reference() {
		if k.InItem || k.Default == "" || k.Required {
			continue
		}
		m := statedDefault.FindStringSubmatch(k.Doc)
		if m == nil {
			t.Errorf("the doc of %s does not state its default (%s): end it with \"Default %s.\"", k.Path, k.Default, k.Default)
			continue
		}
		stated := strings.TrimSuffix(m[1], ".")
		if !SameDefault(stated, k.Default) {
			t.Errorf("the doc of %s says \"Default %s\", Default() has %s", k.Path, stated, k.Default)
		}
	}
}

// The reference speaks of keys, not of the Go names behind them: a doc
// comment names another key by its path (retry.outcomes), never by its
// field (Outcomes) or type.
func TestDocsNameKeysNotGoNames(t *testing.T) {
	goNames := map[string]bool{}
	var collect func(reflect.Type)
	collect = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || t == argumentType || goNames[t.Name()] {
			return
		}
		goNames[t.Name()] = true
		for i := range t.NumField() {
			if f := t.Field(i); yamlName(f) != "" {
				goNames[f.Name] = true
				collect(f.Type)
			}
		}
	}
	collect(reflect.TypeOf(Config{}))
	// Words that are names of things outside Hopper as well.
	for _, w := range []string{"CloudEvents"} {
		delete(goNames, w)
	}
	camel := regexp.MustCompile(`\b[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*\b`)
	for _, k := range Reference() {
		for _, w := range camel.FindAllString(k.Doc, -1) {
			if goNames[w] {
				t.Errorf("the doc of %s names %s, a Go name: name the key instead", k.Path, w)
			}
		}
	}
}

func TestDescriptionDropsTheDefaultSentence(t *testing.T) {
	for _, c := range []struct{ doc, def, want string }{
		{"Heartbeat is the interval. Default 10s.", "10s", "Heartbeat is the interval."},
		{"Tiers are the tiers. Default [1s, 5s,\n30s].", "[1s, 5s, 30s]", "Tiers are the tiers."},
		{`DLQ is the template. Default "{queue}.dlq".`, `"{queue}.dlq"`, "DLQ is the template."},
		{"Policies are policies. Default none.", "[]", "Policies are policies."},
		// The sentence says more than the default, or another one: kept.
		{"Count is the number. Default 0: off.", "0", "Count is the number. Default 0: off."},
		{"Grace is the time. Default 25s.", "30s", "Grace is the time. Default 25s."},
		{"Name of the queue (Default is the name).", "x", "Name of the queue (Default is the name)."},
	} {
		if got := (KeyDoc{Doc: c.doc, Default: c.def}).Description(); got != c.want {
			t.Errorf("Description(%q, default %s) = %q, want %q", c.doc, c.def, got, c.want)
		}
	}
}

func TestLookupKey(t *testing.T) {
	ref := Reference()
	for _, c := range []struct{ in, want string }{
		{"retry.maxAttempts", "retry.maxAttempts"},
		{"retry", "retry"},
		{"retry.policies[].name", "retry.policies[].name"},
		{"retry.policies.name", "retry.policies[].name"},
		{"retry.policies[0].match.header", "retry.policies[].match.header"},
		{"HOPPER_BROKER_URLS", "broker.urls"},
		{"retry.maxattempts", "retry.maxAttempts"},
		{"subscriptions.queue.name", "subscriptions[].queue.name"},
	} {
		k, _, ok := LookupKey(ref, c.in)
		if !ok || k.Path != c.want {
			t.Errorf("LookupKey(%q) = %q, %v; want %q", c.in, k.Path, ok, c.want)
		}
	}
	for _, in := range []string{"", "retry.maxAttempt", "retry.", "HOPPER_NOPE", "broker.urls.x"} {
		if k, _, ok := LookupKey(ref, in); ok {
			t.Errorf("LookupKey(%q) found %s", in, k.Path)
		}
	}
	_, children, _ := LookupKey(ref, "retry.policies")
	var names []string
	for _, c := range children {
		names = append(names, c.Name)
	}
	if want := []string{"name", "match", "maxAttempts", "tiers", "outcomes", "onExpired"}; !slices.Equal(names, want) {
		t.Errorf("keys of retry.policies = %v, want %v", names, want)
	}
}

func TestSuggestKeys(t *testing.T) {
	ref := Reference()
	for _, c := range []struct {
		in   string
		want []string // the first suggestions, in order
	}{
		{"retry.maxAttempt", []string{"retry.maxAttempts"}},
		{"retry.max-attempts", []string{"retry.maxAttempts"}},
		{"broker.url", []string{"broker.urls"}},
		{"brokr", []string{"broker"}},
		{"maxAttempts", []string{"retry.maxAttempts", "routes[].retry.maxAttempts"}},
		{"HOPPER_RETRY_MAXATTEMPTS", []string{"retry.maxAttempts"}},
		{"consumer.prefetchbyte", []string{"consumer.prefetchBytes"}},
		{"timeout", []string{"app.timeout"}},
		{"attempts", []string{"retry.maxAttempts"}},
	} {
		got := SuggestKeys(ref, c.in, 5)
		if len(got) < len(c.want) || !slices.Equal(got[:len(c.want)], c.want) {
			t.Errorf("SuggestKeys(%q) = %v, want it to start with %v", c.in, got, c.want)
		}
	}
	if got := SuggestKeys(ref, "nosuchthing", 5); len(got) != 0 {
		t.Errorf("SuggestKeys(nosuchthing) = %v, want none", got)
	}
	if got := SuggestKeys(ref, "maxAttempts", 2); len(got) != 2 {
		t.Errorf("SuggestKeys(maxAttempts, 2) = %v, want 2", got)
	}
}

func TestYAMLValue(t *testing.T) {
	v := KeyValues(Default())
	for path, want := range map[string]string{
		"broker.urls":                "[amqp://guest:guest@127.0.0.1:5672/]",
		"broker.reconnectMin":        "500ms",
		"topology.retryQueue":        `"{queue}.retry.{delay}"`,
		"retry.tiers":                "[1s, 5s, 30s, 2m, 10m, 30m]",
		"retry.maxAttempts":          "10",
		"retry.outcomes":             "{}",
		"retry.policies":             "[]",
		"queue.singleActiveConsumer": "false",
		"limiter.latencyTolerance":   "3",
		"admin.listen":               ":9090",
		"filter":                     `""`,
	} {
		if v[path] != want {
			t.Errorf("%s = %s, want %s", path, v[path], want)
		}
	}
	c := Default()
	c.Retry.MaxAttempts = 0
	c.Queue.Arguments = map[string]Argument{"x-max-length": IntArgument(10), "x-overflow": StringArgument("reject-publish")}
	if got := KeyValues(c)["retry.maxAttempts"]; got != "unlimited" {
		t.Errorf("unlimited attempts = %s", got)
	}
	if got := KeyValues(c)["queue.arguments"]; got != "{x-max-length: 10, x-overflow: reject-publish}" {
		t.Errorf("arguments = %s", got)
	}
}
