// Package route decides, per message, which app path a subscription's
// message goes to and whether it is delivered at all. It is pure: rules are
// compiled once from their source text, then each message is judged from
// what it carries (its original routing key and exchange, headers,
// properties and, only when a rule reads it, its body parsed as JSON).
//
// A message's way through a table:
//
//	filter (when set)
//	  ├─ true ───────────────────────→ routes, first match wins
//	  │                                  ├─ a route matches → its path (and retry policy)
//	  │                                  └─ none matches   → the subscription's own path
//	  │                                     (a route that cannot be evaluated does not match)
//	  ├─ false ──────────────────────→ filtered: ack (onFiltered ack) or DLQ "filtered"
//	  └─ cannot be evaluated ────────→ DLQ "filter-error" (onFilterError dlq, the default)
//	                                   or on to the routes (onFilterError deliver)
//	any rule, body unreadable, onBodyError dlq → DLQ "filter-error"
//
// A rule cannot be evaluated for a message when it fails at run time
// (ordering a missing header against a number, a body field that is not a
// bool where a bool is wanted) or when it reads the body and the body is
// not JSON (or its content type says it is something else). Such a rule
// has decided nothing about the message, so it never discards it: a route
// that cannot be evaluated does not match and the next is tried, and a
// filter that cannot be evaluated never filters. Only a filter that
// evaluates to false leaves a message out. With onBodyError dlq a message
// whose body a rule needs and cannot read is dead-lettered with reason
// filter-error before any route is chosen. Every such rule is reported in
// the decision so the loop can count and log it: one odd message never
// stops the others.
package route

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strings"
	"sync"
	"time"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/vm"
	"github.com/expr-lang/expr/vm/runtime"

	"github.com/hopper-sidecar/hopper/msg"
	"github.com/hopper-sidecar/hopper/retry"
)

// Spec is the source of a table, as config holds it.
type Spec struct {
	// Routes are tried in order; the first whose Match is true wins.
	Routes []RouteSpec
	// Filter, when not empty, must be true for a message to be delivered.
	Filter string
	// OnFiltered is "ack" or "dlq" ("" is ack).
	OnFiltered string
	// OnBodyError is "skip" or "dlq" ("" is skip).
	OnBodyError string
	// OnFilterError is "dlq" or "deliver" ("" is dlq): what becomes of a
	// message the filter cannot be evaluated for. A filter often keeps out
	// what the app must not see, so by default such a message is set aside
	// in the DLQ, where it can be replayed once the filter or the
	// publisher is fixed, rather than delivered or acked unseen.
	OnFilterError string
}

// RouteSpec is one route.
type RouteSpec struct {
	// Name labels the route in metrics, traces and logs.
	Name string
	// Match is an expression that must be true for a message to take the
	// route.
	Match string
	// Policy, when not nil, is the retry policy of the messages the route
	// takes, in place of the subscription's selection.
	Policy *retry.Policy
}

// Route is a compiled route.
type Route struct {
	Name   string
	Policy *retry.Policy
	rule   rule
}

// Table is a compiled Spec. It is safe for concurrent use.
type Table struct {
	routes     []Route
	filter     *rule
	filteredTo Outcome
	bodyDLQ    bool
	// filterErrDeliver: a message the filter cannot be evaluated for goes
	// on to the routes instead of the DLQ.
	filterErrDeliver bool
	// parse reads a JSON body; tests count its calls.
	parse func(data []byte, v any) error
}

// rule is one compiled expression.
type rule struct {
	// key names the rule in errors: "filter" or "routes[2].match".
	key      string
	prog     *vm.Program
	usesBody bool
	// members are the top-level members of the body the rule reads by
	// name (body.kind, body["kind"]); wholeBody says it reads the body some
	// other way too, and needs all of it.
	members   []string
	wholeBody bool
	// cmp, when not nil, is the rule's whole meaning in its most common
	// form, judged without running prog.
	cmp *comparison
}

// Error is an expression that does not compile, with where it went wrong.
type Error struct {
	// Key is the rule's key: "filter", "routes[2].match", "onFiltered".
	Key string
	// Line and Column are 1-based, inside the expression; 0 when the
	// error is not about a place in it.
	Line, Column int
	Msg          string
}

func (e *Error) Error() string {
	if e.Line == 0 {
		return e.Key + ": " + e.Msg
	}
	return fmt.Sprintf("%s: line %d, column %d: %s", e.Key, e.Line, e.Column, e.Msg)
}

// Compile compiles every rule of s. Every problem is reported, each as an
// *Error, joined.
func Compile(s Spec) (*Table, error) {
	t := &Table{}
	var errs []error
	switch s.OnFiltered {
	case "", "ack":
		t.filteredTo = Ack
	case "dlq":
		t.filteredTo = DeadLetter
	default:
		errs = append(errs, &Error{Key: "onFiltered", Msg: fmt.Sprintf("%q is not ack or dlq", s.OnFiltered)})
	}
	switch s.OnBodyError {
	case "", "skip":
	case "dlq":
		t.bodyDLQ = true
	default:
		errs = append(errs, &Error{Key: "onBodyError", Msg: fmt.Sprintf("%q is not skip or dlq", s.OnBodyError)})
	}
	switch s.OnFilterError {
	case "", "dlq":
	case "deliver":
		t.filterErrDeliver = true
	default:
		errs = append(errs, &Error{Key: "onFilterError", Msg: fmt.Sprintf("%q is not deliver or dlq", s.OnFilterError)})
	}
	if strings.TrimSpace(s.Filter) != "" {
		r, err := compile("filter", s.Filter)
		if err != nil {
			errs = append(errs, err)
		}
		t.filter = &r
	}
	seen := map[string]int{}
	for i, rs := range s.Routes {
		key := fmt.Sprintf("routes[%d]", i)
		switch name := strings.TrimSpace(rs.Name); {
		case name == "":
			errs = append(errs, &Error{Key: key + ".name", Msg: "required: it names the route in metrics and traces"})
		case !validName(name):
			errs = append(errs, &Error{Key: key + ".name", Msg: fmt.Sprintf("%q: use letters, digits, '.', '_' or '-'", rs.Name)})
		default:
			if j, dup := seen[name]; dup {
				errs = append(errs, &Error{Key: key + ".name", Msg: fmt.Sprintf("%q is already the name of routes[%d]", name, j)})
			}
			seen[name] = i
		}
		if strings.TrimSpace(rs.Match) == "" {
			errs = append(errs, &Error{Key: key + ".match", Msg: "required: an expression that is true for the messages the route takes"})
			continue
		}
		r, err := compile(key+".match", rs.Match)
		if err != nil {
			errs = append(errs, err)
		}
		t.routes = append(t.routes, Route{Name: strings.TrimSpace(rs.Name), Policy: rs.Policy, rule: r})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	t.parse = bodyReader(t.rules())
	return t, nil
}

// rules are the filter, when there is one, and the routes' rules.
func (t *Table) rules() []*rule {
	var rs []*rule
	if t.filter != nil {
		rs = append(rs, t.filter)
	}
	for i := range t.routes {
		rs = append(rs, &t.routes[i].rule)
	}
	return rs
}

// bodyReader is how the body is read for rules: when they read only
// members of a JSON object by name, only those are decoded (a body is
// mostly what the rules do not look at); else all of it.
func bodyReader(rules []*rule) func([]byte, any) error {
	names := map[string]bool{}
	for _, r := range rules {
		if r.wholeBody {
			return json.Unmarshal
		}
		for _, n := range r.members {
			names[n] = true
		}
	}
	return func(data []byte, v any) error {
		return decodeMembers(data, names, v.(*any))
	}
}

func validName(s string) bool {
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		default:
			return false
		}
	}
	return true
}

// compile compiles one expression against the message view. Its type is
// checked here: a rule that cannot be a bool, or compares a string with a
// number, is refused now rather than failing on every message.
func compile(key, src string) (rule, error) {
	finder, reads := &bodyFinder{}, &bodyLookup{}
	// The env is described by a struct value, not a pointer: the program
	// then reads its fields by index, where with a pointer it looks each
	// one up by name through reflection on every message.
	prog, err := expr.Compile(src, expr.Env(env{}), expr.AsBool(), expr.Patch(finder), expr.Patch(headerLookup{}), expr.Patch(reads))
	if err != nil {
		e := &Error{Key: key, Msg: err.Error()}
		var fe *file.Error
		if errors.As(err, &fe) {
			e.Msg = fe.Message
			e.Line, e.Column = fe.Line, fe.Column+1
		}
		return rule{}, e
	}
	// Each member read by name holds one of the rule's mentions of the
	// body; any mention beyond those reads the body some other way.
	return rule{key: key, prog: prog, usesBody: finder.mentions > 0,
		members: reads.members, wholeBody: finder.mentions > len(reads.members), cmp: comparisonOf(prog.Node())}, nil
}

// comparison is a rule that compares one header, or one member of the
// body, with a string (headers["type"] == "order", body.kind == "refund"):
// the form most rules take, judged in a map lookup where running the
// program costs more than the rest of judging the message.
type comparison struct {
	body        bool // a member of the body, else a header
	name, value string
}

// comparisonOf is the comparison the compiled rule n is, or nil: n is
// what headerLookup and bodyLookup made of it.
func comparisonOf(n ast.Node) *comparison {
	b, ok := n.(*ast.BinaryNode)
	if !ok || b.Operator != "==" {
		return nil
	}
	read, lit := b.Left, b.Right
	if _, ok := read.(*ast.StringNode); ok {
		read, lit = lit, read
	}
	value, ok := lit.(*ast.StringNode)
	call, isCall := read.(*ast.CallNode)
	if !ok || !isCall || len(call.Arguments) != 2 {
		return nil
	}
	callee, _ := call.Callee.(*ast.IdentifierNode)
	of, _ := call.Arguments[0].(*ast.IdentifierNode)
	name, isName := call.Arguments[1].(*ast.StringNode)
	switch {
	case callee == nil || of == nil || !isName:
		return nil
	case callee.Value == headerFuncName && of.Value == "headers":
		return &comparison{name: name.Value, value: value.Value}
	case callee.Value == fieldFuncName && of.Value == "body":
		return &comparison{body: true, name: name.Value, value: value.Value}
	}
	return nil
}

// judge is the comparison's answer for env, as the language gives it (a
// value equals a string only when it is that string), and whether it
// could be given: a body that is not a JSON object is left to the
// program, whose answer is an error.
func (c *comparison) judge(env *env) (ok, judged bool) {
	from := env.Headers
	if c.body {
		if from, judged = env.Body.(map[string]any); !judged {
			return false, false
		}
	}
	s, isString := from[c.name].(string)
	return isString && s == c.value, true
}

// bodyFinder counts an expression's mentions of the body, so that messages
// are parsed only for the rules that need it.
type bodyFinder struct{ mentions int }

func (f *bodyFinder) Visit(n *ast.Node) {
	if id, ok := (*n).(*ast.IdentifierNode); ok && id.Value == "body" {
		f.mentions++
	}
}

// headerLookup turns headers["name"] and headers.name into a call of
// header, and "name" in headers into one of hasHeader: the same answers
// (nil for a missing header) without the reflection and the allocation the
// language's generic map access costs on every message. A name computed
// at run time keeps the language's own access.
type headerLookup struct{}

func (headerLookup) Visit(n *ast.Node) {
	if b, ok := (*n).(*ast.BinaryNode); ok && b.Operator == "in" {
		// "name" in headers
		name, isStr := b.Left.(*ast.StringNode)
		id, isID := b.Right.(*ast.IdentifierNode)
		if isStr && isID && id.Value == "headers" {
			ast.Patch(n, &ast.CallNode{
				Callee:    &ast.IdentifierNode{Value: hasHeaderFuncName},
				Arguments: []ast.Node{&ast.IdentifierNode{Value: "headers"}, &ast.StringNode{Value: name.Value}},
			})
		}
		return
	}
	m, ok := (*n).(*ast.MemberNode)
	if !ok || m.Optional || m.Method {
		return
	}
	id, ok := m.Node.(*ast.IdentifierNode)
	if !ok || id.Value != "headers" {
		return
	}
	name, ok := m.Property.(*ast.StringNode)
	if !ok {
		return
	}
	ast.Patch(n, &ast.CallNode{
		Callee:    &ast.IdentifierNode{Value: headerFuncName},
		Arguments: []ast.Node{&ast.IdentifierNode{Value: "headers"}, &ast.StringNode{Value: name.Value}},
	})
}

// bodyLookup turns body.name and body["name"], and a member read the same
// way below one (body.order.id), into a call of field: a JSON object's
// member is a map index there, where the language's generic access goes
// through reflection on every message. What is not an object (an array
// indexed by number, a scalar, null) keeps the language's own answer and
// error, and so do a name computed at run time and an optional read
// (body?.name). It notes the names of the body's own members it reads.
type bodyLookup struct{ members []string }

func (b *bodyLookup) Visit(n *ast.Node) {
	m, ok := (*n).(*ast.MemberNode)
	if !ok || m.Optional || m.Method {
		return
	}
	name, ok := m.Property.(*ast.StringNode)
	if !ok {
		return
	}
	switch of := m.Node.(type) {
	case *ast.IdentifierNode:
		if of.Value != "body" {
			return
		}
		b.members = append(b.members, name.Value)
	case *ast.CallNode:
		// A member of a member of the body, read by field already: the
		// walk reaches the inner read first.
		if id, ok := of.Callee.(*ast.IdentifierNode); !ok || id.Value != fieldFuncName {
			return
		}
	default:
		return
	}
	ast.Patch(n, &ast.CallNode{
		Callee:    &ast.IdentifierNode{Value: fieldFuncName},
		Arguments: []ast.Node{m.Node, &ast.StringNode{Value: name.Value}},
	})
}

// fieldFuncName is env's field holding field.
const fieldFuncName = "$field"

// field is from[name] for a JSON object (nil when the member is missing,
// as the language answers), and the language's own member read for
// anything else.
func field(from, name any) any {
	if o, ok := from.(map[string]any); ok {
		s, _ := name.(string)
		return o[s]
	}
	return runtime.Fetch(from, name)
}

// headerFuncName is env's field holding header; a rule cannot name it, as
// it starts with a '$'.
const headerFuncName = "$header"

// hasHeaderFuncName is env's field holding hasHeader.
const hasHeaderFuncName = "$hasHeader"

// hasHeader is name in headers.
func hasHeader(headers, name any) bool {
	h, _ := headers.(map[string]any)
	s, _ := name.(string)
	_, ok := h[s]
	return ok
}

// header is headers[name]. Its signature is one the language calls without
// packing the arguments into a slice.
func header(headers, name any) any {
	h, _ := headers.(map[string]any)
	s, _ := name.(string)
	return h[s]
}

// Routes returns the compiled routes, in order.
func (t *Table) Routes() []Route { return t.routes }

// HasFilter reports whether a filter is set.
func (t *Table) HasFilter() bool { return t.filter != nil }

// env is what an expression sees of a message.
type env struct {
	RoutingKey string         `expr:"routingKey"`
	Exchange   string         `expr:"exchange"`
	Headers    map[string]any `expr:"headers"`
	Properties Properties     `expr:"properties"`
	Body       any            `expr:"body"`
	// Header is header, for the lookups headerLookup writes.
	Header func(any, any) any `expr:"$header"`
	// HasHeader is hasHeader, for the tests headerLookup writes.
	HasHeader func(any, any) bool `expr:"$hasHeader"`
	// Field is field, for the member reads bodyLookup writes.
	Field func(any, any) any `expr:"$field"`
}

// Properties are a message's AMQP properties as expressions see them.
type Properties struct {
	Type            string    `expr:"type"`
	ContentType     string    `expr:"contentType"`
	ContentEncoding string    `expr:"contentEncoding"`
	Priority        int       `expr:"priority"`
	DeliveryMode    int       `expr:"deliveryMode"`
	Timestamp       time.Time `expr:"timestamp"`
	MessageID       string    `expr:"messageId"`
	CorrelationID   string    `expr:"correlationId"`
	AppID           string    `expr:"appId"`
	UserID          string    `expr:"userId"`
	ReplyTo         string    `expr:"replyTo"`
	Expiration      string    `expr:"expiration"`
}

// Outcome is what becomes of a message.
type Outcome int

const (
	// Deliver: send it to the app, on the chosen route's path.
	Deliver Outcome = iota
	// Ack: the filter left it out; it is acked unseen.
	Ack
	// DeadLetter: it goes to the DLQ with Decision.Reason.
	DeadLetter
)

// Decision is what a table decided for one message.
type Decision struct {
	Outcome Outcome
	// Route is the route taken, nil when none matched (the subscription's
	// own path and retry policy).
	Route *Route
	// Reason is why a message is not delivered: retry.ReasonFiltered or
	// retry.ReasonFilterError.
	Reason string
	// Err says why a message was dead-lettered with filter-error.
	Err error
	// Problems are the rules that could not be evaluated, for the loop to
	// count and log.
	Problems []Problem
}

// RouteName is the route taken, "" for none.
func (d Decision) RouteName() string {
	if d.Route == nil {
		return ""
	}
	return d.Route.Name
}

// Problem kinds.
const (
	// ProblemBody: the rule reads a body that is not JSON.
	ProblemBody = "body"
	// ProblemEval: the rule failed at run time.
	ProblemEval = "eval"
)

// Problem is a rule that could not be evaluated for a message.
type Problem struct {
	// Rule is the rule's key ("filter", "routes[1].match").
	Rule string
	Kind string
	Err  error
}

// view is one message being judged: its env, and its body parsed at most
// once, however many rules read it.
type view struct {
	m     *msg.Message
	parse func([]byte, any) error
	env   env
	// vm runs the message's rules.
	vm      *vm.VM
	parsed  bool
	bodyErr error
	// members is the map a body read in part is decoded into, kept
	// (empty) from one message to the next.
	members map[string]any
}

// Decide judges m. routingKey and exchange are the ones the message was
// first published with (a retried message comes back from its tier queue
// with others).
func (t *Table) Decide(m *msg.Message, routingKey, exchange string) Decision {
	v := views.Get().(*view)
	v.m, v.parse, v.env = m, t.parse, env{
		Header:     header,
		HasHeader:  hasHeader,
		Field:      field,
		RoutingKey: routingKey,
		Exchange:   exchange,
		Headers:    headers(m.Headers),
		Properties: Properties{
			Type: m.Type, ContentType: m.ContentType, ContentEncoding: m.ContentEncoding,
			Priority: int(m.Priority), DeliveryMode: int(m.DeliveryMode), Timestamp: m.Timestamp,
			MessageID: m.MessageID, CorrelationID: m.CorrelationID, AppID: m.AppID, UserID: m.UserID,
			ReplyTo: m.ReplyTo, Expiration: m.Expiration,
		},
	}
	defer v.release()
	var d Decision
	if t.filter != nil {
		ok, kind, err := t.eval(v, t.filter, &d)
		switch {
		case kind == ProblemBody && t.bodyDLQ:
			return Decision{Outcome: DeadLetter, Reason: retry.ReasonFilterError, Err: err, Problems: d.Problems}
		case err != nil && !t.filterErrDeliver:
			// The filter said neither yes nor no: the message is kept,
			// out of the app's way, for a replay once the cause is fixed.
			return Decision{Outcome: DeadLetter, Reason: retry.ReasonFilterError,
				Err: fmt.Errorf("the filter could not be evaluated: %w", err), Problems: d.Problems}
		case err != nil:
			// onFilterError deliver: on to the routes, as without a filter.
		case !ok:
			d.Outcome, d.Reason = t.filteredTo, retry.ReasonFiltered
			return d
		}
	}
	for i := range t.routes {
		r := &t.routes[i]
		ok, kind, err := t.eval(v, &r.rule, &d)
		if kind == ProblemBody && t.bodyDLQ {
			return Decision{Outcome: DeadLetter, Reason: retry.ReasonFilterError, Err: err, Problems: d.Problems}
		}
		// A route that cannot be evaluated does not match: the message
		// goes on to the next, and at worst to the subscription's path.
		if ok {
			d.Route = r
			return d
		}
	}
	return d
}

// eval runs one rule. A rule that cannot be evaluated gives false with
// the problem's kind and error, also noted in d.Problems.
func (t *Table) eval(v *view, r *rule, d *Decision) (ok bool, kind string, err error) {
	if r.usesBody {
		if err := v.body(); err != nil {
			d.Problems = append(d.Problems, Problem{Rule: r.key, Kind: ProblemBody, Err: err})
			return false, ProblemBody, err
		}
	}
	if r.cmp != nil {
		if ok, judged := r.cmp.judge(&v.env); judged {
			return ok, "", nil
		}
	}
	out, err := v.vm.Run(r.prog, &v.env)
	if err != nil {
		d.Problems = append(d.Problems, Problem{Rule: r.key, Kind: ProblemEval, Err: err})
		return false, ProblemEval, err
	}
	b, isBool := out.(bool)
	if !isBool {
		// A body field used as the whole rule may hold anything.
		err := fmt.Errorf("the rule gave %T, not a bool", out)
		d.Problems = append(d.Problems, Problem{Rule: r.key, Kind: ProblemEval, Err: err})
		return false, ProblemEval, err
	}
	return b, "", nil
}

// views are reused, each with the machine its rules run on: a message
// judged costs neither a view nor a machine per rule.
var views = sync.Pool{New: func() any { return &view{vm: &vm.VM{}} }}

// release returns v to views, keeping nothing of its message.
func (v *view) release() {
	clear(v.members)
	*v = view{vm: v.vm, members: v.members}
	views.Put(v)
}

// body parses the message body as JSON, once.
func (v *view) body() error {
	if v.parsed {
		return v.bodyErr
	}
	v.parsed = true
	if err := jsonContent(v.m.ContentType, v.m.ContentEncoding); err != nil {
		v.bodyErr = err
		return err
	}
	if v.members == nil {
		v.members = map[string]any{}
	}
	// A body read in part goes into v.members; read whole, it replaces it.
	v.env.Body = v.members
	if err := v.parse(v.m.Body, &v.env.Body); err != nil {
		v.bodyErr = fmt.Errorf("body is not JSON: %w", err)
		v.env.Body = nil
	}
	return v.bodyErr
}

// jsonContent says whether a body with these properties is read as JSON:
// no content type (many publishers set none), application/json or any
// application/*+json, and no content encoding other than identity (a
// compressed body is not parsed).
func jsonContent(contentType, encoding string) error {
	if encoding != "" && !strings.EqualFold(encoding, "identity") {
		return fmt.Errorf("body has content encoding %q, not plain JSON", encoding)
	}
	switch contentType {
	case "", "application/json":
		// The usual cases, without parsing the media type.
		return nil
	}
	if strings.TrimSpace(contentType) == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return fmt.Errorf("content type %q: %w", contentType, err)
	}
	if mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json") {
		return nil
	}
	return fmt.Errorf("content type %q is not JSON", contentType)
}

// headers is the headers as rules see them: byte-array values as strings,
// so that a header published as bytes compares equal to its text. The map
// is copied only when it holds such a value.
func headers(h map[string]any) map[string]any {
	for _, v := range h {
		if _, ok := v.([]byte); ok {
			out := make(map[string]any, len(h))
			for k, v := range h {
				if b, ok := v.([]byte); ok {
					v = string(b)
				}
				out[k] = v
			}
			return out
		}
	}
	if h == nil {
		return noHeaders
	}
	return h
}

// noHeaders is what rules see of a message without headers; never written.
var noHeaders = map[string]any{}
