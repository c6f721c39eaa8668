package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/config"
)

// explain runs `hopper config explain <args>` in process: its exit status,
// standard output and standard error.
func explain(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	root := newRoot(&out, &errb)
	root.SetArgs(append([]string{"config", "explain"}, args...))
	code = execute(root, &errb)
	return code, out.String(), errb.String()
}

func TestConfigExplainKey(t *testing.T) {
	code, out, errs := explain(t, "retry.maxAttempts")
	if code != exitOK {
		t.Fatalf("exit %d, want 0\n%s", code, errs)
	}
	for _, want := range []string{
		"KEY:     retry.maxAttempts\n",
		"TYPE:    integer or \"unlimited\"\n",
		"DEFAULT: 10\n",
		"ENV:     HOPPER_RETRY_MAX_ATTEMPTS\n",
		"\nDESCRIPTION:\n    maxAttempts is the attempt at which a failing message is dead-lettered\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain retry.maxAttempts lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "FLAG:") || strings.Contains(out, "KEYS:") {
		t.Errorf("explain retry.maxAttempts shows a flag or keys it does not have:\n%s", out)
	}

	// A key with a flag of its own, named by its variable.
	_, out, _ = explain(t, "HOPPER_APP_URL")
	for _, want := range []string{"KEY:     app.url\n", "FLAG:    --app-url\n", "DEFAULT: http://127.0.0.1:8080/\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain HOPPER_APP_URL lacks %q:\n%s", want, out)
		}
	}

	// The key of a list's items, with or without [].
	for _, arg := range []string{"retry.policies[].name", "retry.policies.name", "retry.policies[0].name"} {
		code, out, errs := explain(t, arg)
		if code != exitOK || !strings.HasPrefix(out, "KEY:     retry.policies[].name\n") || !strings.Contains(out, "DEFAULT: none, required\n") {
			t.Errorf("explain %s: exit %d\n%s%s", arg, code, out, errs)
		}
	}
}

// A section, and a list of objects, list their keys with types and
// defaults; without a key, the top-level keys are listed.
func TestConfigExplainSection(t *testing.T) {
	_, out, _ := explain(t, "retry")
	keys := out[strings.Index(out, "KEYS:\n"):]
	for _, re := range []string{
		`(?m)^    maxAttempts +integer or "unlimited" +10$`,
		`(?m)^    tiers +\[\]duration +\[1s, 5s, 30s, 2m, 10m, 30m\]$`,
		`(?m)^    policies +\[\]object +\[\]$`,
		`hopper config explain retry\.<key>`,
	} {
		if !regexp.MustCompile(re).MatchString(keys) {
			t.Errorf("explain retry: no line matches %s:\n%s", re, out)
		}
	}
	if !strings.Contains(out, "TYPE: object") || !strings.Contains(out, "DESCRIPTION:\n    retry is") {
		t.Errorf("explain retry lacks its type or description:\n%s", out)
	}

	_, out, _ = explain(t, "topology.bindings")
	if !strings.Contains(out, "ENV:     none, set in the file only\n") || !regexp.MustCompile(`(?m)^    exchange +string +required$`).MatchString(out) {
		t.Errorf("explain topology.bindings:\n%s", out)
	}

	code, out, _ := explain(t)
	if code != exitOK {
		t.Fatalf("explain without a key: exit %d", code)
	}
	for _, k := range config.TopLevel(config.Reference()) {
		if !regexp.MustCompile(`(?m)^    ` + k.Name + ` `).MatchString(out) {
			t.Errorf("explain without a key does not list %s:\n%s", k.Name, out)
		}
	}
}

// An unknown key is a usage error that names the nearest keys.
func TestConfigExplainUnknownKey(t *testing.T) {
	for _, c := range []struct{ arg, suggest string }{
		{"retry.maxAtempts", "\tretry.maxAttempts\n"},
		{"broker.url", "\tbroker.urls\n"},
		{"maxAttempts", "\tretry.maxAttempts\n"},
		{"HOPPER_QUEUE_NAMES", "\tqueue.name\n"},
	} {
		code, out, errs := explain(t, c.arg)
		if code != exitUsage {
			t.Errorf("explain %s: exit %d, want %d", c.arg, code, exitUsage)
		}
		if out != "" {
			t.Errorf("explain %s printed on stdout:\n%s", c.arg, out)
		}
		if !strings.Contains(errs, `unknown config key "`+c.arg+`"`) || !strings.Contains(errs, "Did you mean this?\n") || !strings.Contains(errs, c.suggest) {
			t.Errorf("explain %s: want the nearest key %q in\n%s", c.arg, strings.TrimSpace(c.suggest), errs)
		}
	}
	code, _, errs := explain(t, "nothing.like.it")
	if code != exitUsage || strings.Contains(errs, "Did you mean") || !strings.Contains(errs, "Run 'hopper config explain' to list the sections") {
		t.Errorf("explain nothing.like.it: exit %d\n%s", code, errs)
	}
	if code, _, _ := explain(t, "retry", "queue"); code != exitUsage {
		t.Errorf("explain with two keys: exit %d, want %d", code, exitUsage)
	}
}

// `hopper config explain` prints the text docs/configuration.md has for
// the key: the same facts and the same description, for every key the
// reference shows.
func TestConfigExplainMatchesReference(t *testing.T) {
	md, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]string{}
	for _, e := range regexp.MustCompile("(?m)^#{2,3} `").Split(string(md), -1)[1:] {
		path, body, _ := strings.Cut(e, "`\n")
		entries[path] = body
	}
	link := regexp.MustCompile("\\[`([^`]*)`\\]\\(#[a-z0-9_-]*\\)")
	escape := regexp.MustCompile(`\\([!-/:-@\[-` + "`" + `{-~])`)
	plain := func(s string) string {
		s = link.ReplaceAllString(s, "$1")
		s = escape.ReplaceAllString(s, "$1")
		return strings.Join(strings.Fields(strings.ReplaceAll(s, "`", "")), " ")
	}
	shown := 0
	for _, k := range config.Reference() {
		body, ok := entries[k.Path]
		if !ok {
			continue // a key of a key documented elsewhere
		}
		shown++
		code, out, errs := explain(t, k.Path)
		if code != exitOK {
			t.Errorf("explain %s: exit %d\n%s", k.Path, code, errs)
			continue
		}
		facts := map[string]string{"TYPE": "- Type: `%s`", "DEFAULT": "- Default: `%s`", "ENV": "- Environment: `%s`", "FLAG": "- Flag: `%s`"}
		for _, l := range strings.Split(out, "\n") {
			label, value, _ := strings.Cut(l, ":")
			value = strings.TrimSpace(value)
			if f, ok := facts[label]; ok && !strings.HasPrefix(value, "none") {
				if want := strings.Replace(f, "%s", value, 1); !strings.Contains(body, want+"\n") {
					t.Errorf("explain %s says %s, the reference lacks %q", k.Path, l, want)
				}
			}
		}
		desc := out[strings.Index(out, "DESCRIPTION:\n")+len("DESCRIPTION:\n"):]
		if i := strings.Index(desc, "\nKEYS:\n"); i >= 0 {
			desc = desc[:i]
		}
		mdDesc := body[strings.Index(body, "\n\n")+2:]
		if i := strings.Index(mdDesc, "\n\n| Key |"); i >= 0 {
			mdDesc = mdDesc[:i]
		}
		if plain(desc) != plain(mdDesc) {
			t.Errorf("explain %s and the reference describe it differently:\nexplain:   %s\nreference: %s", k.Path, plain(desc), plain(mdDesc))
		}
	}
	if shown < 100 {
		t.Errorf("only %d keys of the reference were compared: is docs/configuration.md laid out as the test reads it?", shown)
	}
}

func TestConfigExplainHelp(t *testing.T) {
	help := helpOf(t, "config")
	if !strings.Contains(help, "explain") {
		t.Errorf("hopper config --help does not list explain:\n%s", help)
	}
	help = helpOf(t, "config", "explain")
	for _, want := range []string{"hopper config explain retry.maxAttempts", "exit 64", "docs/configuration.md"} {
		if !strings.Contains(help, want) {
			t.Errorf("hopper config explain --help lacks %q:\n%s", want, help)
		}
	}
}
