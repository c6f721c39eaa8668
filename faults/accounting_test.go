package faults

import (
	"fmt"
	"sort"
	"strings"
	"testing"
)

// Dead-letter reasons hopper may write (README, "Dead-letter headers").
var legitReasons = map[string]bool{
	"max-attempts": true, "non-retriable": true, "expired": true, "too-early": true, "app-action": true, "app-crash": true,
}

// accounting is the end of a scenario: where every published id ended up.
type accounting struct {
	scenario  string
	published int
	acked     int // ids the app answered 2xx at least once
	dlq       int // distinct ids found in the DLQ
	lost      int // published ids neither acked nor in the DLQ

	// duplicates = extra2xx + ackedAndDLQ, the two kinds the line reports.
	extra2xx    int // 2xx answers beyond the first, summed over ids
	ackedAndDLQ int // ids answered 2xx that are also in the DLQ
	dlqCopies   int // DLQ messages beyond the first per id (not in duplicates)

	stuck    []string       // ids still in the work or a tier queue after settling
	lostIDs  []string       // sorted
	byReason map[string]int // DLQ messages by x-dead-letter-reason
	problems []string       // anything that must not happen, already explained

	okCount  map[string]int      // 2xx answers per id
	inDLQ    map[string][]string // reasons of the DLQ copies per id
	calls    map[string][]record // every request per id, in order
	maxTried map[string]int      // highest Hopper-Attempt the app saw per id
}

func (a *accounting) duplicates() int { return a.extra2xx + a.ackedAndDLQ }

// line is the one line a scenario prints.
func (a *accounting) line() string {
	return fmt.Sprintf("accounting: scenario=%s published=%d acked=%d dlq=%d lost=%d duplicates=%d",
		a.scenario, a.published, a.acked, a.dlq, a.lost, a.duplicates())
}

// account matches what was published against what the app answered and
// what was left in the queues.
func account(published map[string]bool, recs []record, left []drained, q queues) *accounting {
	a := &accounting{
		published: len(published),
		byReason:  map[string]int{},
		okCount:   map[string]int{},
		inDLQ:     map[string][]string{},
		calls:     map[string][]record{},
		maxTried:  map[string]int{},
	}
	unknown := map[string]int{}
	for _, r := range recs {
		if !published[r.ID] {
			unknown[r.ID]++
			continue
		}
		a.calls[r.ID] = append(a.calls[r.ID], r)
		a.maxTried[r.ID] = max(a.maxTried[r.ID], r.Attempt)
		if r.Status >= 200 && r.Status <= 299 {
			a.okCount[r.ID]++
		}
	}
	for id, n := range unknown {
		a.problems = append(a.problems, fmt.Sprintf("the app received %d request(s) for id %q, which was never published", n, id))
	}
	for _, d := range left {
		if !published[d.id] {
			a.problems = append(a.problems, fmt.Sprintf("%s holds id %q, which was never published", d.queue, d.id))
			continue
		}
		if d.queue != q.dlq() {
			a.stuck = append(a.stuck, d.id)
			continue
		}
		a.byReason[d.reason]++
		if !legitReasons[d.reason] {
			a.problems = append(a.problems, fmt.Sprintf("DLQ message %s has x-dead-letter-reason %q", d.id, d.reason))
		}
		a.inDLQ[d.id] = append(a.inDLQ[d.id], d.reason)
	}
	for id := range published {
		ok, dl := a.okCount[id] > 0, len(a.inDLQ[id]) > 0
		if ok {
			a.acked++
			a.extra2xx += a.okCount[id] - 1
		}
		if dl {
			a.dlq++
			a.dlqCopies += len(a.inDLQ[id]) - 1
		}
		if ok && dl {
			a.ackedAndDLQ++
		}
		if !ok && !dl {
			a.lost++
			a.lostIDs = append(a.lostIDs, id)
		}
	}
	sort.Strings(a.lostIDs)
	sort.Strings(a.stuck)
	if len(a.stuck) > 0 {
		a.problems = append(a.problems, fmt.Sprintf("%d message(s) still in the work or a tier queue after settling (counted as lost if not acked): %s",
			len(a.stuck), sample(a.stuck, 10)))
	}
	return a
}

// history is one id's story for a failure message: every request and
// every DLQ copy.
func (a *accounting) history(id string) string {
	var parts []string
	for _, r := range a.calls[id] {
		s := fmt.Sprint(r.Status)
		switch r.Status {
		case statusHang:
			s = "hang"
		case statusReset:
			s = "reset"
		case statusCrash:
			s = "crash"
		}
		parts = append(parts, fmt.Sprintf("a%d/r%d:%s", r.Attempt, r.Requeues, s))
	}
	h := "requests [" + strings.Join(parts, " ") + "]"
	if r := a.inDLQ[id]; len(r) > 0 {
		h += " dlq " + strings.Join(r, ",")
	}
	return h
}

// report logs the breakdown and fails the test for every problem and for
// every lost message; it prints the accounting line in any case.
func (a *accounting) report(t *testing.T) {
	t.Helper()
	fmt.Printf("%s\n", a.line())
	t.Logf("duplicates: %d extra 2xx answers + %d ids both answered 2xx and dead-lettered; %d extra DLQ copies (not counted above)",
		a.extra2xx, a.ackedAndDLQ, a.dlqCopies)
	t.Logf("DLQ by reason: %v", a.byReason)
	for _, p := range a.problems {
		t.Error(p)
	}
	if a.lost != 0 {
		var ex []string
		for _, id := range a.lostIDs[:min(len(a.lostIDs), 10)] {
			ex = append(ex, id+": "+a.history(id))
		}
		t.Errorf("LOST %d message(s): published and confirmed, never answered 2xx, not in the DLQ:\n  %s",
			a.lost, strings.Join(ex, "\n  "))
	}
}

func sample(ids []string, n int) string {
	if len(ids) <= n {
		return strings.Join(ids, " ")
	}
	return strings.Join(ids[:n], " ") + fmt.Sprintf(" … (%d more)", len(ids)-n)
}
