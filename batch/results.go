package batch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hopper-sidecar/hopper/retry"
)

// The shapes of a results body the app may answer a batch with. Each names
// entries by the id their entry carried.
//
// Hopper's own, a status per entry with what a single response says in
// headers:
//
//	{"results":[{"id":"m-1","status":200},
//	            {"id":"m-2","status":503,"retryAfter":"5","action":"retry","error":"db down"}]}
//
// The partial batch response of AWS Lambda's queue event sources, the
// entries listed failed and every other one succeeded:
//
//	{"batchItemFailures":[{"itemIdentifier":"m-2"}]}
//
// The bulk subscribe response of Dapr, a status per entry:
//
//	{"statuses":[{"entryId":"m-1","status":"SUCCESS"},{"entryId":"m-2","status":"RETRY"},
//	             {"entryId":"m-3","status":"DROP"}]}
type answer struct {
	Results           *[]result  `json:"results"`
	BatchItemFailures *[]failure `json:"batchItemFailures"`
	Statuses          *[]status  `json:"statuses"`
}

type result struct {
	ID         *string         `json:"id"`
	Status     int             `json:"status"`
	RetryAfter json.RawMessage `json:"retryAfter"`
	Action     string          `json:"action"`
	Error      string          `json:"error"`
}

type failure struct {
	ItemIdentifier *string `json:"itemIdentifier"`
}

type status struct {
	EntryID *string `json:"entryId"`
	Status  string  `json:"status"`
}

// Why an entry is retried without a status of its own.
const (
	whyMissing   = "the app's answer to the batch has no result for this entry"
	whyListed    = "listed in batchItemFailures"
	whyRetry     = "status RETRY"
	whyDrop      = "status DROP"
	whyMalformed = "the app's answer to the batch could not be read: "
)

// Read turns the app's answer to a batch into one outcome per entry, in
// the order of ids. whole is the request's own outcome, as a single
// request's would be classified.
//
//   - Anything but a 2xx (a status, a timeout, the app away) is the
//     outcome of every entry: the outcome table applies to each.
//   - A 2xx with an empty body acks every entry.
//   - A 2xx with a results body gives each entry the result named by its
//     id; an entry without one is retried, never acked: the app has not
//     said it handled it.
//
// A body that cannot be read as one of the shapes retries every entry; the
// error says what was wrong, for the log.
func Read(whole retry.Outcome, body []byte, ids []string, now time.Time) ([]retry.Outcome, error) {
	outs := make([]retry.Outcome, len(ids))
	if whole.Kind != retry.Response || whole.Status < 200 || whole.Status > 299 || len(bytes.TrimSpace(body)) == 0 {
		for i := range outs {
			outs[i] = whole
		}
		return outs, nil
	}
	got, err := parse(whole, body, ids, now)
	if err != nil {
		why := whyMalformed + err.Error()
		for i := range outs {
			outs[i] = retried(whole, why)
		}
		return outs, err
	}
	for i, id := range ids {
		if o, ok := got[id]; ok {
			outs[i] = o
		} else {
			outs[i] = retried(whole, whyMissing)
		}
	}
	return outs, nil
}

// retried is the outcome of an entry the app did not handle: a failed
// attempt under the request's own 2xx status, which the DLQ copy records.
func retried(whole retry.Outcome, why string) retry.Outcome {
	return retry.Outcome{Kind: retry.Response, Status: whole.Status, Override: "retry", Error: why}
}

// parse reads a results body into outcomes by entry id. A result for an
// id the batch did not have is an error: the app answered some other
// request, or invented ids, and nothing it said can be trusted.
func parse(whole retry.Outcome, body []byte, ids []string, now time.Time) (map[string]retry.Outcome, error) {
	var a answer
	d := json.NewDecoder(bytes.NewReader(body))
	if err := d.Decode(&a); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if d.More() {
		return nil, errors.New("more than one JSON value")
	}
	shapes := 0
	for _, present := range []bool{a.Results != nil, a.BatchItemFailures != nil, a.Statuses != nil} {
		if present {
			shapes++
		}
	}
	switch shapes {
	case 0:
		return nil, errors.New(`none of "results", "batchItemFailures" or "statuses" is there`)
	case 1:
	default:
		return nil, errors.New(`more than one of "results", "batchItemFailures" and "statuses"`)
	}
	known := make(map[string]bool, len(ids))
	for _, id := range ids {
		known[id] = true
	}
	got := make(map[string]retry.Outcome, len(ids))
	put := func(id *string, o retry.Outcome, member string) error {
		switch {
		case id == nil:
			return fmt.Errorf("a result without %q", member)
		case !known[*id]:
			return fmt.Errorf("a result for %q, which is not in the batch", *id)
		}
		if _, dup := got[*id]; dup {
			return fmt.Errorf("two results for %q", *id)
		}
		got[*id] = o
		return nil
	}
	switch {
	case a.Results != nil:
		for _, r := range *a.Results {
			o, err := r.outcome(now)
			if err != nil {
				return nil, err
			}
			if err := put(r.ID, o, "id"); err != nil {
				return nil, err
			}
		}
	case a.BatchItemFailures != nil:
		// Only failures are listed: every entry not listed succeeded.
		ack := retry.Outcome{Kind: retry.Response, Status: whole.Status}
		for _, id := range ids {
			got[id] = ack
		}
		listed := make(map[string]bool, len(*a.BatchItemFailures))
		for _, f := range *a.BatchItemFailures {
			if f.ItemIdentifier == nil {
				return nil, errors.New(`a batch item failure without "itemIdentifier"`)
			}
			if !known[*f.ItemIdentifier] {
				return nil, fmt.Errorf("a batch item failure for %q, which is not in the batch", *f.ItemIdentifier)
			}
			listed[*f.ItemIdentifier] = true
		}
		for id := range listed {
			got[id] = retried(whole, whyListed)
		}
	case a.Statuses != nil:
		for _, s := range *a.Statuses {
			var o retry.Outcome
			switch s.Status {
			case "SUCCESS":
				o = retry.Outcome{Kind: retry.Response, Status: whole.Status}
			case "RETRY":
				o = retried(whole, whyRetry)
			case "DROP":
				// Nothing is dropped unseen: a message the app gives up on
				// goes to the dead-letter queue, where it can be looked at.
				o = retry.Outcome{Kind: retry.Response, Status: whole.Status, Override: "dlq", Error: whyDrop}
			default:
				return nil, fmt.Errorf("status %q (want SUCCESS, RETRY or DROP)", s.Status)
			}
			if err := put(s.EntryID, o, "entryId"); err != nil {
				return nil, err
			}
		}
	}
	return got, nil
}

// outcome is what a result of Hopper's shape says, as a single response
// with that status and headers would say it.
func (r result) outcome(now time.Time) (retry.Outcome, error) {
	if r.Status < 100 || r.Status > 599 {
		return retry.Outcome{}, fmt.Errorf("status %d (want 100-599)", r.Status)
	}
	// Entry: the request came with credentials the app took (it answered
	// 2xx), so a 401 here is about this message, not about Hopper.
	o := retry.Outcome{Kind: retry.Response, Status: r.Status, Override: r.Action, Entry: true}
	if r.Action != "" {
		if _, err := retry.ParseAction(r.Action); err != nil {
			return retry.Outcome{}, fmt.Errorf("action: %w", err)
		}
	}
	if len(r.RetryAfter) > 0 && string(r.RetryAfter) != "null" {
		var s string
		if err := json.Unmarshal(r.RetryAfter, &s); err != nil {
			// A number of seconds is taken as well as a string.
			var n json.Number
			if err := json.Unmarshal(r.RetryAfter, &n); err != nil {
				return retry.Outcome{}, fmt.Errorf("retryAfter %s (want seconds or an HTTP date)", r.RetryAfter)
			}
			s = n.String()
		}
		if s != "" {
			o.RetryAfter, o.HasRetryAfter = retry.ParseRetryAfter(s, now)
		}
	}
	if r.Status < 200 || r.Status > 299 {
		o.Error = "HTTP " + strconv.Itoa(r.Status)
		if r.Error != "" {
			o.Error += ": " + r.Error
		}
	}
	return o, nil
}
