package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hopper-sidecar/hopper/broker"
	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/console"
	"github.com/hopper-sidecar/hopper/dlqconn"
	"github.com/hopper-sidecar/hopper/topology"
)

func newDLQConsoleCmd() *cobra.Command {
	var (
		cf              configFlags
		listen          string
		allowActions    bool
		readsNeedToken  bool
		allowRemoteRead bool
		tokenFile       string
		traceURL        string
		rate            float64
		maxReplays      int
		sampleEvery     time.Duration
		scanOnStart     bool
	)
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Web console of every DLQ of the config: failure groups, messages, replay, edit, transform, export, purge",
		Long: `Serves a web console for the DLQs of the config (every subscription's; a
DLQ shared by several queues, such as partitions', once):

  Overview        depth, messages arriving per minute (sampled while the
                  console runs), oldest and newest dead-letter time, a chart
                  of the depth over the console's lifetime
  Failure groups  the messages of a DLQ grouped by reason, final status,
                  original routing key and the fingerprint of x-final-error
                  (ids, uuids, hex, numbers and timestamps masked): count,
                  first and last time, share, a sample
  Message         every header (Hopper's explained), the body as JSON, text
                  or hex, the attempt history, a trace link (--trace-url)
  Activity        every scan and action: who, when, how many

Each DLQ is scanned at start and on request: one pass over every message
present, as stats makes (a quorum DLQ rotated, a classic one handed back in
place), keeping headers-derived groups only; bodies are read when a
message is opened.

A quorum DLQ cannot be read without rotating it: each message is copied to
the tail, confirmed, then the original acked, and the DLQ is held for as
long as the pass takes. That changes the DLQ, so its scan and its message
views are actions: made only with --allow-actions and the token (401
without it), never by a read-only console (403), which shows its depth
only. A classic DLQ's messages are handed back in place, so reading it
needs no token.

Read-only unless --allow-actions. Then a group, or one message, can be
replayed (the same run as hopper dlq replay: exclusive owner, publish,
confirm, then ack; --max-replays; paced at the rate given, cancellable),
exported as JSON Lines (the export format) or purged after typing the
group's size. One message can be edited and retried from its view: its
body (checked as JSON when its content type is JSON) and application
headers changed, never Hopper's history headers; the message as it was is
published to <dlq>.originals and confirmed before the edited copy goes,
which records who edited it, when, and the digest of the original body.
A group can be transformed before it is replayed (a JSON Patch over
{"body": ..., "headers": {...}}, as replay --transform), with a preview of
its first five messages before and after and a dry run that counts what it
would change; a message the patch fails on stays in the DLQ as it was. A
replay can go to another queue, or an exchange and routing key, checked to
exist before anything moves, and in batches (a size, and a pause or the
operator's Next between batches). Every replay run names itself on its
copies (x-hopper-replay-run): messages that fail again are grouped per run,
and the activity list shows per run how many came back. A group can be
marked ignored: it stays in the DLQ, out of the overview's attention
figure; the marks are kept on the broker in <dlq>.console-marks (a classic
queue holding one message, declared by the first mark), so every console
of the DLQ shows them and a restart keeps them; deleting that queue clears
them. Every action needs the token in the X-Hopper-Token header:
--token-file holds one per line (LABEL:TOKEN, or TOKEN alone), else one is
generated and printed once at start. Actions are POST only.

Every API call, reads included, needs the header Hopper-Console: 1, which
the console's page sends on each call (a script sends it too: curl -H
'Hopper-Console: 1'), and is refused (403) when Sec-Fetch-Site or Origin
shows another site or origin sent it: another site's page cannot make the
browser call the console, not even with an <img src>. The page loads
nothing from outside the binary.

It listens on 127.0.0.1:8089 by default and then answers only to localhost
names, so that a web page cannot reach it through a DNS name of its own
pointed at 127.0.0.1; reach it in Kubernetes with

  kubectl port-forward deploy/RELEASE-hopper-console 8089

On an address that is not loopback (--listen 0.0.0.0:8089) that check
cannot hold, and the console refuses to start unless --reads-need-token
(every API call, reads included, needs the token: 401 without it) or
--allow-remote-read (whoever reaches the address may read the DLQs).

Exit status 0 after SIGINT or SIGTERM; 64 for a bad flag or an address it
cannot listen on; 65 for a bad config. A DLQ that does not exist or a broker
that cannot be reached is shown on the overview, and the console keeps running.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if rate < 0 {
				return usage(fmt.Errorf("--rate %g: must not be negative", rate))
			}
			if maxReplays < 0 {
				return usage(fmt.Errorf("--max-replays %d: must not be negative", maxReplays))
			}
			if sampleEvery < time.Second {
				return usage(fmt.Errorf("--sample-every %s: want at least 1s", sampleEvery))
			}
			if traceURL != "" {
				if err := console.CheckTraceURL(traceURL); err != nil {
					return usage(fmt.Errorf("--trace-url: %w", err))
				}
			}
			cfg, err := cf.load(cmd)
			if err != nil {
				return err
			}
			log := newLogger(cfg.Log, cmd.ErrOrStderr())
			o := console.Options{
				DLQs:         consoleDLQs(&cfg),
				AllowActions: allowActions,
				TraceURL:     traceURL,
				Rate:         rate,
				MaxReplays:   maxReplays,
				SampleEvery:  sampleEvery,
				ScanOnStart:  scanOnStart,
				Log:          log,
				Broker: &dlqconn.Opener{
					Opts:           broker.ConfigOptions(cfg.Broker, log, "hopper-dlq-console"),
					ConfirmTimeout: cfg.Broker.ConfirmTimeout.D(),
					Log:            log,
				},
			}
			if maxReplays == 0 {
				o.MaxReplays = -1 // no cap, as replay's --max-replays 0
			}
			stderr := cmd.ErrOrStderr()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return usage(fmt.Errorf("--listen: %w", err))
			}
			host, _, _ := net.SplitHostPort(ln.Addr().String())
			ip := net.ParseIP(host)
			o.LoopbackOnly = ip != nil && ip.IsLoopback()
			if !o.LoopbackOnly && !readsNeedToken && !allowRemoteRead {
				ln.Close()
				return usage(fmt.Errorf("--listen %s: %s is not a loopback address; there the console cannot tell a web page that reaches it through a DNS name of its own from the operator's browser, so any page could read dead-letter bodies through it: "+
					"add --reads-need-token (every API call then needs the token), or --allow-remote-read if whoever reaches this address may read the DLQs", listen, host))
			}
			o.ReadsNeedToken = readsNeedToken
			if allowActions || readsNeedToken {
				if tokenFile != "" {
					if o.Tokens, err = readTokens(tokenFile); err != nil {
						ln.Close()
						return usage(fmt.Errorf("--token-file: %w", err))
					}
				} else {
					secret, err := newToken()
					if err != nil {
						ln.Close()
						return err
					}
					o.Tokens = []console.Token{{Label: "generated token", Secret: secret}}
					what := "actions allowed with this token"
					if readsNeedToken {
						what = "every API call needs this token"
					}
					fmt.Fprintf(stderr, "console: %s (shown once): %s\n", what, secret)
				}
			}
			srv, err := console.New(o)
			if err != nil {
				ln.Close()
				return usage(err)
			}
			ctx, stop := signalContext(cmd.Context(), exitTempFail, toolStopping(stderr), nil)
			defer stop()
			hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
			names := make([]string, len(o.DLQs))
			for i, d := range o.DLQs {
				names[i] = d.Name
			}
			mode := "read-only"
			if allowActions {
				mode = "actions allowed"
			}
			if readsNeedToken {
				mode += ", every call with the token"
			}
			fmt.Fprintf(stderr, "console: listening on http://%s/ (%s) for %s\n", ln.Addr(), mode, strings.Join(names, ", "))
			served := make(chan error, 1)
			go func() { served <- hs.Serve(ln) }()
			ran := make(chan struct{})
			go func() { defer close(ran); srv.Run(ctx) }()
			select {
			case err = <-served:
			case <-ctx.Done():
			}
			stop()
			shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if serr := hs.Shutdown(shutCtx); serr != nil && err == nil {
				err = serr
			}
			<-ran
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("console: %w", err)
			}
			return nil
		},
	}
	cf.user = forBroker
	cf.register(cmd.Flags())
	fs := cmd.Flags()
	fs.StringVar(&listen, "listen", "127.0.0.1:8089", "address to serve the console on (host:port); keep it on loopback and reach it through a port-forward (elsewhere: --reads-need-token or --allow-remote-read)")
	fs.BoolVar(&allowActions, "allow-actions", false, "allow replay, export and purge, and the scan and message views of a quorum DLQ (with the token); read-only without it")
	fs.BoolVar(&readsNeedToken, "reads-need-token", false, "every API call, reads included, needs the token; what lets --listen leave loopback")
	fs.BoolVar(&allowRemoteRead, "allow-remote-read", false, "start on an address that is not loopback without --reads-need-token: whoever reaches it, and any web page through a DNS name pointed at it, can read the DLQs")
	fs.StringVar(&tokenFile, "token-file", "", "file of tokens (for actions, and for reads with --reads-need-token), one per line: LABEL:TOKEN or TOKEN (default: one generated and printed at start)")
	fs.StringVar(&traceURL, "trace-url", "", "trace link template for x-trace-id, e.g. http://jaeger:16686/trace/{traceId}")
	fs.Float64Var(&rate, "rate", 100, "default replay rate in messages per second (0: no cap); each replay may set its own")
	fs.IntVar(&maxReplays, "max-replays", 5, "keep messages already replayed this many times (x-replay-count) in the DLQ; 0: no cap")
	fs.DurationVar(&sampleEvery, "sample-every", 10*time.Second, "interval between depth samples for the arrival rate and the chart")
	fs.BoolVar(&scanOnStart, "scan-on-start", true, "scan every DLQ at start (false: only when asked, with Rescan)")
	return cmd
}

// consoleDLQs are the DLQs of every subscription of the config, each once,
// with the work queues that dead-letter into it.
func consoleDLQs(cfg *config.Config) []console.DLQ {
	partitioned := map[string]bool{}
	var out []console.DLQ
	at := map[string]int{}
	for _, e := range cfg.SubscriptionConfigs() {
		if e.Topology.Partitions.On() {
			partitioned[e.Queue.Name] = true
		}
		name := topology.FromConfig(&e).DLQ.Name
		i, ok := at[name]
		if !ok {
			i = len(out)
			at[name] = i
			out = append(out, console.DLQ{Name: name})
		}
		out[i].Queues = append(out[i].Queues, e.Queue.Name)
	}
	if len(partitioned) > 0 {
		t := &target{partitioned: partitioned}
		for i := range out {
			out[i].Through = t.through
		}
	}
	return out
}

// readTokens reads a token file: one token per line, LABEL:TOKEN or TOKEN
// alone (labelled by its line); blank lines and # comments are skipped.
func readTokens(path string) ([]console.Token, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []console.Token
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		label, secret, ok := strings.Cut(line, ":")
		if !ok {
			label, secret = fmt.Sprintf("token of line %d", n), line
		}
		label, secret = strings.TrimSpace(label), strings.TrimSpace(secret)
		if len(secret) < 16 {
			return nil, fmt.Errorf("%s line %d: token shorter than 16 characters", path, n)
		}
		out = append(out, console.Token{Label: label, Secret: secret})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no token", path)
	}
	return out, nil
}

// newToken is 32 random bytes, URL-safe.
func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
