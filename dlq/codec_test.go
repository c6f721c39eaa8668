package dlq

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/msg"
)

// everyType is a message with a header of every AMQP field type, strings
// that are not UTF-8, and every property set.
func everyType() *msg.Message {
	return &msg.Message{
		Exchange: "", RoutingKey: "orders.dlq",
		ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: 2, Priority: 7,
		CorrelationID: "corr-1", ReplyTo: "replies", Expiration: "60000", MessageID: "id-\xff\xfe",
		Timestamp: time.Unix(1_700_000_000, 0), Type: "order.created", UserID: "guest", AppID: "shop",
		Headers: map[string]any{
			"s":          "text <&> é",
			"bad-utf8":   "a\xffb",
			"\xffkey":    "binary name",
			"=b64:x":     "a name that looks escaped",
			"empty":      "",
			"bytes":      []byte{0, 1, 2, 0xff},
			"no-bytes":   []byte{},
			"t":          true,
			"f":          false,
			"i8":         int8(-8),
			"i16":        int16(-1600),
			"i32":        int32(-320000),
			"i64":        int64(math.MinInt64),
			"u8":         uint8(255),
			"u16":        uint16(65535),
			"u32":        uint32(math.MaxUint32),
			"f32":        float32(1.1),
			"f64":        0.1,
			"nan":        math.NaN(),
			"inf":        math.Inf(-1),
			"dec":        msg.Decimal{Scale: 2, Value: -12345},
			"ts":         time.Unix(1_600_000_000, 0),
			"null":       nil,
			"table":      map[string]any{"inner": int32(1), "deeper": map[string]any{"x": "y"}, "empty": map[string]any{}},
			"array":      []any{"a", int64(2), []any{true, nil}, map[string]any{"k": []byte("v")}},
			"empty-list": []any{},
		},
		Body: []byte{0, 'h', 'i', 0xff, '\n'},
	}
}

func TestRecordRoundTripsEveryType(t *testing.T) {
	in := everyType()
	line, err := MarshalLine(in, "orders.dlq")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(line, []byte("\n")) != 1 || !bytes.HasSuffix(line, []byte("\n")) {
		t.Fatalf("not one line: %q", line)
	}
	if !json.Valid(line) {
		t.Fatalf("invalid JSON: %s", line)
	}
	out, err := UnmarshalLine(line)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Body, in.Body) {
		t.Errorf("body = %q, want %q", out.Body, in.Body)
	}
	inProps, outProps := *in, *out
	inProps.Headers, outProps.Headers, inProps.Body, outProps.Body = nil, nil, nil, nil
	if !inProps.Timestamp.Equal(outProps.Timestamp) {
		t.Errorf("timestamp %v != %v", outProps.Timestamp, inProps.Timestamp)
	}
	inProps.Timestamp, outProps.Timestamp = time.Time{}, time.Time{}
	if !reflect.DeepEqual(inProps, outProps) {
		t.Errorf("properties:\n got %+v\nwant %+v", outProps, inProps)
	}
	for k, want := range in.Headers {
		got, ok := out.Headers[k]
		if !ok {
			t.Errorf("header %q missing", k)
			continue
		}
		if !sameValue(got, want) {
			t.Errorf("header %q = %#v (%T), want %#v (%T)", k, got, got, want, want)
		}
	}
	if len(out.Headers) != len(in.Headers) {
		t.Errorf("%d headers, want %d", len(out.Headers), len(in.Headers))
	}
	// Encoding again gives the same bytes: the format is deterministic.
	again, err := MarshalLine(out, "orders.dlq")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, line) {
		t.Errorf("second encoding differs:\n%s\n%s", line, again)
	}
}

// sameValue compares header values, NaN and instants included.
func sameValue(a, b any) bool {
	switch x := a.(type) {
	case float64:
		y, ok := b.(float64)
		return ok && (x == y || math.IsNaN(x) && math.IsNaN(y))
	case time.Time:
		y, ok := b.(time.Time)
		return ok && x.Equal(y)
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k := range x {
			if !sameValue(x[k], y[k]) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameValue(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

func TestRecordHeaderTypesAreReadable(t *testing.T) {
	line, err := MarshalLine(&msg.Message{Headers: map[string]any{"x-retry-count": int32(3), "f": float32(1.5)}, Body: []byte("hi")}, "q")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"x-retry-count":{"type":"int32","value":3}`, `"f":{"type":"float32","value":"1.5"}`, `"body":"aGk="`, `"v":1`} {
		if !strings.Contains(string(line), want) {
			t.Errorf("line %s lacks %s", line, want)
		}
	}
}

func TestDecimalRoundTrip(t *testing.T) {
	line, err := MarshalLine(&msg.Message{Headers: map[string]any{"d": msg.Decimal{Scale: 3, Value: 1500}}}, "q")
	if err != nil {
		t.Fatal(err)
	}
	m, err := UnmarshalLine(line)
	if err != nil {
		t.Fatal(err)
	}
	if m.Headers["d"] != (msg.Decimal{Scale: 3, Value: 1500}) {
		t.Fatalf("d = %#v", m.Headers["d"])
	}
	if s := (msg.Decimal{Scale: 3, Value: -1500}).String(); s != "-1.500" {
		t.Errorf("String = %s", s)
	}
	if s := (msg.Decimal{Scale: 4, Value: 15}).String(); s != "0.0015" {
		t.Errorf("String = %s", s)
	}
}

func TestUnmarshalRejectsGarbage(t *testing.T) {
	for _, line := range []string{
		`not json`,
		`{"v":2,"exchange":"","routingKey":"","properties":{},"body":""}`,
		`{"v":1,"exchange":"","routingKey":"","properties":{},"headers":{"h":{"type":"int8","value":300}},"body":""}`,
		`{"v":1,"exchange":"","routingKey":"","properties":{},"headers":{"h":{"type":"mystery","value":1}},"body":""}`,
		`{"v":1,"exchange":"","routingKey":"","properties":{},"headers":{"h":{"type":"int32"}},"body":""}`,
		`{"v":1,"exchange":"","routingKey":"","properties":{},"body":"","surprise":1}`,
		`{"v":1,"exchange":"","routingKey":"","properties":{},"body":"!!not base64"}`,
	} {
		if _, err := UnmarshalLine([]byte(line)); err == nil {
			t.Errorf("accepted %s", line)
		}
	}
}

func TestUnsupportedHeaderTypeIsAnError(t *testing.T) {
	if _, err := MarshalLine(&msg.Message{Headers: map[string]any{"c": make(chan int)}}, "q"); err == nil {
		t.Fatal("a channel header was encoded")
	}
}

func TestPreview(t *testing.T) {
	for _, tc := range []struct {
		body             string
		max              int
		text, trunc      bool
		contains, absent string
	}{
		{body: `{"order":1}`, max: 100, text: true, contains: `{"order":1}`},
		{body: "line1\nline2\ttab", max: 100, text: true, contains: "line2\ttab"},
		{body: "héllo wörld", max: 2, text: true, trunc: true, contains: "h", absent: "\xc3"},
		{body: "\x00\x01binary", max: 100, text: false, contains: "00 01 62"},
		{body: "bad \xff utf8", max: 100, text: false, contains: "ff"},
		{body: "bell\a", max: 100, text: false},
		{body: "0123456789", max: 4, text: true, trunc: true, contains: "0123", absent: "4"},
	} {
		got, isText, trunc := Preview([]byte(tc.body), tc.max)
		if isText != tc.text || trunc != tc.trunc {
			t.Errorf("%q: text=%v truncated=%v, want %v %v", tc.body, isText, trunc, tc.text, tc.trunc)
		}
		if !strings.Contains(got, tc.contains) || (tc.absent != "" && strings.Contains(got, tc.absent)) {
			t.Errorf("%q: preview %q", tc.body, got)
		}
	}
}

func TestWritePeekShowsTypes(t *testing.T) {
	var b strings.Builder
	m := everyType()
	if err := WritePeek(&b, 3, m, 64, time.Unix(1_700_000_100, 0)); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"--- message 3 ---", `message-id:       "id-\xff\xfe"`, "i16: -1600 (int16)", "dec: -123.45", "bytes: bytes 0x000102ff", "body (5 bytes, binary)", "null: (void)"} {
		if !strings.Contains(out, want) {
			t.Errorf("peek output lacks %q:\n%s", want, out)
		}
	}
}
