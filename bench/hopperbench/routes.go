package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The routes path asks what routing rules cost on the happy path. Hopper
// drains one backlog twice per run: plain (no rules) and with routesCount
// routes, half over a header and half over a field of the JSON body, each
// to a path of its own. The backlog is the same for both: JSON bodies and
// an event-type header, spread so that every route takes a share and a
// fifth of the messages match none (all rules evaluated, the body parsed).

// routesCount is the number of routes of the routed drain.
const routesCount = 8

// routeEvents is how many event kinds the backlog cycles through; those
// past routesCount match no route.
const routeEvents = 10

// routesWho names the series of the routes path.
func routesWho(routed bool) string {
	if routed {
		return "routed"
	}
	return "plain"
}

// routesYAML is the routing rules of the routed drain: routes 0-3 on the
// header, 4-7 on the body field, each posting to appPath/rN (the app
// answers any path below its message path alike).
func routesYAML() string {
	var b strings.Builder
	b.WriteString("routes:\n")
	for i := range routesCount {
		match := fmt.Sprintf(`headers["x-event-type"] == "e%d"`, i)
		if i >= routesCount/2 {
			match = fmt.Sprintf(`body.kind == "k%d"`, i)
		}
		fmt.Fprintf(&b, "  - {name: r%d, match: '%s', path: %s/r%d}\n", i, match, appPath, i)
	}
	return b.String()
}

// routesSpec is one drain of the routes path.
func (e *env) routesSpec(routed bool, run int) spec {
	s := e.newSpec(fmt.Sprintf("bench-routes-%s-%d", routesWho(routed), run), "hopper", modeOK)
	s.routed = routed
	s.routedBacklog = true
	return s
}

// routedness drains the routes backlog plain and routed once per run, in
// turn, so that what else the machine does hits both alike.
func (e *env) routedness() (map[string][]runResult, error) {
	out := map[string][]runResult{}
	for run := 1; run <= e.o.runs; run++ {
		for _, routed := range []bool{false, true} {
			res, err := e.drain(e.routesSpec(routed, run))
			if err != nil {
				return nil, fmt.Errorf("routes path, %s run %d: %w", routesWho(routed), run, err)
			}
			out[routesWho(routed)] = append(out[routesWho(routed)], res)
			logRun("routes", routesWho(routed), run, e.o.runs, res)
		}
	}
	return out, nil
}

// publishRoutedBacklog publishes n persistent JSON messages of about size
// bytes to queue, message i of event kind i mod routeEvents in both the
// x-event-type header and the body's kind field.
func publishRoutedBacklog(ctx context.Context, url, queue, prefix string, n, size int) (time.Duration, error) {
	pad := string(body(max(size-40, 0)))
	return publishEach(ctx, url, "", func(int) string { return queue }, n, func(i int) amqp.Publishing {
		k := strconv.Itoa(i % routeEvents)
		return amqp.Publishing{
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			MessageId:    prefix + strconv.Itoa(i),
			Headers:      amqp.Table{"x-event-type": "e" + k},
			Body:         []byte(`{"kind":"k` + k + `","seq":` + strconv.Itoa(i) + `,"pad":"` + pad + `"}`),
		}
	})
}

// printRoutes writes the routes path's table.
func (rep *report) printRoutes(w io.Writer, o *options) {
	fmt.Fprintf(w, "routes: one Hopper drains a happy backlog of %d JSON messages, plain and with %d routes (%d on a header, %d on a body field)\n",
		o.n, routesCount, routesCount/2, routesCount/2)
	fmt.Fprintf(w, "%-10s %9s %9s %9s %10s %8s\n", "form", "median/s", "min/s", "max/s", "cpu_s/100k", "rss_MiB")
	for _, routed := range []bool{false, true} {
		runs := rep.routes[routesWho(routed)]
		r := summarize(rates(runs))
		fmt.Fprintf(w, "%-10s %9.0f %9.0f %9.0f %10.2f %8.1f\n", routesWho(routed), r.med, r.min, r.max, consumerCPU(runs), maxHWM(runs))
	}
	fmt.Fprintln(w)
}

// routesLine is the routes path's summary line.
func (rep *report) routesLine() string {
	med := func(routed bool) float64 { return summarize(rates(rep.routes[routesWho(routed)])).med }
	h, plain := med(true), med(false)
	return fmt.Sprintf("bench: routes hopper=%.0f/s plain=%.0f/s ratio=%.3f", h, plain, h/plain)
}
