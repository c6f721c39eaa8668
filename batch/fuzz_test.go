package batch

import (
	"testing"

	"github.com/hopper-sidecar/hopper/retry"
)

// FuzzRead: whatever the app answers, every entry gets an outcome, and an
// answer that cannot be read acks nothing.
func FuzzRead(f *testing.F) {
	for _, s := range []string{
		``, `{"results":[{"id":"a","status":200}]}`, `{"batchItemFailures":[{"itemIdentifier":"b"}]}`,
		`{"statuses":[{"entryId":"a","status":"DROP"}]}`, `{"results":[{"id":"a","status":503,"retryAfter":"Wed, 21 Oct 2015 07:28:00 GMT"}]}`,
		`{"results":null}`, `[]`, `{"results":[{"id":"a","status":1e400}]}`,
	} {
		f.Add([]byte(s), 200)
	}
	ids := []string{"a", "b", "a#2"}
	f.Fuzz(func(t *testing.T, body []byte, status int) {
		whole := retry.Outcome{Kind: retry.Response, Status: status}
		outs, err := Read(whole, body, ids, now)
		if len(outs) != len(ids) {
			t.Fatalf("%d outcomes for %d entries", len(outs), len(ids))
		}
		if err == nil {
			return
		}
		for i, o := range outs {
			if a := decide(t, o); a != retry.Retry {
				t.Fatalf("unreadable answer %q: entry %d decided %s", body, i, a)
			}
		}
	})
}
