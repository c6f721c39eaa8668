package main

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// The signed path asks what signing every request costs on the happy path:
// one Hopper drains the same backlog unsigned and with a Standard Webhooks
// secret (app.auth.standardWebhooks: one HMAC-SHA256 signature per
// request), in turn within each run.

// signedWho names the series of the signed path.
func signedWho(signed bool) string {
	if signed {
		return "signed"
	}
	return "plain"
}

// writeSigningSecret writes a Standard Webhooks secret into the bench's
// directory and returns its path.
func (e *env) writeSigningSecret() (string, error) {
	file := filepath.Join(e.dir, "whsec")
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("signing secret: %w", err)
	}
	if err := os.WriteFile(file, []byte("whsec_"+base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("signing secret: %w", err)
	}
	return file, nil
}

// signingYAML is the app.auth part of Hopper's config for a signed drain:
// keys under app, so it goes right after app's own.
func signingYAML(secretFile string) string {
	return fmt.Sprintf("  auth:\n    standardWebhooks:\n      secretFile: %q\n", secretFile)
}

// signedness drains the happy backlog unsigned and signed once per run,
// in turn, so that what else the machine does hits both alike.
func (e *env) signedness() (map[string][]runResult, error) {
	out := map[string][]runResult{}
	secret, err := e.writeSigningSecret()
	if err != nil {
		return nil, err
	}
	e.signSecret = secret
	drain := func(who, kind string, run int, signed bool) error {
		s := e.newSpec(fmt.Sprintf("bench-signed-%s-%d", who, run), kind, modeOK)
		if signed {
			s.signingSecret = secret
		}
		res, err := e.drain(s)
		if err != nil {
			return fmt.Errorf("signed path, %s run %d: %w", who, run, err)
		}
		out[who] = append(out[who], res)
		logRun("signed", who, run, e.o.runs, res)
		return nil
	}
	for run := 1; run <= e.o.runs; run++ {
		for _, signed := range []bool{false, true} {
			if err := drain(signedWho(signed), "hopper", run, signed); err != nil {
				return nil, err
			}
		}
		if !e.o.rawSigned {
			continue
		}
		if err := drain("raw", "raw", run, false); err != nil {
			return nil, err
		}
		if err := drain("rawsigned", "rawsigned", run, false); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// printSigned writes the signed path's table.
func (rep *report) printSigned(w io.Writer, o *options) {
	fmt.Fprintf(w, "signed: one Hopper drains a happy backlog of %d messages, unsigned and with one Standard Webhooks secret\n", o.n)
	fmt.Fprintf(w, "%-10s %9s %9s %9s %10s %8s\n", "form", "median/s", "min/s", "max/s", "cpu_s/100k", "rss_MiB")
	for _, who := range []string{signedWho(false), signedWho(true), "raw", "rawsigned"} {
		runs := rep.signed[who]
		if len(runs) == 0 {
			continue
		}
		r := summarize(rates(runs))
		fmt.Fprintf(w, "%-10s %9.0f %9.0f %9.0f %10.2f %8.1f\n", who, r.med, r.min, r.max, consumerCPU(runs), maxHWM(runs))
	}
	fmt.Fprintln(w)
}

// signedLine is the signed path's summary line: ratio is signed over
// unsigned throughput, cpu_ratio the same for Hopper's CPU per message.
func (rep *report) signedLine() string {
	med := func(signed bool) float64 { return summarize(rates(rep.signed[signedWho(signed)])).med }
	cpu := func(signed bool) float64 { return consumerCPU(rep.signed[signedWho(signed)]) }
	h, plain := med(true), med(false)
	return fmt.Sprintf("bench: signed hopper=%.0f/s plain=%.0f/s ratio=%.3f cpu_ratio=%.3f", h, plain, h/plain, cpu(true)/cpu(false))
}

// signedRawLine is the raw loop's signed and unsigned drains (--raw-signed)
// in the shape of signedLine: what signing costs a loop with no Hopper in
// it, on the same machine in the same run.
func (rep *report) signedRawLine() string {
	raw, signed := rep.signed["raw"], rep.signed["rawsigned"]
	if len(raw) == 0 || len(signed) == 0 {
		return ""
	}
	r, s := summarize(rates(raw)).med, summarize(rates(signed)).med
	return fmt.Sprintf("signed-raw: signed=%.0f/s plain=%.0f/s ratio=%.3f cpu_ratio=%.3f", s, r, s/r, consumerCPU(signed)/consumerCPU(raw))
}
