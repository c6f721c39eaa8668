package batch

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// Content types of a batch request.
const (
	// ContentTypeJSON is Hopper's envelope: {"entries":[…]}, each entry
	// with the headers a single request would carry.
	ContentTypeJSON = "application/json"
	// ContentTypeCloudEvents is the CloudEvents batched content mode: a
	// JSON array of structured events.
	ContentTypeCloudEvents = "application/cloudevents-batch+json"
)

// Field is one header of an entry, as a single request would send it.
type Field struct{ Name, Value string }

// Entry is one message as written into a batch request.
type Entry struct {
	// ID names the entry in the app's answer: unique in the batch and
	// UTF-8 text (IDs), so that the app's answer names it exactly.
	ID string
	// Fields are the headers a request with this message alone would
	// carry, already within the forwarding limits.
	Fields      []Field
	ContentType string
	Body        []byte
}

// AppendJSON appends Hopper's envelope of entries to dst:
//
//	{"entries":[{"id":"…","headers":{"Hopper-Attempt":"1",…},
//	  "datacontenttype":"application/json","data":{…}}]}
//
// A body whose content type is JSON and that is JSON text (valid JSON,
// and UTF-8) is embedded as data; any other body goes as data_base64, so
// no byte is lost to a text encoding and the request stays JSON.
func AppendJSON(dst []byte, entries []Entry) []byte {
	dst = append(dst, `{"entries":[`...)
	for i, e := range entries {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"id":`...)
		dst = appendString(dst, e.ID)
		dst = append(dst, `,"headers":{`...)
		for j, f := range e.Fields {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, f.Name)
			dst = append(dst, ':')
			dst = appendString(dst, f.Value)
		}
		dst = append(dst, '}')
		dst = appendData(dst, e)
		dst = append(dst, '}')
	}
	return append(dst, "]}"...)
}

// AppendCloudEvents appends entries as a CloudEvents batch to dst: a JSON
// array of structured events. The ce-* fields become the event's
// attributes under their own names (ce-source → source), trace context
// keeps its names (the distributed tracing extension), and every other
// header becomes an extension attribute named by its letters and digits in
// lower case, as CloudEvents requires: Hopper-Attempt → hopperattempt. Two
// headers that map to the same name keep the first.
func AppendCloudEvents(dst []byte, entries []Entry) []byte {
	dst = append(dst, '[')
	seen := make(map[string]bool, 32)
	var name []byte
	for i, e := range entries {
		if i > 0 {
			dst = append(dst, ',')
		}
		clear(seen)
		dst = append(dst, `{"specversion":"1.0","id":`...)
		dst = appendString(dst, e.ID)
		seen["specversion"], seen["id"] = true, true
		seen["data"], seen["data_base64"], seen["datacontenttype"] = true, true, true
		for _, f := range e.Fields {
			name = attributeName(name[:0], f.Name)
			if len(name) == 0 || seen[string(name)] {
				continue
			}
			seen[string(name)] = true
			dst = append(dst, ',')
			dst = appendString(dst, string(name))
			dst = append(dst, ':')
			dst = appendString(dst, f.Value)
		}
		dst = appendData(dst, e)
		dst = append(dst, '}')
	}
	return append(dst, ']')
}

// attributeName is the CloudEvents attribute a header maps to.
func attributeName(dst []byte, header string) []byte {
	h := strings.ToLower(header)
	if rest, ok := strings.CutPrefix(h, "ce-"); ok {
		h = rest
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			dst = append(dst, c)
		}
	}
	return dst
}

// appendData appends the entry's content type and body members.
func appendData(dst []byte, e Entry) []byte {
	if e.ContentType != "" {
		dst = append(dst, `,"datacontenttype":`...)
		dst = appendString(dst, e.ContentType)
	}
	// json.Valid takes bytes that are not UTF-8 inside strings; JSON text
	// is UTF-8, and a strict parser refuses the whole request for them,
	// every neighbour with it.
	if IsJSON(e.ContentType) && utf8.Valid(e.Body) && json.Valid(e.Body) {
		dst = append(dst, `,"data":`...)
		return append(dst, e.Body...)
	}
	dst = append(dst, `,"data_base64":"`...)
	dst = base64.StdEncoding.AppendEncode(dst, e.Body)
	return append(dst, '"')
}

// IsJSON says whether a content type is JSON: application/json or a
// structured suffix +json, parameters aside.
func IsJSON(contentType string) bool {
	t, _, _ := strings.Cut(contentType, ";")
	t = strings.ToLower(strings.TrimSpace(t))
	return t == "application/json" || strings.HasSuffix(t, "+json")
}

// plain marks the bytes a JSON string holds as they are.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 0x7f; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// hexDigits are the digits of a byte written as \xHH.
const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. A byte that is not part of
// UTF-8 text is written as the four characters \xHH (the JSON string
// "\\xHH"), as asText writes it: the body stays valid JSON, which a strict
// parser requires to be UTF-8, and two values that differ only in such
// bytes still differ for the app (two messages' Hopper-Message-Id).
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		// The run of bytes that go as they are, in one append: header
		// values are mostly plain ASCII.
		j := i
		for j < len(s) && plain[s[j]] {
			j++
		}
		dst = append(dst, s[i:j]...)
		if i = j; i == len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c < 0x20 || c == 0x7f:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, '\\', '\\', 'x', hexDigits[s[i]>>4], hexDigits[s[i]&0xf])
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}

// asText is s as UTF-8 text: s itself when it is UTF-8, else s with each
// byte that is not part of UTF-8 text written as the four characters \xHH
// (lower-case hex digits), which is what Python's "backslashreplace"
// decoding makes of it. An entry id in this form is written into the
// request unchanged, so the app's answer can name it byte for byte.
func asText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, len(s)+12)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, '\\', 'x', hexDigits[s[i]>>4], hexDigits[s[i]&0xf])
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return string(b)
}
