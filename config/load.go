package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// EnvPrefix starts every environment variable that overrides a config key:
// retry.maxAttempts is HOPPER_RETRY_MAX_ATTEMPTS.
const EnvPrefix = "HOPPER_"

// Load reads the YAML file at path (none when path is ""), then applies the
// HOPPER_* variables from environ (os.Environ() form). It does not validate;
// call Validate after flags are applied. Unknown keys and unparsable values
// are reported together. warnings lists HOPPER_* variables that match no key.
func Load(path string, environ []string) (cfg Config, warnings []string, err error) {
	cfg = Default()
	var errs []error
	if path != "" {
		data, rerr := os.ReadFile(path)
		if errors.Is(rerr, fs.ErrNotExist) {
			return cfg, nil, &fileNotFound{path: path}
		}
		if rerr != nil {
			return cfg, nil, fmt.Errorf("read config: %w", rerr)
		}
		if perr := Parse(data, &cfg); perr != nil {
			errs = append(errs, perr)
		}
	}
	w, eerr := applyEnv(&cfg, environ)
	if eerr != nil {
		errs = append(errs, eerr)
	}
	return cfg, w, errors.Join(errs...)
}

// fileNotFound is a config file that does not exist: said in those words,
// the path being all the operator needs, and still fs.ErrNotExist to a
// caller that leaves out what the file would have set.
type fileNotFound struct{ path string }

func (e *fileNotFound) Error() string        { return "config file " + e.path + " not found" }
func (e *fileNotFound) Is(target error) bool { return target == fs.ErrNotExist }

// Parse decodes YAML into cfg (over its current values). Unknown keys are
// errors naming their full path.
func Parse(data []byte, cfg *Config) error {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return fmt.Errorf("config is not valid YAML: %w", err)
	}
	if len(root.Content) == 0 {
		return nil // empty file
	}
	w := walker{lines: map[int]bool{}}
	w.walk(root.Content[0], reflect.TypeOf(*cfg), "")
	errs := w.errs
	// Unknown keys and bad durations are already reported with their paths;
	// decode the rest so that other bad values show in the same run.
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(cfg); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			for _, e := range te.Errors {
				var line int
				if _, serr := fmt.Sscanf(e, "line %d:", &line); serr == nil && w.lines[line] {
					continue // the walker said it better
				}
				errs = append(errs, errors.New(e))
			}
			return errors.Join(errs...)
		}
		return errors.Join(append(errs, fmt.Errorf("decode config: %w", err))...)
	}
	nameRoutes(cfg.Routes)
	for i := range cfg.Subscriptions {
		nameRoutes(cfg.Subscriptions[i].Routes)
	}
	return errors.Join(errs...)
}

// walker checks a YAML tree against the config types before decoding, so
// that every unknown key and every bad duration or attempt limit is reported
// with its dotted path (the decoder stops at the first such value).
type walker struct {
	errs  []error
	lines map[int]bool // lines already reported
}

func (w *walker) fail(n *yaml.Node, path string, err error) {
	w.errs = append(w.errs, fmt.Errorf("%s: %w (line %d)", path, err, n.Line))
	w.lines[n.Line] = true
}

func (w *walker) walk(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t {
	case durationType:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
			w.fail(n, path, fmt.Errorf("duration must be a string with a unit, like \"5s\", got %q", n.Value))
		} else if _, err := ParseDuration(n.Value); err != nil {
			w.fail(n, path, err)
		}
		return
	case attemptsType:
		if _, err := ParseAttempts(n.Value); err != nil {
			w.fail(n, path, err)
		}
		return
	case argumentType:
		if _, err := parseArgument(n); err != nil {
			w.fail(n, path, err)
		}
		return
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // an explicit null leaves the default
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			w.fail(n, path, fmt.Errorf("must be a mapping of keys, got %s", describe(n)))
			return
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" && k.Tag == "!!merge" {
				// A merge key: the merged mappings are checked as this type.
				if v.Kind == yaml.SequenceNode {
					for _, item := range v.Content {
						w.walk(item, t, path)
					}
				} else {
					w.walk(v, t, path)
				}
				continue
			}
			p := join(path, k.Value)
			f, ok := fields[k.Value]
			if !ok {
				w.fail(k, p, errors.New("unknown key"))
				continue
			}
			w.walk(v, f.Type, p)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			w.fail(n, path, fmt.Errorf("must be a list, got %s", describe(n)))
			return
		}
		for i, item := range n.Content {
			w.walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			w.fail(n, path, fmt.Errorf("must be a mapping, got %s", describe(n)))
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			w.walk(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value))
		}
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			w.fail(n, path, fmt.Errorf("must be a string, got %s", describe(n)))
		}
	case reflect.Int:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
			w.fail(n, path, fmt.Errorf("must be an integer, got %s", describe(n)))
		} else if _, err := strconv.ParseInt(n.Value, 0, 32); err != nil {
			w.fail(n, path, fmt.Errorf("integer %s out of range", n.Value))
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			w.fail(n, path, fmt.Errorf("must be true or false, got %s", describe(n)))
		}
	case reflect.Float64:
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!float" && n.Tag != "!!int") {
			w.fail(n, path, fmt.Errorf("must be a number, got %s", describe(n)))
		}
	}
}

// describe names what a YAML node holds, for error messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return fmt.Sprintf("%q", n.Value)
}

func yamlFields(t reflect.Type) map[string]reflect.StructField {
	m := make(map[string]reflect.StructField, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		if name := yamlName(f); name != "" {
			m[name] = f
		}
	}
	return m
}

func yamlName(f reflect.StructField) string {
	tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
	if tag == "-" || !f.IsExported() {
		return ""
	}
	return tag
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// EnvName is the environment variable for a dotted key path.
func EnvName(path string) string {
	var b strings.Builder
	b.WriteString(EnvPrefix)
	for i, seg := range strings.Split(path, ".") {
		if i > 0 {
			b.WriteByte('_')
		}
		b.WriteString(snake(seg))
	}
	return b.String()
}

func snake(s string) string {
	var b strings.Builder
	rs := []rune(s)
	for i, r := range rs {
		if unicode.IsUpper(r) && i > 0 && !unicode.IsUpper(rs[i-1]) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// envKeys lists every overridable leaf: its path and the field's value.
func envKeys(v reflect.Value, path string, out map[string]reflect.Value, paths map[string]string) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name := yamlName(f)
		if name == "" {
			continue
		}
		p := join(path, name)
		fv := v.Field(i)
		if f.Type.Kind() == reflect.Struct {
			envKeys(fv, p, out, paths)
			continue
		}
		if f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct {
			continue // lists of policies only come from the file
		}
		out[EnvName(p)] = fv
		paths[EnvName(p)] = p
	}
}

// EnvVars lists every HOPPER_* variable with its key path; the
// configuration reference (Reference) names each key's variable from it.
func EnvVars() map[string]string {
	cfg := Default()
	vals, paths := map[string]reflect.Value{}, map[string]string{}
	envKeys(reflect.ValueOf(&cfg).Elem(), "", vals, paths)
	return paths
}

func applyEnv(cfg *Config, environ []string) ([]string, error) {
	vals, paths := map[string]reflect.Value{}, map[string]string{}
	envKeys(reflect.ValueOf(cfg).Elem(), "", vals, paths)
	var errs []error
	var warnings []string
	sort.Strings(environ)
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, EnvPrefix) {
			continue
		}
		fv, known := vals[name]
		if !known {
			warnings = append(warnings, name)
			continue
		}
		if err := setFromString(fv, value); err != nil {
			errs = append(errs, fmt.Errorf("%s (from %s): %w", paths[name], name, err))
		}
	}
	return warnings, errors.Join(errs...)
}

// SetKey sets one key by its dotted path from a string, as flags do.
func SetKey(cfg *Config, path, value string) error {
	vals, paths := map[string]reflect.Value{}, map[string]string{}
	envKeys(reflect.ValueOf(cfg).Elem(), "", vals, paths)
	fv, ok := vals[EnvName(path)]
	if !ok {
		return fmt.Errorf("%s: unknown key", path)
	}
	if err := setFromString(fv, value); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

var (
	durationType = reflect.TypeOf(Duration(0))
	attemptsType = reflect.TypeOf(Attempts(0))
	argumentType = reflect.TypeOf(Argument{})
)

// setFromString parses an environment or flag value into a field. Lists are
// comma-separated; maps are "k=v,k=v".
func setFromString(fv reflect.Value, s string) error {
	switch fv.Type() {
	case durationType:
		d, err := ParseDuration(s)
		if err != nil {
			return err
		}
		fv.Set(reflect.ValueOf(d))
		return nil
	case attemptsType:
		a, err := ParseAttempts(s)
		if err != nil {
			return err
		}
		fv.Set(reflect.ValueOf(a))
		return nil
	case argumentType:
		fv.Set(reflect.ValueOf(ParseArgument(s)))
		return nil
	}
	switch fv.Kind() {
	case reflect.String:
		fv.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("invalid boolean %q", s)
		}
		fv.SetBool(b)
	case reflect.Float64:
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return fmt.Errorf("invalid number %q", s)
		}
		fv.SetFloat(f)
	case reflect.Int:
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("invalid integer %q", s)
		}
		fv.SetInt(int64(n))
	case reflect.Slice:
		parts := splitList(s)
		sl := reflect.MakeSlice(fv.Type(), len(parts), len(parts))
		for i, p := range parts {
			if err := setFromString(sl.Index(i), p); err != nil {
				return err
			}
		}
		fv.Set(sl)
	case reflect.Map:
		m := reflect.MakeMap(fv.Type())
		for _, p := range splitList(s) {
			k, v, ok := strings.Cut(p, "=")
			if !ok {
				return fmt.Errorf("invalid entry %q (want key=value)", p)
			}
			ev := reflect.New(fv.Type().Elem()).Elem()
			if err := setFromString(ev, strings.TrimSpace(v)); err != nil {
				return err
			}
			m.SetMapIndex(reflect.ValueOf(strings.TrimSpace(k)), ev)
		}
		fv.Set(m)
	case reflect.Pointer:
		nv := reflect.New(fv.Type().Elem())
		if err := setFromString(nv.Elem(), s); err != nil {
			return err
		}
		fv.Set(nv)
	default:
		return fmt.Errorf("cannot be set from a string")
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
