// Package otlp sends ended spans to an OpenTelemetry collector over OTLP,
// as http/protobuf or gRPC. It writes the protobuf messages itself: the
// SDK's own exporters link a gRPC stack into the binary even for the HTTP
// protocol, and that code, mapped into every sidecar, cost about 4.4 MB of
// resident memory for a few hundred lines of wire encoding.
package otlp

import (
	"math"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of the OTLP trace messages (opentelemetry/proto/trace/v1,
// common/v1, resource/v1 and collector/trace/v1).
const (
	requestResourceSpans = 1 // ExportTraceServiceRequest.resource_spans

	resourceSpansResource  = 1
	resourceSpansScope     = 2
	resourceSpansSchemaURL = 3

	resourceAttributes = 1

	scopeSpansScope     = 1
	scopeSpansSpans     = 2
	scopeSpansSchemaURL = 3

	scopeName       = 1
	scopeVersion    = 2
	scopeAttributes = 3

	spanTraceID           = 1
	spanSpanID            = 2
	spanTraceState        = 3
	spanParentSpanID      = 4
	spanName              = 5
	spanKind              = 6
	spanStart             = 7
	spanEnd               = 8
	spanAttributes        = 9
	spanDroppedAttributes = 10
	spanEvents            = 11
	spanDroppedEvents     = 12
	spanLinks             = 13
	spanDroppedLinks      = 14
	spanStatus            = 15
	spanFlags             = 16

	eventTime              = 1
	eventName              = 2
	eventAttributes        = 3
	eventDroppedAttributes = 4

	linkTraceID           = 1
	linkSpanID            = 2
	linkTraceState        = 3
	linkAttributes        = 4
	linkDroppedAttributes = 5
	linkFlags             = 6

	statusMessage = 2
	statusCode    = 3

	keyValueKey   = 1
	keyValueValue = 2

	anyString = 1
	anyBool   = 2
	anyInt    = 3
	anyDouble = 4
	anyArray  = 5
	anyKVList = 6
	anyBytes  = 7

	arrayValues  = 1
	kvListValues = 1
)

// OTLP span flags: the low byte is the W3C trace flags; these two bits say
// whether the parent (or linked) context is known to be remote.
const (
	flagHasIsRemote = 0x100
	flagIsRemote    = 0x200
)

// OTLP status codes differ in order from the Go API's; an unset status is
// written as no status at all.
const (
	statusOK    = 1
	statusError = 2
)

// Encode returns the ExportTraceServiceRequest for spans, grouped by
// resource and then by instrumentation scope, in the order first seen.
func Encode(spans []sdktrace.ReadOnlySpan) []byte {
	type scopeGroup struct {
		scope sdktrace.ReadOnlySpan // any span of the group, for its scope
		spans []sdktrace.ReadOnlySpan
	}
	type resourceGroup struct {
		first  sdktrace.ReadOnlySpan
		scopes []*scopeGroup
	}
	var groups []*resourceGroup
	for _, s := range spans {
		var rg *resourceGroup
		for _, g := range groups {
			if g.first.Resource().Equal(s.Resource()) {
				rg = g
				break
			}
		}
		if rg == nil {
			rg = &resourceGroup{first: s}
			groups = append(groups, rg)
		}
		var sg *scopeGroup
		for _, g := range rg.scopes {
			if sameScope(g.scope, s) {
				sg = g
				break
			}
		}
		if sg == nil {
			sg = &scopeGroup{scope: s}
			rg.scopes = append(rg.scopes, sg)
		}
		sg.spans = append(sg.spans, s)
	}

	var e encoder
	var out []byte
	for _, rg := range groups {
		out = e.message(out, requestResourceSpans, func(b []byte) []byte {
			res := rg.first.Resource()
			b = e.message(b, resourceSpansResource, func(b []byte) []byte {
				if res == nil {
					return b
				}
				return e.attributes(b, resourceAttributes, res.Attributes())
			})
			for _, sg := range rg.scopes {
				b = e.message(b, resourceSpansScope, func(b []byte) []byte {
					sc := sg.scope.InstrumentationScope()
					b = e.message(b, scopeSpansScope, func(b []byte) []byte {
						b = appendString(b, scopeName, sc.Name)
						b = appendString(b, scopeVersion, sc.Version)
						return e.attributes(b, scopeAttributes, sc.Attributes.ToSlice())
					})
					for _, s := range sg.spans {
						b = e.message(b, scopeSpansSpans, func(b []byte) []byte { return e.span(b, s) })
					}
					return appendString(b, scopeSpansSchemaURL, sc.SchemaURL)
				})
			}
			if res != nil {
				b = appendString(b, resourceSpansSchemaURL, res.SchemaURL())
			}
			return b
		})
	}
	return out
}

func sameScope(a, b sdktrace.ReadOnlySpan) bool {
	x, y := a.InstrumentationScope(), b.InstrumentationScope()
	return x.Name == y.Name && x.Version == y.Version && x.SchemaURL == y.SchemaURL &&
		x.Attributes.Equals(&y.Attributes)
}

// encoder writes nested messages. A nested message is written after its
// tag into a scratch buffer and copied in with its length; the scratch
// buffers are kept per depth so a batch allocates them once.
type encoder struct {
	scratch [][]byte
	depth   int
}

// message appends field num holding the message that body writes.
func (e *encoder) message(b []byte, num protowire.Number, body func([]byte) []byte) []byte {
	if e.depth == len(e.scratch) {
		e.scratch = append(e.scratch, nil)
	}
	e.depth++
	inner := body(e.scratch[e.depth-1][:0])
	e.depth--
	e.scratch[e.depth] = inner
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, inner)
}

func (e *encoder) span(b []byte, s sdktrace.ReadOnlySpan) []byte {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	b = appendBytes(b, spanTraceID, tid[:])
	b = appendBytes(b, spanSpanID, sid[:])
	b = appendString(b, spanTraceState, sc.TraceState().String())
	if p := s.Parent(); p.SpanID().IsValid() {
		pid := p.SpanID()
		b = appendBytes(b, spanParentSpanID, pid[:])
	}
	b = appendString(b, spanName, s.Name())
	if k := s.SpanKind(); k != trace.SpanKindUnspecified {
		b = protowire.AppendTag(b, spanKind, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(k)) // same numbering as OTLP's
	}
	b = appendTime(b, spanStart, s.StartTime().UnixNano())
	b = appendTime(b, spanEnd, s.EndTime().UnixNano())
	b = e.attributes(b, spanAttributes, s.Attributes())
	b = appendCount(b, spanDroppedAttributes, s.DroppedAttributes())
	for _, ev := range s.Events() {
		b = e.message(b, spanEvents, func(b []byte) []byte {
			b = appendTime(b, eventTime, ev.Time.UnixNano())
			b = appendString(b, eventName, ev.Name)
			b = e.attributes(b, eventAttributes, ev.Attributes)
			return appendCount(b, eventDroppedAttributes, ev.DroppedAttributeCount)
		})
	}
	b = appendCount(b, spanDroppedEvents, s.DroppedEvents())
	for _, l := range s.Links() {
		b = e.message(b, spanLinks, func(b []byte) []byte {
			lt, ls := l.SpanContext.TraceID(), l.SpanContext.SpanID()
			b = appendBytes(b, linkTraceID, lt[:])
			b = appendBytes(b, linkSpanID, ls[:])
			b = appendString(b, linkTraceState, l.SpanContext.TraceState().String())
			b = e.attributes(b, linkAttributes, l.Attributes)
			b = appendCount(b, linkDroppedAttributes, l.DroppedAttributeCount)
			return appendFlags(b, linkFlags, l.SpanContext.TraceFlags(), l.SpanContext)
		})
	}
	b = appendCount(b, spanDroppedLinks, s.DroppedLinks())
	if st := s.Status(); st.Code != codes.Unset {
		b = e.message(b, spanStatus, func(b []byte) []byte {
			code := uint64(statusOK)
			if st.Code == codes.Error {
				code = statusError
				b = appendString(b, statusMessage, st.Description)
			}
			b = protowire.AppendTag(b, statusCode, protowire.VarintType)
			return protowire.AppendVarint(b, code)
		})
	}
	return appendFlags(b, spanFlags, sc.TraceFlags(), s.Parent())
}

// appendFlags writes W3C trace flags tf, with the bits saying whether
// remote (a span's parent, or a link's target) came from another process.
func appendFlags(b []byte, num protowire.Number, tf trace.TraceFlags, remote trace.SpanContext) []byte {
	flags := uint32(tf) | flagHasIsRemote
	if remote.IsRemote() {
		flags |= flagIsRemote
	}
	b = protowire.AppendTag(b, num, protowire.Fixed32Type)
	return protowire.AppendFixed32(b, flags)
}

func (e *encoder) attributes(b []byte, num protowire.Number, kvs []attribute.KeyValue) []byte {
	for _, kv := range kvs {
		b = e.message(b, num, func(b []byte) []byte {
			b = appendString(b, keyValueKey, string(kv.Key))
			return e.message(b, keyValueValue, func(b []byte) []byte { return e.value(b, kv.Value) })
		})
	}
	return b
}

// value writes an AnyValue.
func (e *encoder) value(b []byte, v attribute.Value) []byte {
	switch v.Type() {
	case attribute.BOOL:
		return appendBool(b, anyBool, v.AsBool())
	case attribute.INT64:
		return appendInt(b, anyInt, v.AsInt64())
	case attribute.FLOAT64:
		return appendDouble(b, anyDouble, v.AsFloat64())
	case attribute.STRING:
		return appendStringAlways(b, anyString, v.AsString())
	case attribute.BYTESLICE:
		return appendBytesAlways(b, anyBytes, v.AsByteSlice())
	case attribute.BOOLSLICE:
		s := v.AsBoolSlice()
		return e.array(b, len(s), func(b []byte, i int) []byte { return appendBool(b, anyBool, s[i]) })
	case attribute.INT64SLICE:
		s := v.AsInt64Slice()
		return e.array(b, len(s), func(b []byte, i int) []byte { return appendInt(b, anyInt, s[i]) })
	case attribute.FLOAT64SLICE:
		s := v.AsFloat64Slice()
		return e.array(b, len(s), func(b []byte, i int) []byte { return appendDouble(b, anyDouble, s[i]) })
	case attribute.STRINGSLICE:
		s := v.AsStringSlice()
		return e.array(b, len(s), func(b []byte, i int) []byte { return appendStringAlways(b, anyString, s[i]) })
	case attribute.SLICE:
		s := v.AsSlice()
		return e.array(b, len(s), func(b []byte, i int) []byte { return e.value(b, s[i]) })
	case attribute.MAP:
		return e.message(b, anyKVList, func(b []byte) []byte { return e.attributes(b, kvListValues, v.AsMap()) })
	}
	return b // an empty value: an AnyValue with nothing set
}

// array writes an ArrayValue of n AnyValues, element i written by elem.
func (e *encoder) array(b []byte, n int, elem func([]byte, int) []byte) []byte {
	return e.message(b, anyArray, func(b []byte) []byte {
		for i := range n {
			b = e.message(b, arrayValues, func(b []byte) []byte { return elem(b, i) })
		}
		return b
	})
}

// appendString skips an empty string, as proto3 does for a field's default.
func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return appendStringAlways(b, num, s)
}

// appendStringAlways writes s even when empty: in a oneof, presence is
// the value's type.
func appendStringAlways(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	return appendBytesAlways(b, num, v)
}

func appendBytesAlways(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, protowire.EncodeBool(v))
}

func appendInt(b []byte, num protowire.Number, v int64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(v))
}

func appendDouble(b []byte, num protowire.Number, v float64) []byte {
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, math.Float64bits(v))
}

// appendTime writes a time in nanoseconds since the epoch. The field is
// unsigned: a time before 1970 (or the zero time.Time, whose UnixNano
// overflows) is written as 0, "unknown", instead of wrapping around to a
// date centuries ahead; and 0, proto3's default, is left out.
func appendTime(b []byte, num protowire.Number, unixNano int64) []byte {
	if unixNano <= 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, uint64(unixNano))
}

func appendCount(b []byte, num protowire.Number, n int) []byte {
	if n <= 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(n))
}
