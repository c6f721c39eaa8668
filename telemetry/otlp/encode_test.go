package otlp

import (
	"bytes"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

func ids(t, s byte) (trace.TraceID, trace.SpanID) {
	var tid trace.TraceID
	var sid trace.SpanID
	for i := range tid {
		tid[i] = t + byte(i)
	}
	for i := range sid {
		sid[i] = s + byte(i)
	}
	return tid, sid
}

// sampleSpans are three spans over two resources and two scopes, with
// every kind of attribute value, an event, a link, a remote parent and
// both status codes.
func sampleSpans(t *testing.T) []sdktrace.ReadOnlySpan {
	t.Helper()
	tid, sid := ids(1, 100)
	_, parent := ids(1, 200)
	ltid, lsid := ids(50, 150)
	ts, err := trace.ParseTraceState("vendor=value")
	if err != nil {
		t.Fatal(err)
	}
	res1 := resource.NewSchemaless(attribute.String("service.name", "hopper"), attribute.String("service.version", "1.2.3"))
	res2 := resource.NewWithAttributes("https://example.com/schema", attribute.String("service.name", "other"))
	start := time.Unix(1700000000, 123456789)
	scopeA := instrumentation.Scope{Name: "hopper", Version: "v1", Attributes: attribute.NewSet(attribute.Bool("a", true))}
	scopeB := instrumentation.Scope{Name: "other-scope"}
	stubs := tracetest.SpanStubs{
		{
			Name: "process orders",
			SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid,
				TraceFlags: trace.FlagsSampled, TraceState: ts}),
			Parent: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: parent,
				TraceFlags: trace.FlagsSampled, Remote: true}),
			SpanKind:  trace.SpanKindConsumer,
			StartTime: start,
			EndTime:   start.Add(1500 * time.Microsecond),
			Attributes: []attribute.KeyValue{
				attribute.String("messaging.system", "rabbitmq"),
				attribute.String("empty", ""),
				attribute.Int64("hopper.attempt", -3),
				attribute.Float64("ratio", 0.25),
				attribute.Bool("flag", false),
				attribute.StringSlice("ss", []string{"x", ""}),
				attribute.Int64Slice("is", []int64{1, 2}),
				attribute.Float64Slice("fs", []float64{1.5}),
				attribute.BoolSlice("bs", []bool{true, false}),
			},
			Events: []sdktrace.Event{{Name: "retry", Time: start.Add(time.Millisecond),
				Attributes: []attribute.KeyValue{attribute.Int("n", 2)}, DroppedAttributeCount: 1}},
			Links: []sdktrace.Link{{SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: ltid, SpanID: lsid}),
				Attributes: []attribute.KeyValue{attribute.String("why", "batch")}}},
			Status:               sdktrace.Status{Code: codes.Error, Description: "503"},
			DroppedAttributes:    2,
			DroppedEvents:        3,
			DroppedLinks:         4,
			Resource:             res1,
			InstrumentationScope: scopeA,
		},
		{
			Name:                 "POST",
			SpanContext:          trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: parent}),
			SpanKind:             trace.SpanKindClient,
			StartTime:            start,
			EndTime:              start,
			Status:               sdktrace.Status{Code: codes.Ok, Description: "ignored"},
			Resource:             res1,
			InstrumentationScope: scopeB,
		},
		{
			Name:                 "elsewhere",
			SpanContext:          trace.NewSpanContext(trace.SpanContextConfig{TraceID: ltid, SpanID: lsid, TraceFlags: trace.FlagsSampled}),
			StartTime:            start,
			EndTime:              start,
			Resource:             res2,
			InstrumentationScope: scopeA,
		},
	}
	return stubs.Snapshots()
}

func decode(t *testing.T, b []byte) *coltracepb.ExportTraceServiceRequest {
	t.Helper()
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		t.Fatalf("the collector's own message type cannot read the encoding: %v", err)
	}
	return &req
}

func attrs(kvs []*commonpb.KeyValue) map[string]*commonpb.AnyValue {
	m := map[string]*commonpb.AnyValue{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestEncodeReadsBackAsOTLP(t *testing.T) {
	req := decode(t, Encode(sampleSpans(t)))

	if len(req.ResourceSpans) != 2 {
		t.Fatalf("resource groups = %d, want 2", len(req.ResourceSpans))
	}
	rs := req.ResourceSpans[0]
	if got := attrs(rs.Resource.Attributes)["service.name"].GetStringValue(); got != "hopper" {
		t.Errorf("resource service.name = %q", got)
	}
	if got := attrs(rs.Resource.Attributes)["service.version"].GetStringValue(); got != "1.2.3" {
		t.Errorf("resource service.version = %q", got)
	}
	if req.ResourceSpans[1].SchemaUrl != "https://example.com/schema" {
		t.Errorf("second resource schema = %q", req.ResourceSpans[1].SchemaUrl)
	}
	if len(rs.ScopeSpans) != 2 || rs.ScopeSpans[0].Scope.Name != "hopper" || rs.ScopeSpans[0].Scope.Version != "v1" ||
		rs.ScopeSpans[1].Scope.Name != "other-scope" {
		t.Fatalf("scopes of the first resource: %v", rs.ScopeSpans)
	}
	if !attrs(rs.ScopeSpans[0].Scope.Attributes)["a"].GetBoolValue() {
		t.Error("scope attribute lost")
	}

	s := rs.ScopeSpans[0].Spans[0]
	tid, sid := ids(1, 100)
	_, parent := ids(1, 200)
	if !bytes.Equal(s.TraceId, tid[:]) || !bytes.Equal(s.SpanId, sid[:]) || !bytes.Equal(s.ParentSpanId, parent[:]) {
		t.Errorf("ids: trace %x span %x parent %x", s.TraceId, s.SpanId, s.ParentSpanId)
	}
	if s.Name != "process orders" || s.Kind != tracepb.Span_SPAN_KIND_CONSUMER || s.TraceState != "vendor=value" {
		t.Errorf("name %q kind %v state %q", s.Name, s.Kind, s.TraceState)
	}
	if s.StartTimeUnixNano != 1700000000123456789 || s.EndTimeUnixNano != 1700000000124956789 {
		t.Errorf("times %d..%d", s.StartTimeUnixNano, s.EndTimeUnixNano)
	}
	// Sampled, parent known to be remote.
	if want := uint32(0x01 | 0x100 | 0x200); s.Flags != want {
		t.Errorf("flags = %#x, want %#x", s.Flags, want)
	}
	a := attrs(s.Attributes)
	if len(s.Attributes) != 9 {
		t.Errorf("attributes = %d, want 9", len(s.Attributes))
	}
	if a["messaging.system"].GetStringValue() != "rabbitmq" || a["hopper.attempt"].GetIntValue() != -3 ||
		a["ratio"].GetDoubleValue() != 0.25 {
		t.Errorf("scalar attributes: %v", a)
	}
	if _, ok := a["empty"].GetValue().(*commonpb.AnyValue_StringValue); !ok {
		t.Errorf("an empty string attribute must still be a string value, got %T", a["empty"].GetValue())
	}
	if _, ok := a["flag"].GetValue().(*commonpb.AnyValue_BoolValue); !ok || a["flag"].GetBoolValue() {
		t.Errorf("a false bool attribute must still be a bool value, got %v", a["flag"])
	}
	ss := a["ss"].GetArrayValue().GetValues()
	if len(ss) != 2 || ss[0].GetStringValue() != "x" || ss[1].GetStringValue() != "" {
		t.Errorf("string slice = %v", ss)
	}
	is := a["is"].GetArrayValue().GetValues()
	if len(is) != 2 || is[1].GetIntValue() != 2 {
		t.Errorf("int slice = %v", is)
	}
	if fs := a["fs"].GetArrayValue().GetValues(); len(fs) != 1 || fs[0].GetDoubleValue() != 1.5 {
		t.Errorf("float slice = %v", fs)
	}
	if bs := a["bs"].GetArrayValue().GetValues(); len(bs) != 2 || !bs[0].GetBoolValue() {
		t.Errorf("bool slice = %v", bs)
	}
	if s.DroppedAttributesCount != 2 || s.DroppedEventsCount != 3 || s.DroppedLinksCount != 4 {
		t.Errorf("dropped counts %d %d %d", s.DroppedAttributesCount, s.DroppedEventsCount, s.DroppedLinksCount)
	}
	if len(s.Events) != 1 || s.Events[0].Name != "retry" || s.Events[0].TimeUnixNano != 1700000000124456789 ||
		attrs(s.Events[0].Attributes)["n"].GetIntValue() != 2 || s.Events[0].DroppedAttributesCount != 1 {
		t.Errorf("events = %v", s.Events)
	}
	ltid, lsid := ids(50, 150)
	if len(s.Links) != 1 || !bytes.Equal(s.Links[0].TraceId, ltid[:]) || !bytes.Equal(s.Links[0].SpanId, lsid[:]) ||
		attrs(s.Links[0].Attributes)["why"].GetStringValue() != "batch" || s.Links[0].Flags != 0x100 {
		t.Errorf("links = %v", s.Links)
	}
	if s.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || s.Status.GetMessage() != "503" {
		t.Errorf("status = %v", s.Status)
	}

	post := rs.ScopeSpans[1].Spans[0]
	if post.Kind != tracepb.Span_SPAN_KIND_CLIENT || len(post.ParentSpanId) != 0 || post.Flags != 0x100 {
		t.Errorf("root client span: kind %v parent %x flags %#x", post.Kind, post.ParentSpanId, post.Flags)
	}
	// Only an error carries a message.
	if post.Status.GetCode() != tracepb.Status_STATUS_CODE_OK || post.Status.GetMessage() != "" {
		t.Errorf("ok status = %v", post.Status)
	}
	if other := req.ResourceSpans[1].ScopeSpans[0].Spans[0]; other.Name != "elsewhere" || other.Status != nil ||
		other.Kind != tracepb.Span_SPAN_KIND_UNSPECIFIED {
		t.Errorf("span of the second resource: %v", other)
	}
}

func TestEncodeNestedValues(t *testing.T) {
	stubs := tracetest.SpanStubs{{
		Name: "nested",
		Attributes: []attribute.KeyValue{
			attribute.Slice("mixed", attribute.StringValue("s"), attribute.Int64Value(7)),
			attribute.Map("m", attribute.String("k", "v"), attribute.Int("n", 1)),
			attribute.ByteSlice("raw", []byte{0, 1, 2}),
		},
	}}
	req := decode(t, Encode(stubs.Snapshots()))
	a := attrs(req.ResourceSpans[0].ScopeSpans[0].Spans[0].Attributes)
	mixed := a["mixed"].GetArrayValue().GetValues()
	if len(mixed) != 2 || mixed[0].GetStringValue() != "s" || mixed[1].GetIntValue() != 7 {
		t.Errorf("mixed slice = %v", mixed)
	}
	m := attrs(a["m"].GetKvlistValue().GetValues())
	if m["k"].GetStringValue() != "v" || m["n"].GetIntValue() != 1 {
		t.Errorf("map = %v", m)
	}
	if !bytes.Equal(a["raw"].GetBytesValue(), []byte{0, 1, 2}) {
		t.Errorf("bytes = %v", a["raw"])
	}
}

// A batch larger than any one scratch buffer still encodes every span.
func TestEncodeManySpans(t *testing.T) {
	var stubs tracetest.SpanStubs
	for i := range 600 {
		_, sid := ids(0, byte(i))
		stubs = append(stubs, tracetest.SpanStub{Name: "s", SpanContext: trace.NewSpanContext(trace.SpanContextConfig{SpanID: sid}),
			Attributes: []attribute.KeyValue{attribute.Int("i", i)}})
	}
	req := decode(t, Encode(stubs.Snapshots()))
	spans := req.ResourceSpans[0].ScopeSpans[0].Spans
	if len(spans) != 600 {
		t.Fatalf("spans = %d, want 600", len(spans))
	}
	for i, s := range spans {
		if got := attrs(s.Attributes)["i"].GetIntValue(); got != int64(i) {
			t.Fatalf("span %d carries i=%d", i, got)
		}
	}
}

// A zero or pre-1970 time is written as 0 ("unknown"), not wrapped
// around to a date centuries ahead.
func TestEncodeTimesBeforeEpoch(t *testing.T) {
	stubs := tracetest.SpanStubs{{Name: "no times", EndTime: time.Unix(-5, 0),
		Events: []sdktrace.Event{{Name: "e"}}}}
	s := decode(t, Encode(stubs.Snapshots())).ResourceSpans[0].ScopeSpans[0].Spans[0]
	if s.StartTimeUnixNano != 0 || s.EndTimeUnixNano != 0 || s.Events[0].TimeUnixNano != 0 {
		t.Errorf("start %d end %d event %d, want 0 each", s.StartTimeUnixNano, s.EndTimeUnixNano, s.Events[0].TimeUnixNano)
	}
}
