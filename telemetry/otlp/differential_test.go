package otlp

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

// bodyCollector keeps the body of each request by path and answers 200.
type bodyCollector struct {
	mu     sync.Mutex
	bodies map[string][]byte
}

func (c *bodyCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bodies[r.URL.Path] = b
}

// recordedSpans are spans the SDK itself ended, from a tracer provider
// with its default resource: nested spans, a remote parent, events, a
// link with a trace state, every status, an empty-named tracer.
func recordedSpans(t *testing.T) []sdktrace.ReadOnlySpan {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", "hopper")))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithResource(res))
	defer tp.Shutdown(context.Background()) //nolint:errcheck // nothing to flush

	tid, sid := ids(9, 90)
	ts, err := trace.ParseTraceState("k=v,other=1")
	if err != nil {
		t.Fatal(err)
	}
	remote := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true}))
	_, lsid := ids(9, 120)
	link := trace.Link{SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: lsid,
		TraceState: ts, Remote: true}),
		Attributes: []attribute.KeyValue{attribute.String("messaging.message.id", "m-1")}}

	tr := tp.Tracer("github.com/hopper-sidecar/hopper", trace.WithInstrumentationVersion("1.4.2"),
		trace.WithSchemaURL("https://opentelemetry.io/schemas/1.26.0"),
		trace.WithInstrumentationAttributes(attribute.String("scope.kind", "proxy")))
	start := time.Unix(1700000100, 0)
	ctx, consume := tr.Start(remote, "orders process", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(start), trace.WithLinks(link),
		trace.WithAttributes(attribute.String("messaging.system", "rabbitmq"), attribute.Int("messaging.batch.message_count", 1)))
	_, post := tr.Start(ctx, "POST", trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(start.Add(time.Millisecond)))
	post.AddEvent("retry", trace.WithTimestamp(start.Add(2*time.Millisecond)),
		trace.WithAttributes(attribute.Int("hopper.attempt", 2), attribute.StringSlice("tiers", []string{"1s", "2m"})))
	post.SetStatus(codes.Error, "503 Service Unavailable")
	post.End(trace.WithTimestamp(start.Add(3 * time.Millisecond)))
	consume.SetStatus(codes.Ok, "")
	consume.End(trace.WithTimestamp(start.Add(4 * time.Millisecond)))

	_, bare := tp.Tracer("").Start(context.Background(), "unnamed tracer", trace.WithTimestamp(start))
	bare.SetAttributes(attribute.Float64Slice("ratios", []float64{0.5, 1e-9}), attribute.BoolSlice("b", []bool{false}))
	bare.End(trace.WithTimestamp(start.Add(time.Second)))
	return rec.Ended()
}

// normalise makes two requests comparable where they may legitimately
// differ:
//   - order: the SDK groups resources and scopes through maps, so their
//     order varies run to run; Hopper keeps them in order first seen.
//     Both are sorted here (spans within a scope keep their order).
//   - an absent resource, scope or status is the empty message: a
//     receiver reads both alike, and Hopper leaves out an unset status
//     and always writes the resource and scope messages.
//   - a status message is only meaningful with an error status: the
//     tracing API drops it for any other, and Hopper never writes it then
//     (the SDK passes on what a hand-built span carries).
//   - a link's trace state: Hopper sends it, the SDK's exporter leaves it
//     out. The test checks Hopper's value before clearing it.
func normalise(req *coltracepb.ExportTraceServiceRequest) {
	key := func(m proto.Message) string {
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		return string(b)
	}
	for _, rs := range req.ResourceSpans {
		if rs.Resource == nil {
			rs.Resource = &resourcepb.Resource{}
		}
		for _, ss := range rs.ScopeSpans {
			if ss.Scope == nil {
				ss.Scope = &commonpb.InstrumentationScope{}
			}
			for _, s := range ss.Spans {
				if s.Status == nil {
					s.Status = &tracepb.Status{}
				}
				if s.Status.Code != tracepb.Status_STATUS_CODE_ERROR {
					s.Status.Message = ""
				}
				for _, l := range s.Links {
					l.TraceState = ""
				}
			}
		}
		sort.SliceStable(rs.ScopeSpans, func(i, j int) bool {
			return key(rs.ScopeSpans[i].Scope)+rs.ScopeSpans[i].SchemaUrl < key(rs.ScopeSpans[j].Scope)+rs.ScopeSpans[j].SchemaUrl
		})
	}
	sort.SliceStable(req.ResourceSpans, func(i, j int) bool {
		return key(req.ResourceSpans[i].Resource)+req.ResourceSpans[i].SchemaUrl < key(req.ResourceSpans[j].Resource)+req.ResourceSpans[j].SchemaUrl
	})
}

// The same spans sent by the SDK's OTLP/HTTP exporter and by Hopper's
// read back as the same ExportTraceServiceRequest.
func TestEncodeMatchesSDKExporter(t *testing.T) {
	col := &bodyCollector{bodies: map[string][]byte{}}
	srv := httptest.NewServer(col)
	defer srv.Close()
	ctx := context.Background()

	nested := tracetest.SpanStubs{{
		Name: "nested values",
		Attributes: []attribute.KeyValue{
			attribute.Slice("mixed", attribute.StringValue("s"), attribute.Int64Value(7), attribute.BoolValue(false)),
			attribute.Map("m", attribute.String("k", "v"), attribute.Int("n", 1), attribute.String("empty", "")),
			attribute.ByteSlice("raw", []byte{0, 1, 2}),
			attribute.ByteSlice("no bytes", nil),
			{Key: "unset"},
		},
	}}.Snapshots()
	cases := map[string][]sdktrace.ReadOnlySpan{
		"stubs":    sampleSpans(t),
		"nested":   nested,
		"recorded": recordedSpans(t),
	}
	for name, spans := range cases {
		t.Run(name, func(t *testing.T) {
			sdk, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(srv.URL+"/sdk/"+name),
				otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
			if err != nil {
				t.Fatal(err)
			}
			if err := sdk.ExportSpans(ctx, spans); err != nil {
				t.Fatalf("SDK export: %v", err)
			}
			if err := sdk.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			hopper := New(mustConfig(t, map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": srv.URL + "/hopper/" + name}))
			if err := hopper.ExportSpans(ctx, spans); err != nil {
				t.Fatalf("Hopper export: %v", err)
			}

			col.mu.Lock()
			sdkBody, hopperBody := col.bodies["/sdk/"+name], col.bodies["/hopper/"+name]
			col.mu.Unlock()
			want, got := decode(t, sdkBody), decode(t, hopperBody)
			if name == "recorded" {
				// Hopper sends the link's trace state (normalise clears it).
				l := findSpan(got, "orders process").GetLinks()
				if len(l) != 1 || l[0].TraceState != "k=v,other=1" || l[0].Flags != 0x300 {
					t.Errorf("link = %v, want one with trace state k=v,other=1 and flags remote", l)
				}
			}
			normalise(want)
			normalise(got)
			if !proto.Equal(want, got) {
				t.Errorf("Hopper's request differs from the SDK's:\n%s", lineDiff(prototext.Format(want), prototext.Format(got)))
			}
			if n := countSpans(got); n != len(spans) {
				t.Errorf("spans = %d, want %d", n, len(spans))
			}
		})
	}
}

func findSpan(req *coltracepb.ExportTraceServiceRequest, name string) *tracepb.Span {
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				if s.Name == name {
					return s
				}
			}
		}
	}
	return nil
}

func countSpans(req *coltracepb.ExportTraceServiceRequest) int {
	n := 0
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			n += len(ss.Spans)
		}
	}
	return n
}

// lineDiff is a line diff of want and got (the SDK's lines "-",
// Hopper's "+"), by their longest common subsequence.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	// lcs[i][j] is the longest common subsequence of w[i:] and g[j:].
	lcs := make([][]int, len(w)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(g)+1)
	}
	for i := len(w) - 1; i >= 0; i-- {
		for j := len(g) - 1; j >= 0; j-- {
			if w[i] == g[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out bytes.Buffer
	i, j := 0, 0
	for i < len(w) || j < len(g) {
		switch {
		case i < len(w) && j < len(g) && w[i] == g[j]:
			i, j = i+1, j+1
		case j < len(g) && (i == len(w) || lcs[i][j+1] >= lcs[i+1][j]):
			out.WriteString("+ " + g[j] + "\n")
			j++
		default:
			out.WriteString("- " + w[i] + "  (line " + strconv.Itoa(i+1) + ")\n")
			i++
		}
	}
	return out.String()
}
