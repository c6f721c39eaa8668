package config_test

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hopper-sidecar/hopper/config"
)

// A negative duration is reported as given: "got 0s" for -5s sent the
// reader looking for a zero that was never written.
func TestNegativeDurationReportedAsGiven(t *testing.T) {
	for _, tc := range []struct{ key, value, want string }{
		{"app.timeout", "-5s", "app.timeout: must be positive, got -5s"},
		{"broker.heartbeat", "-1m30s", "broker.heartbeat: must be positive, got -1m30s"},
		{"broker.confirmTimeout", "-250ms", "broker.confirmTimeout: must be positive, got -250ms"},
		{"app.timeout", "0s", "app.timeout: must be positive, got 0s"},
	} {
		c := valid()
		if err := config.SetKey(&c, tc.key, tc.value); err != nil {
			t.Fatalf("--set %s=%s: %v", tc.key, tc.value, err)
		}
		mustContain(t, c.Validate(), tc.want)
	}
	c, err := parse(t, "queue:\n  name: q\napp:\n  timeout: \"-5s\"\n")
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, c.Validate(), "app.timeout: must be positive, got -5s")
}

func TestFormatDurationNegative(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-5 * time.Second:         "-5s",
		-90 * time.Second:        "-1m30s",
		-250 * time.Millisecond:  "-250ms",
		-1500 * time.Millisecond: "-1.5s",
	} {
		if got := config.FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
		back, err := config.ParseDuration(config.FormatDuration(d))
		if err != nil || back.D() != d {
			t.Errorf("FormatDuration(%v) does not parse back: %v %v", d, back, err)
		}
	}
}

// A config file that does not exist is named as such, still recognisable
// as a missing file to the caller.
func TestLoadMissingFileSaysNotFound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.yaml")
	_, _, err := config.Load(path, nil)
	if err == nil {
		t.Fatal("Load of a missing file succeeded")
	}
	if want := "config file " + path + " not found"; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %q does not start with %q", err, want)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("error %v is not fs.ErrNotExist", err)
	}
}
