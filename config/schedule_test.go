package config_test

import (
	"testing"
	"time"
)

func TestScheduleValidation(t *testing.T) {
	cases := []validationCase{
		{"schedule: {enabled: true}", ""},
		{"schedule: {enabled: true, step: 500ms, maxDelay: 1h, pastMax: longest}", ""},
		{"schedule: {pastMax: later}", "schedule.pastMax: must be dlq or longest"},
		{"schedule: {enabled: true, step: 0s}", "schedule.step: must be at least 1ms"},
		{"schedule: {enabled: true, step: 1m, maxDelay: 30s}", "schedule.maxDelay: must be at least schedule.step"},
		{"schedule: {enabled: true, step: 1ms, maxDelay: 24h}", "takes 27 parking queues, more than 24"},
		{"schedule: {enabled: true, step: 1m, maxDelay: 1000h}", "schedule.maxDelay: must be at most 596h"},
		{"schedule: {enabled: true, step: 5}", "schedule.step"},
		{"schedule: {enabled: true}\ntopology: {parkQueue: parked}", "topology.parkQueue: template must contain {delay}"},
		{"schedule: {enabled: true}\ntopology: {parkQueue: \"{queue}.retry.{delay}\"}", "topology.parkQueue: must differ from topology.retryQueue"},
		// Off, a parking template is never used.
		{"topology: {parkQueue: parked}", ""},
	}
	checkValidation(t, cases)
}

func TestScheduleDefaults(t *testing.T) {
	c, err := parse(t, "queue: {name: q}\nschedule: {enabled: true}\n")
	if err != nil {
		t.Fatal(err)
	}
	steps := c.ParkSteps()
	if len(steps) != 17 || steps[0] != time.Second || steps[16] != 65536*time.Second {
		t.Fatalf("default parking steps %v", steps)
	}
}
