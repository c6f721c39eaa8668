package batch

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// strictJSON decodes b as a strict JSON parser does: JSON text is UTF-8,
// and other bytes are refused (Python's json.loads, a Node.js TextDecoder
// with fatal set), where encoding/json alone would replace them.
func strictJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if !utf8.Valid(b) {
		t.Fatalf("the request is not UTF-8, so not JSON: %q", b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b)
	}
}

// echo is an app that reads a batch request strictly and answers each
// entry with the status statuses gives its position, naming it by the id
// it read.
func echo(t *testing.T, request []byte, statuses []int) []byte {
	t.Helper()
	var req struct {
		Entries []struct {
			ID string `json:"id"`
		} `json:"entries"`
	}
	strictJSON(t, request, &req)
	type result struct {
		ID     string `json:"id"`
		Status int    `json:"status"`
	}
	var res struct {
		Results []result `json:"results"`
	}
	for i, e := range req.Entries {
		res.Results = append(res.Results, result{ID: e.ID, Status: statuses[i]})
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestIDsNotUTF8: message ids that are not UTF-8, two of them differing
// only in those bytes, go out in a form the app echoes unchanged, and each
// entry's result settles its own message.
func TestIDsNotUTF8(t *testing.T) {
	base := []string{"m\xff", "m\xfe", "ok", "m\xff", "caf\xc3\xa9\xe9", `m\xff`}
	ids := IDs(len(base), func(i int) string { return base[i] })
	want := []string{`m\xff`, `m\xfe`, "ok", `m\xff#2`, `café\xe9`, `m\xff#3`}
	if !slices.Equal(ids, want) {
		t.Errorf("ids %q, want %q", ids, want)
	}
	entries := make([]Entry, len(ids))
	for i, id := range ids {
		entries[i] = Entry{ID: id, Fields: []Field{{"Hopper-Message-Id", base[i]}}, ContentType: "text/plain", Body: []byte("b")}
	}
	statuses := []int{200, 503, 422, 429, 204, 410}
	outs, err := Read(ok200(), echo(t, AppendJSON(nil, entries), statuses), ids, now)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	for i, o := range outs {
		if o.Status != statuses[i] || o.Override != "" {
			t.Errorf("entry %q: %+v, want its own status %d", ids[i], o, statuses[i])
		}
	}
}

// TestAppendNotUTF8: a header value that is not UTF-8 keeps its bytes as
// \xHH, as the entry id does, so two messages whose ids differ only there
// still differ in Hopper-Message-Id.
func TestAppendNotUTF8(t *testing.T) {
	entries := []Entry{
		{ID: `m\xff`, Fields: []Field{{"Hopper-Message-Id", "m\xff"}, {"Hopper-Header-Note", "caf\xe9 \\ ok"}}},
		{ID: `m\xfe`, Fields: []Field{{"Hopper-Message-Id", "m\xfe"}}},
	}
	var got struct {
		Entries []struct {
			ID      string            `json:"id"`
			Headers map[string]string `json:"headers"`
		} `json:"entries"`
	}
	strictJSON(t, AppendJSON(nil, entries), &got)
	for i, want := range []map[string]string{
		{"Hopper-Message-Id": `m\xff`, "Hopper-Header-Note": `caf\xe9 \ ok`},
		{"Hopper-Message-Id": `m\xfe`},
	} {
		e := got.Entries[i]
		if e.ID != entries[i].ID || !maps.Equal(e.Headers, want) {
			t.Errorf("entry %d: id %q headers %q, want id %q headers %q", i, e.ID, e.Headers, entries[i].ID, want)
		}
	}
	var ce []map[string]any
	strictJSON(t, AppendCloudEvents(nil, entries), &ce)
	if ce[0]["id"] != `m\xff` || ce[0]["hopperheadernote"] != `caf\xe9 \ ok` || ce[1]["id"] != `m\xfe` {
		t.Errorf("CloudEvents batch: %v", ce)
	}
}

// TestJSONBodyNotUTF8: a JSON body holding bytes that are not UTF-8 is
// no JSON text a strict parser takes, so it goes as data_base64, byte for
// byte, and the request stays JSON for its neighbours' sake.
func TestJSONBodyNotUTF8(t *testing.T) {
	bad := []byte("{\"note\":\"caf\xe9\"}")
	if !json.Valid(bad) {
		t.Fatal("encoding/json takes this body; the test needs one it takes")
	}
	entries := []Entry{
		{ID: "m-1", ContentType: "application/json", Body: bad},
		{ID: "m-2", ContentType: "application/json", Body: []byte(`{"note":"café"}`)},
	}
	var got struct {
		Entries []struct {
			Data       json.RawMessage `json:"data"`
			DataBase64 *string         `json:"data_base64"`
		} `json:"entries"`
	}
	strictJSON(t, AppendJSON(nil, entries), &got)
	if e := got.Entries[0]; e.Data != nil || e.DataBase64 == nil {
		t.Fatalf("body not UTF-8: data %s, want data_base64 only", e.Data)
	} else if body, err := base64.StdEncoding.DecodeString(*e.DataBase64); err != nil || string(body) != string(bad) {
		t.Fatalf("data_base64 %q: %q, %v", *e.DataBase64, body, err)
	}
	if e := got.Entries[1]; string(e.Data) != `{"note":"café"}` || e.DataBase64 != nil {
		t.Fatalf("UTF-8 JSON body: data %s, want it inline", e.Data)
	}
	var ce []map[string]any
	strictJSON(t, AppendCloudEvents(nil, entries), &ce)
	if _, inline := ce[0]["data"]; inline || ce[0]["data_base64"] != base64.StdEncoding.EncodeToString(bad) {
		t.Fatalf("CloudEvents batch, body not UTF-8: %v", ce[0])
	}
	if !strings.Contains(string(AppendCloudEvents(nil, entries[1:])), `"data":{"note":"café"}`) {
		t.Fatal("CloudEvents batch: a UTF-8 JSON body is no longer inline")
	}
}
