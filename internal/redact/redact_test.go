package redact

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"http://app:8080/msg", "http://app:8080/msg"},
		{"http://user:s3cret@app:8080/msg?x=1", "http://REDACTED:REDACTED@app:8080/msg?x=1"},
		{"https://tok3n@app/", "https://REDACTED@app/"},
		{"http://us%40er:p%40ss@app/x", "http://REDACTED:REDACTED@app/x"},
		{"http://user:s3cret@app:port/msg", "http://REDACTED@app:port/msg"}, // does not parse
		{"http://user:s3cret@[::1/msg", "http://REDACTED@[::1/msg"},         // does not parse
		{"not a url", "not a url"},
	} {
		if got := URL(c.in); got != c.want {
			t.Errorf("URL(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestError(t *testing.T) {
	raw := "http://hopper:pa%24%24word@app:bad/x"
	_, perr := url.Parse(raw)
	if perr == nil || !strings.Contains(perr.Error(), "pa%24%24word") {
		t.Fatalf("the parser's error no longer quotes the URL: %v", perr)
	}
	sentinel := errors.New("refused")
	for _, err := range []error{
		perr,
		fmt.Errorf("dial: %w (as hopper with pa$$word)", sentinel),
	} {
		got := Error(err, raw)
		for _, secret := range []string{"pa%24%24word", "pa$$word", "hopper"} {
			if strings.Contains(got.Error(), secret) {
				t.Errorf("%q holds %q", got, secret)
			}
		}
		if !errors.Is(got, err) {
			t.Errorf("%v no longer wraps the error", got)
		}
	}
	if e := errors.New("no credentials here"); Error(e, "http://app/") != e {
		t.Error("an error without credentials is changed")
	}
	if Error(nil, raw) != nil {
		t.Error("nil is not nil")
	}
}
