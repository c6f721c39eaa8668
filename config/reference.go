package config

import (
	"cmp"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// KeyDoc documents one key of the configuration: where it sits in the
// file, its type, its default, the other ways of setting it and what it
// does. The reference (docs/configuration.md) and `hopper config explain`
// are both made from these, and these from the config types, Default,
// EnvVars, Flags and the doc comments of the types and their fields, so
// that the code is the one place a key is described.
type KeyDoc struct {
	// Path is the key's dotted path; the items of a list are written "[]":
	// retry.policies[].name.
	Path string
	// Name is the last part of Path: name for retry.policies[].name.
	Name string
	// Type is the key's type as written in YAML: string, integer, boolean,
	// number, duration, object, []string, map[string]string...
	Type string
	// Default is the default as it would be written in YAML ("10s",
	// "[1s, 5s]"); "" for an object, whose keys have defaults of their
	// own, and for the keys of list items, which have none (an item states
	// what it needs, and its doc says what a key left out means).
	Default string
	// Required is set for a key that has no default and must be given
	// (its doc says so).
	Required bool
	// Env is the HOPPER_* variable that sets the key, "" for none (lists of
	// objects, and the keys of their items, are set in the file only).
	Env string
	// Flag is the key's own flag ("--queue"), "" for none.
	Flag string
	// Doc is what the key does, in Go doc comment syntax (paragraphs,
	// lists, indented blocks).
	Doc string
	// Object says the key holds keys of its own: a section, or a list of
	// objects whose items do.
	Object bool
	// List says the key holds a list of objects: its keys are the keys of
	// each item.
	List bool
	// InItem says the key belongs to a list item.
	InItem bool
	// SameAs, when set, is the path of a key of the same type, documented
	// there with its keys: subscriptions[].queue has the keys of queue.
	SameAs string
}

// Section is the top-level key k belongs to: broker for broker.tls.caFile.
func (k KeyDoc) Section() string {
	s, _, _ := strings.Cut(k.Path, ".")
	return strings.TrimSuffix(s, "[]")
}

// Parent is the path of the key k belongs to, "" for a top-level key.
func (k KeyDoc) Parent() string {
	i := strings.LastIndexByte(k.Path, '.')
	if i < 0 {
		return ""
	}
	return strings.TrimSuffix(k.Path[:i], "[]")
}

// Reference lists every key of the configuration, in the order of the
// config types' fields (a key before its own keys).
func Reference() []KeyDoc { return ReferenceWith(fieldDocs) }

// ReferenceWith is Reference with the doc comments given, by type name
// ("Broker") and by type and field name ("Broker.URLs"); the generator of
// the reference reads them from the source, fresher than the compiled
// ones.
func ReferenceWith(docs map[string]string) []KeyDoc {
	b := refBuilder{docs: docs, env: map[string]string{}, flags: map[string]string{}, first: map[reflect.Type]place{}}
	for env, path := range EnvVars() {
		b.env[path] = env
	}
	for _, f := range Flags() {
		b.flags[f.Key] = "--" + f.Name
	}
	def := Default()
	b.walk(reflect.TypeOf(def), reflect.ValueOf(def), "", false)
	b.sameAs()
	return b.keys
}

// KeyValues is the value of every key of c outside list items, by path, as
// the reference writes a default: the examples that list the defaults are
// checked against KeyValues(Default()). A section has no value of its own,
// and is not listed.
func KeyValues(c Config) map[string]string {
	b := refBuilder{first: map[reflect.Type]place{}}
	b.walk(reflect.TypeOf(c), reflect.ValueOf(c), "", false)
	out := map[string]string{}
	for _, k := range b.keys {
		if !k.InItem && (!k.Object || k.List) {
			out[k.Path] = k.Default
		}
	}
	return out
}

// sameAs marks each key of a struct type met again (subscriptions[].queue
// is a queue) with where that type is documented with its keys: where it
// is met first outside list items, or in the fewest.
func (b *refBuilder) sameAs() {
	for i := range b.keys {
		k := &b.keys[i]
		if !k.Object {
			continue
		}
		if first := b.first[structOf(b.types[i])].path; first != k.Path {
			k.SameAs = first
		}
	}
}

type refBuilder struct {
	docs  map[string]string
	env   map[string]string // key path → variable
	flags map[string]string // key path → flag
	keys  []KeyDoc
	types []reflect.Type // the field type of each of keys
	// first is where each struct type is documented: the first path with
	// the fewest list items on the way.
	first map[reflect.Type]place
}

// place is where a struct type is met: its key's path, and how many list
// items are on the way to it.
type place struct {
	path  string
	items int
}

// walk adds the keys of struct type t, whose default is v (invalid inside
// list items), under path.
func (b *refBuilder) walk(t reflect.Type, v reflect.Value, path string, inItem bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		name := yamlName(f)
		if name == "" {
			continue
		}
		p := join(path, name)
		var fv reflect.Value
		if v.IsValid() {
			fv = v.Field(i)
		}
		ft := f.Type
		st := structOf(ft)
		k := KeyDoc{
			Path:   p,
			Name:   name,
			Type:   typeName(ft),
			Env:    b.env[p],
			Flag:   b.flags[p],
			Doc:    b.doc(t, f, name),
			Object: st != nil,
			List:   ft.Kind() == reflect.Slice && st != nil,
			InItem: inItem,
		}
		k.Required = requiredDoc.MatchString(k.Doc)
		switch {
		case fv.IsValid() && st == nil:
			k.Default = yamlValue(fv)
		case fv.IsValid() && k.List && fv.Len() == 0:
			k.Default = "[]"
		case fv.IsValid() && k.List:
			k.Default = fmt.Sprintf("(%d items)", fv.Len())
		}
		b.keys = append(b.keys, k)
		b.types = append(b.types, ft)
		if st == nil {
			continue
		}
		items := strings.Count(p, "[]")
		if k.List {
			items++
		}
		if prev, ok := b.first[st]; !ok || items < prev.items {
			b.first[st] = place{p, items}
		}
		switch {
		case k.List:
			b.walk(st, reflect.Value{}, p+"[]", true)
		case ft.Kind() == reflect.Pointer:
			// A section absent unless given has no defaults of its own.
			b.walk(st, reflect.Value{}, p, inItem)
		default:
			b.walk(st, fv, p, inItem)
		}
	}
}

// requiredDoc finds a doc that says its key must be given.
var requiredDoc = regexp.MustCompile(`(^|[.:;]\s+)Required\b`)

// doc is the description of field f of struct type t: its doc comment,
// or, for a field without one whose type is a struct, that type's. A doc
// comment starts with the Go name of what it describes; the description
// starts with the key's name instead, the only name a reader of the file
// knows.
func (b *refBuilder) doc(t reflect.Type, f reflect.StructField, name string) string {
	text, goName := b.docs[t.Name()+"."+f.Name], f.Name
	if st := structOf(f.Type); text == "" && st != nil {
		text, goName = b.docs[st.Name()], st.Name()
	}
	text = strings.TrimSpace(text)
	if rest, ok := strings.CutPrefix(text, goName); ok && (rest == "" || !isIdentRune(rest)) {
		text = name + rest
	}
	return text
}

func isIdentRune(s string) bool {
	r := []rune(s)[0]
	return unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_'
}

// structOf is the struct type a field of type t holds (itself, through a
// pointer, or as the items of a list), nil when it holds none.
func structOf(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == argumentType {
		return nil
	}
	return t
}

// typeName is a type as the YAML file writes it.
func typeName(t reflect.Type) string {
	switch t {
	case durationType:
		return "duration"
	case attemptsType:
		return `integer or "unlimited"`
	case argumentType:
		return "string, integer or boolean"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return typeName(t.Elem())
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int:
		return "integer"
	case reflect.Float64:
		return "number"
	case reflect.Struct:
		return "object"
	case reflect.Slice:
		return "[]" + typeName(t.Elem())
	case reflect.Map:
		if t.Elem() == argumentType {
			return "map[string](string, integer or boolean)"
		}
		return "map[string]" + typeName(t.Elem())
	}
	return t.Kind().String()
}

// yamlValue writes a default as YAML would, in flow style.
func yamlValue(v reflect.Value) string {
	switch v.Type() {
	case durationType:
		return FormatDuration(time.Duration(v.Int()))
	case attemptsType:
		if v.Int() == 0 {
			return "unlimited"
		}
		return strconv.FormatInt(v.Int(), 10)
	case argumentType:
		return yamlScalar(v.Interface().(Argument).Value())
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return yamlValue(reflect.Zero(v.Type().Elem()))
		}
		return yamlValue(v.Elem())
	case reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = yamlValue(v.Index(i))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case reflect.Map:
		keys := v.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
		parts := make([]string, len(keys))
		for i, mk := range keys {
			parts[i] = yamlScalar(mk.String()) + ": " + yamlValue(v.MapIndex(mk))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return yamlScalar(v.Interface())
}

// yamlScalar writes a string, number or boolean; a string is quoted when
// YAML would read it as plain text otherwise.
func yamlScalar(x any) string {
	switch x := x.(type) {
	case string:
		var back any
		if x == "" || strings.ContainsAny(x, "#,[]{}") || yaml.Unmarshal([]byte(x), &back) != nil || back != x {
			return strconv.Quote(x)
		}
		return x
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case int64, int:
		return fmt.Sprint(x)
	case bool:
		return strconv.FormatBool(x)
	}
	return fmt.Sprint(x)
}

// LookupKey finds a key by its path, with or without the [] of list items
// (retry.policies.name, retry.policies[0].name), or by its HOPPER_*
// variable. It returns the key and the keys it holds, in order, or ok
// false.
func LookupKey(ref []KeyDoc, s string) (key KeyDoc, children []KeyDoc, ok bool) {
	s = strings.TrimSpace(s)
	i := slices.IndexFunc(ref, func(k KeyDoc) bool {
		return normalPath(k.Path) == normalPath(s) || k.Env != "" && k.Env == s
	})
	if i < 0 {
		// A key's name is in camel case; let a different case find it when
		// it finds no other.
		var found []int
		for j, k := range ref {
			if strings.EqualFold(normalPath(k.Path), normalPath(s)) {
				found = append(found, j)
			}
		}
		if len(found) != 1 {
			return KeyDoc{}, nil, false
		}
		i = found[0]
	}
	key = ref[i]
	for _, k := range ref {
		if k.Parent() == key.Path {
			children = append(children, k)
		}
	}
	return key, children, true
}

// TopLevel lists the top-level keys, in order.
func TopLevel(ref []KeyDoc) []KeyDoc {
	var out []KeyDoc
	for _, k := range ref {
		if k.Parent() == "" {
			out = append(out, k)
		}
	}
	return out
}

// normalPath drops the index or [] of list items from a path.
func normalPath(s string) string { return listIndex.ReplaceAllString(s, "") }

var listIndex = regexp.MustCompile(`\[[0-9]*\]`)

// SuggestKeys lists the keys nearest to s, a key that does not exist,
// nearest first, at most n: the keys (or variables) a typo or two away,
// counting a key's name alone when s has no dot (maxAttempts); failing
// those, the keys whose name holds the last part of s (attempts).
func SuggestKeys(ref []KeyDoc, s string, n int) []string {
	in := strings.ToLower(normalPath(strings.TrimSpace(s)))
	last := in[strings.LastIndexByte(in, '.')+1:]
	type scored struct {
		path  string
		score int
	}
	var near, holding []scored
	for _, k := range ref {
		name := strings.ToLower(k.Name)
		d := editDistance(in, strings.ToLower(normalPath(k.Path)))
		if k.Env != "" {
			d = min(d, editDistance(in, strings.ToLower(k.Env)))
		}
		if !strings.Contains(in, ".") {
			d = min(d, editDistance(in, name))
		}
		switch {
		case d <= typos(len(in)):
			near = append(near, scored{k.Path, d})
		case len(last) >= 4 && strings.Contains(name, last):
			holding = append(holding, scored{k.Path, len(name) - len(last)})
		}
	}
	found := near
	if len(found) == 0 {
		found = holding
	}
	slices.SortStableFunc(found, func(a, b scored) int {
		return cmp.Or(cmp.Compare(a.score, b.score), cmp.Compare(len(a.path), len(b.path)))
	})
	var out []string
	for _, f := range found[:min(n, len(found))] {
		out = append(out, f.path)
	}
	return out
}

// typos is how many edits a mistyped key of n characters may be away: two,
// one for a short one.
func typos(n int) int {
	if n <= 4 {
		return 1
	}
	return 2
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, sub)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// Description is the key's doc without a last sentence that only restates
// the default ("Default 10s."), which the reference and `hopper config
// explain` show on a line of their own.
func (k KeyDoc) Description() string {
	doc := strings.TrimSpace(k.Doc)
	m := lastDefault.FindStringSubmatchIndex(doc)
	if m == nil || k.Default == "" || !SameDefault(doc[m[2]:m[3]], k.Default) {
		return doc
	}
	if rest := strings.TrimSpace(doc[:m[0]]); rest != "" {
		return rest
	}
	return doc
}

// lastDefault is a doc's last sentence when it states the default and
// nothing else.
var lastDefault = regexp.MustCompile(`(?:^|\s)Default\s+([^\s]+|\[[^\]]*\])\.$`)

// SameDefault says whether a default as a doc comment states it agrees
// with the default as YAML writes it: quotes aside, and "none" for an
// empty list or map.
func SameDefault(stated, yamlDefault string) bool {
	unquote := func(s string) string {
		if u, err := strconv.Unquote(s); err == nil {
			return u
		}
		return s
	}
	stated = strings.Join(strings.Fields(stated), " ")
	if stated == "none" {
		return yamlDefault == "[]" || yamlDefault == "{}"
	}
	return unquote(stated) == unquote(yamlDefault)
}
