package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/hopper-sidecar/hopper/config"
	"github.com/hopper-sidecar/hopper/retry"
)

// valid is the default config with the one required key set.
func valid() config.Config {
	c := config.Default()
	c.Queue.Name = "orders"
	return c
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hopper.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// parse parses doc over the defaults.
func parse(t *testing.T, doc string) (config.Config, error) {
	t.Helper()
	c := config.Default()
	err := config.Parse([]byte(doc), &c)
	return c, err
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// mustContain fails unless every want is a substring of err's text.
func mustContain(t *testing.T, err error, wants ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one mentioning %q", wants)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not mention %q:\n%v", w, err)
		}
	}
}

func TestDefaultsAreValidOnceQueueNameIsSet(t *testing.T) {
	c := valid()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults with queue.name set: %v", err)
	}

	d := config.Default()
	err := d.Validate()
	mustContain(t, err, "queue.name: required")
	if n := len(strings.Split(err.Error(), "\n")); n != 1 {
		t.Errorf("defaults without queue.name: %d problems, want only queue.name:\n%v", n, err)
	}

	// The documented defaults.
	want := []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute, 30 * time.Minute}
	if got := c.AllTiers(); !slices.Equal(got, want) {
		t.Errorf("default tiers %v, want %v", got, want)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"retry.maxAttempts", c.Retry.MaxAttempts, config.Attempts(10)},
		{"consumer.prefetch", c.Consumer.Prefetch, 0},
		{"app.timeout", c.App.Timeout.D(), 30 * time.Second},
		{"shutdown.grace", c.Shutdown.Grace.D(), 25 * time.Second},
		{"requeue.maxHold", c.Requeue.MaxHold.D(), 5 * time.Second},
		{"requeue.maxRequeues", c.Requeue.MaxRequeues, 100},
		{"admin.listen", c.Admin.Listen, ":9090"},
		{"topology.retryQueue", c.Topology.RetryQueue, "{queue}.retry.{delay}"},
		{"topology.dlq", c.Topology.DLQ, "{queue}.dlq"},
		{"topology.declare", c.Topology.Declare, true},
		{"queue.type", c.Queue.Type, "classic"},
		{"log.format", c.Log.Format, "json"},
		{"app.forward.maxHeaders", c.App.Forward.MaxHeaders, 90},
		{"app.forward.maxHeaderBytes", c.App.Forward.MaxHeaderBytes, 7168},
		{"app.forward.maxValueBytes", c.App.Forward.MaxValueBytes, 4096},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("default %s = %v, want %v", ck.name, ck.got, ck.want)
		}
	}
}

func TestParseUnknownKeys(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want []string // "path: unknown key (line N)"
	}{
		{"top level", "queue:\n  name: q\nqeueu:\n  name: q\n", []string{"qeueu: unknown key (line 3)"}},
		{"nested", "broker:\n  tls:\n    caFiel: /x\n", []string{"broker.tls.caFiel: unknown key (line 3)"}},
		{"inside a policy", "retry:\n  policies:\n    - name: a\n      match:\n        type: t\n        typo: x\n",
			[]string{"retry.policies[0].match.typo: unknown key (line 6)"}},
		{"second policy", "retry:\n  policies:\n    - name: a\n      match: {type: t}\n    - name: b\n      tierz: [\"1s\"]\n      match: {type: u}\n",
			[]string{"retry.policies[1].tierz: unknown key (line 6)"}},
		{"several", "queue:\n  name: q\n  nmae: q\nlog:\n  levle: debug\n",
			[]string{"queue.nmae: unknown key (line 3)", "log.levle: unknown key (line 5)"}},
		{"snake case is not the key", "retry:\n  max_attempts: 3\n", []string{"retry.max_attempts: unknown key (line 2)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.doc)
			mustContain(t, err, tc.want...)
			if n := len(strings.Split(errText(err), "\n")); n != len(tc.want) {
				t.Errorf("%d problems reported, want %d:\n%v", n, len(tc.want), err)
			}
		})
	}
}

func TestParseKeepsGoodValuesNextToUnknownKeys(t *testing.T) {
	c, err := parse(t, "queue:\n  name: kept\n  bogus: 1\nconsumer:\n  prefetch: 7\n")
	mustContain(t, err, "queue.bogus: unknown key")
	if c.Queue.Name != "kept" || c.Consumer.Prefetch != 7 {
		t.Errorf("known keys beside an unknown one not decoded: name=%q prefetch=%d", c.Queue.Name, c.Consumer.Prefetch)
	}
}

func TestParseEmptyAndInvalidDocuments(t *testing.T) {
	for _, doc := range []string{"", "\n", "# only a comment\n"} {
		c, err := parse(t, doc)
		if err != nil {
			t.Errorf("%q: %v", doc, err)
		}
		if !reflect.DeepEqual(c, config.Default()) {
			t.Errorf("%q changed the defaults", doc)
		}
	}
	for _, doc := range []string{"queue: [\n", "- a\n- b\n", "queue: [1]\n", "\tqueue: x\n"} {
		if _, err := parse(t, doc); err == nil {
			t.Errorf("%q: accepted", doc)
		}
	}
}

// TestEveryProblemAtOnce is what `hopper config validate` does: load the
// file, then validate, and show every problem in one error.
func TestEveryProblemAtOnce(t *testing.T) {
	path := writeFile(t, `
queue:
  type: fifo
broker:
  heartbeat: 30
consumer:
  prefetch: 10
  typo: true
retry:
  maxAttempts: 0
log:
  level: loud
`)
	cfg, warnings, lerr := config.Load(path, nil)
	if len(warnings) != 0 {
		t.Errorf("warnings %v", warnings)
	}
	verr := cfg.Validate()
	err := errors.Join(lerr, verr)
	mustContain(t, err,
		"consumer.typo: unknown key (line 8)",
		"broker.heartbeat: duration must be a string with a unit",
		"retry.maxAttempts: invalid attempt limit",
		`queue.type: must be classic, quorum or stream, got "fifo"`,
		`log.level: must be debug, info, warn or error, got "loud"`,
		"queue.name: required",
	)
	// The good value beside the bad ones was still applied.
	if cfg.Consumer.Prefetch != 10 {
		t.Errorf("consumer.prefetch = %d, want 10", cfg.Consumer.Prefetch)
	}
	if n := len(strings.Split(err.Error(), "\n")); n != 6 {
		t.Errorf("%d lines, want exactly the 6 problems:\n%v", n, err)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := config.Default()
	c.Broker.URLs = []string{"http://x/"}
	c.Queue.Type = "fifo"
	c.Consumer.Prefetch = -1
	c.Retry.Tiers = nil
	c.Log.Format = "xml"
	err := c.Validate()
	mustContain(t, err, "broker.urls[0]", "queue.name", "queue.type", "consumer.prefetch", "retry.tiers", "log.format")
}

func TestValidateRules(t *testing.T) {
	d := func(s string) config.Duration {
		v, err := config.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	cases := []struct {
		name string
		mod  func(*config.Config)
		want string // "" = valid
	}{
		{"no broker", func(c *config.Config) { c.Broker.URLs = nil }, "broker.urls: at least one"},
		{"http broker", func(c *config.Config) { c.Broker.URLs = []string{"amqp://a/", "http://b/"} }, `broker.urls[1]: scheme must be amqp or amqps, got "http"`},
		{"amqps ok", func(c *config.Config) { c.Broker.URLs = []string{"amqps://u:p@a:5671/vh"} }, ""},
		{"broker without host", func(c *config.Config) { c.Broker.URLs = []string{"amqp:///"} }, "broker.urls[0]: missing host"},
		{"missing password file", func(c *config.Config) { c.Broker.PasswordFile = "/nonexistent/pw" }, "broker.passwordFile:"},
		{"cert without key", func(c *config.Config) { c.Broker.TLS.CertFile = os.Args[0] }, "broker.tls: certFile and keyFile must be given together"},
		{"zero heartbeat", func(c *config.Config) { c.Broker.Heartbeat = 0 }, "broker.heartbeat: must be positive"},
		{"reconnect max < min", func(c *config.Config) { c.Broker.ReconnectMax = d("100ms") }, "broker.reconnectMax: must be at least reconnectMin"},
		{"publish channels", func(c *config.Config) { c.Broker.PublishChannels = 0 }, "broker.publishChannels"},
		{"blank queue name", func(c *config.Config) { c.Queue.Name = "  " }, "queue.name: required"},
		{"long queue name", func(c *config.Config) { c.Queue.Name = strings.Repeat("q", 201) }, "queue.name: longer than 200"},
		{"quorum ok", func(c *config.Config) { c.Queue.Type = "quorum"; c.Queue.DeliveryLimit = 5 }, ""},
		{"negative delivery limit", func(c *config.Config) { c.Queue.DeliveryLimit = -1 }, "queue.deliveryLimit"},
		{"delivery limit on classic", func(c *config.Config) { c.Queue.DeliveryLimit = 5 }, "queue.deliveryLimit: a classic queue has no delivery limit, so 5 would do nothing: drop the key, or set queue.type: quorum"},
		{"quorum tiers on classic ok", func(c *config.Config) { c.Queue.TierType = "quorum" }, ""},
		{"classic tiers on classic ok", func(c *config.Config) { c.Queue.TierType = "classic" }, ""},
		{"unknown tier type", func(c *config.Config) { c.Queue.TierType = "stream" }, `queue.tierType: must be classic or quorum, got "stream"`},
		{"classic tiers on quorum", func(c *config.Config) { c.Queue.Type = "quorum"; c.Queue.TierType = "classic" }, "queue.tierType: classic tiers would hand a quorum work queue's retries back at most once"},
		{"retry template without delay", func(c *config.Config) { c.Topology.RetryQueue = "{queue}.retry" }, "topology.retryQueue: template must contain {delay}"},
		{"empty dlq", func(c *config.Config) { c.Topology.DLQ = "" }, "topology.dlq: required"},
		{"negative dlq length", func(c *config.Config) { c.Topology.DLQMaxLength = -1 }, "topology.dlqMaxLength"},
		{"relative app url", func(c *config.Config) { c.App.URL = "/msg" }, "app.url: must be an absolute http"},
		{"app url templated", func(c *config.Config) { c.App.URL = "http://127.0.0.1:8080/in/{queue}/{routingKey}" }, ""},
		{"app timeout near consumer_timeout", func(c *config.Config) { c.App.Timeout = d("15m") }, "app.timeout: must stay well under"},
		{"health path without slash", func(c *config.Config) { c.App.HealthPath = "healthz" }, "app.healthPath: must start with /"},
		{"forward too few headers", func(c *config.Config) { c.App.Forward.MaxHeaders = 31 }, "app.forward.maxHeaders: must be at least 32"},
		{"forward header bound unset", func(c *config.Config) { c.App.Forward.MaxHeaders = 0 }, "app.forward.maxHeaders: must be at least 32"},
		{"forward 100 headers", func(c *config.Config) { c.App.Forward.MaxHeaders = 100 }, ""},
		{"forward head too small", func(c *config.Config) { c.App.Forward.MaxHeaderBytes = 1024 }, "app.forward.maxHeaderBytes: must be at least 2048"},
		{"forward value over the head", func(c *config.Config) { c.App.Forward.MaxValueBytes = 8000 }, "app.forward.maxValueBytes: must be between 1 and app.forward.maxHeaderBytes (7168), got 8000"},
		{"forward zero value bytes", func(c *config.Config) { c.App.Forward.MaxValueBytes = 0 }, "app.forward.maxValueBytes"},
		{"forward for Node's 16 KiB", func(c *config.Config) { c.App.Forward.MaxHeaderBytes, c.App.Forward.MaxValueBytes = 15<<10, 8192 }, ""},
		{"prefetch too big", func(c *config.Config) { c.Consumer.Prefetch = 70000 }, "consumer.prefetch"},
		{"more workers than prefetch", func(c *config.Config) { c.Consumer.Prefetch, c.Consumer.Workers = 50, 51 }, "consumer.workers: more workers (51) than prefetch (50)"},
		{"workers with a following prefetch", func(c *config.Config) { c.Consumer.Workers = 500 }, ""},
		{"negative prefetch", func(c *config.Config) { c.Consumer.Prefetch = -1 }, "consumer.prefetch: must be between 1 and 65535, or 0"},
		{"ordered ignores workers", func(c *config.Config) { c.Consumer.Workers = 51; c.Consumer.Ordered = true }, ""},
		{"tiers out of order", func(c *config.Config) { c.Retry.Tiers = []config.Duration{d("5s"), d("1s")} }, "retry.tiers[1]: tiers must be in increasing order"},
		{"duplicate tier", func(c *config.Config) { c.Retry.Tiers = []config.Duration{d("5s"), d("5s")} }, "retry.tiers[1]"},
		{"sub-millisecond tier", func(c *config.Config) { c.Retry.Tiers = []config.Duration{d("10us")} }, "retry.tiers[0]: must be at least 1ms"},
		{"bad outcome key", func(c *config.Config) { c.Retry.Outcomes = map[string]string{"6xx": "ack"} }, `retry.outcomes: "6xx": not an outcome`},
		{"bad outcome action", func(c *config.Config) { c.Retry.Outcomes = map[string]string{"404": "explode"} }, `retry.outcomes: "404": unknown action`},
		{"unavailable never dlq", func(c *config.Config) { c.Retry.Outcomes = map[string]string{"unavailable": "dlq"} }, `"unavailable": must be return`},
		{"every 4xx retried", func(c *config.Config) { c.Retry.Outcomes = map[string]string{"4xx": "retry"} }, ""},
		{"bad onExpired", func(c *config.Config) { c.Retry.OnExpired = "keep" }, "retry.onExpired: must be dlq or drop"},
		{"policy without name or match", func(c *config.Config) { c.Retry.Policies = []config.Policy{{}} }, "retry.policies[0].name: required"},
		{"policy matching everything", func(c *config.Config) { c.Retry.Policies = []config.Policy{{Name: "a"}} }, "retry.policies[0].match: must set"},
		{"duplicate policy names", func(c *config.Config) {
			c.Retry.Policies = []config.Policy{{Name: "a", Match: config.Match{Type: "x"}}, {Name: "a", Match: config.Match{Type: "y"}}}
		}, `retry.policies[1].name: duplicate policy name "a"`},
		{"policy header without name", func(c *config.Config) {
			c.Retry.Policies = []config.Policy{{Name: "a", Match: config.Match{Header: "=v"}}}
		}, "retry.policies[0].match.header"},
		{"policy empty tiers", func(c *config.Config) {
			c.Retry.Policies = []config.Policy{{Name: "a", Match: config.Match{Type: "x"}, Tiers: []config.Duration{}}}
		}, "retry.policies[0].tiers: at least one delay tier"},
		{"policy bad outcomes", func(c *config.Config) {
			c.Retry.Policies = []config.Policy{{Name: "a", Match: config.Match{Type: "x"}, Outcomes: map[string]string{"timeout": "nope"}}}
		}, "retry.policies[0].outcomes"},
		{"policy bad onExpired", func(c *config.Config) {
			c.Retry.Policies = []config.Policy{{Name: "a", Match: config.Match{Type: "x"}, OnExpired: "later"}}
		}, "retry.policies[0].onExpired"},
		{"min hold above max hold", func(c *config.Config) { c.Requeue.MinHold = d("10s") }, "requeue.minHold: must be between 0 and maxHold"},
		{"zero requeues", func(c *config.Config) { c.Requeue.MaxRequeues = 0 }, "requeue.maxRequeues"},
		{"zero grace", func(c *config.Config) { c.Shutdown.Grace = 0 }, "shutdown.grace: must be positive"},
		{"binding without exchange", func(c *config.Config) {
			c.Topology.Bindings = []config.Binding{{Type: "fanout"}}
		}, "topology.bindings[0].exchange: required"},
		{"binding bad type", func(c *config.Config) {
			c.Topology.Bindings = []config.Binding{{Exchange: "e", Type: "topics", RoutingKeys: []string{"a"}}}
		}, "topology.bindings[0].type: must be one of topic, direct, fanout, headers"},
		{"topic binding without keys", func(c *config.Config) {
			c.Topology.Bindings = []config.Binding{{Exchange: "e", Type: "topic"}}
		}, "topology.bindings[0].routingKeys"},
		{"fanout binding with keys", func(c *config.Config) {
			c.Topology.Bindings = []config.Binding{{Exchange: "e", Type: "fanout", RoutingKeys: []string{"a"}}}
		}, "topology.bindings[0]: a fanout exchange"},
		{"headers binding bad match", func(c *config.Config) {
			c.Topology.Bindings = []config.Binding{{Exchange: "e", Type: "headers", Headers: map[string]string{"k": "v"}, Match: "some"}}
		}, "topology.bindings[0].match"},
		{"one exchange two types", func(c *config.Config) {
			c.Topology.Bindings = []config.Binding{{Exchange: "e", Type: "fanout"}, {Exchange: "e", Type: "topic", RoutingKeys: []string{"a"}}}
		}, "topology.bindings[1].type: exchange \"e\" is bound twice with different types"},
		{"broker exchange wrong type", func(c *config.Config) {
			c.Topology.Bindings = []config.Binding{{Exchange: "amq.fanout", Type: "topic", RoutingKeys: []string{"a"}}}
		}, "amq.fanout is the broker's fanout exchange"},
		{"reserved exchange name", func(c *config.Config) {
			c.Topology.Bindings = []config.Binding{{Exchange: "amq.mine", Type: "fanout"}}
		}, "reserved for the broker's own exchanges"},
		{"admin disabled", func(c *config.Config) { c.Admin.Listen = "" }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mod(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			mustContain(t, err, tc.want)
		})
	}
}

func TestValidateNeverEchoesBrokerPassword(t *testing.T) {
	c := valid()
	c.Broker.URLs = []string{"amqp://user:s3cr3t-pw@bad host:5672/", "amqp://user:s3cr3t-pw@host:port/"}
	err := c.Validate()
	mustContain(t, err, "broker.urls[0]: not a URL", "broker.urls[1]: not a URL")
	if strings.Contains(err.Error(), "s3cr3t-pw") {
		t.Fatalf("password in error: %v", err)
	}
}

func TestDurations(t *testing.T) {
	cases := []struct {
		yaml string
		want time.Duration
		err  string // "" = accepted
	}{
		{`30`, 0, "duration must be a string with a unit"},
		{`"30"`, 0, `invalid duration "30"`},
		{`30.5`, 0, "duration must be a string with a unit"},
		{`"30s"`, 30 * time.Second, ""},
		{`30s`, 30 * time.Second, ""},
		{`'500ms'`, 500 * time.Millisecond, ""},
		{`1h30m`, 90 * time.Minute, ""},
		{`" 2m "`, 2 * time.Minute, ""},
		{`five`, 0, `invalid duration "five"`},
		{`["1s"]`, 0, "duration must be a string with a unit"},
		{`{s: 1}`, 0, "duration must be a string with a unit"},
		{`~`, 0, "duration must be a string with a unit"},
		{`true`, 0, "duration must be a string with a unit"},
	}
	for _, tc := range cases {
		t.Run(tc.yaml, func(t *testing.T) {
			c, err := parse(t, "app:\n  timeout: "+tc.yaml+"\n")
			if tc.err != "" {
				mustContain(t, err, "app.timeout: "+tc.err, "(line 2)")
				if n := len(strings.Split(err.Error(), "\n")); n != 1 {
					t.Errorf("reported %d times, want once:\n%v", n, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.App.Timeout.D() != tc.want {
				t.Fatalf("app.timeout = %v, want %v", c.App.Timeout.D(), tc.want)
			}
		})
	}
	// Durations inside lists are checked one by one, with their index.
	_, err := parse(t, "retry:\n  tiers: [\"1s\", 5, \"10\"]\n")
	mustContain(t, err, "retry.tiers[1]: duration must be a string", `retry.tiers[2]: invalid duration "10"`)
}

func TestFormatDuration(t *testing.T) {
	cases := map[time.Duration]string{
		0:                       "0s",
		time.Second:             "1s",
		5 * time.Second:         "5s",
		500 * time.Millisecond:  "500ms",
		2 * time.Minute:         "2m",
		time.Hour:               "1h",
		90 * time.Second:        "1m30s",
		1500 * time.Millisecond: "1.5s",
	}
	for d, want := range cases {
		if got := config.FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
		back, err := config.ParseDuration(config.FormatDuration(d))
		if err != nil || back.D() != d {
			t.Errorf("FormatDuration(%v) does not parse back: %v %v", d, back, err)
		}
	}
}

func TestMaxAttempts(t *testing.T) {
	cases := []struct {
		yaml string
		want config.Attempts
		err  bool
	}{
		{"unlimited", 0, false},
		{"Unlimited", 0, false},
		{`"unlimited"`, 0, false},
		{"3", 3, false},
		{`"7"`, 7, false},
		{"1", 1, false},
		{"0", 0, true},
		{"-2", 0, true},
		{"2.5", 0, true},
		{"forever", 0, true},
		{"~", 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.yaml, func(t *testing.T) {
			c, err := parse(t, "retry:\n  maxAttempts: "+tc.yaml+"\n")
			if tc.err {
				mustContain(t, err, "retry.maxAttempts: invalid attempt limit", "(line 2)")
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Retry.MaxAttempts != tc.want {
				t.Fatalf("maxAttempts = %d, want %d", c.Retry.MaxAttempts, tc.want)
			}
		})
	}

	c, err := parse(t, "retry:\n  policies:\n    - name: forever\n      match: {type: status.*}\n      maxAttempts: unlimited\n    - name: three\n      match: {type: reminder}\n      maxAttempts: 3\n    - name: inherit\n      match: {type: other}\n")
	if err != nil {
		t.Fatal(err)
	}
	ps := c.Retry.Policies
	if ps[0].MaxAttempts == nil || *ps[0].MaxAttempts != 0 {
		t.Errorf("policy unlimited: %v", ps[0].MaxAttempts)
	}
	if ps[1].MaxAttempts == nil || *ps[1].MaxAttempts != 3 {
		t.Errorf("policy 3: %v", ps[1].MaxAttempts)
	}
	if ps[2].MaxAttempts != nil {
		t.Errorf("policy without maxAttempts: %v, want nil (inherit)", *ps[2].MaxAttempts)
	}
	_, err = parse(t, "retry:\n  policies:\n    - name: a\n      match: {type: x}\n      maxAttempts: 0\n")
	mustContain(t, err, "retry.policies[0].maxAttempts: invalid attempt limit", "(line 5)")

	// An Attempts marshals to what parses back.
	for _, a := range []config.Attempts{0, 1, 10} {
		out, err := yaml.Marshal(struct {
			A config.Attempts `yaml:"a"`
		}{a})
		if err != nil {
			t.Fatal(err)
		}
		var back struct {
			A config.Attempts `yaml:"a"`
		}
		if err := yaml.Unmarshal(out, &back); err != nil || back.A != a {
			t.Errorf("attempts %d -> %q -> %d, %v", a, out, back.A, err)
		}
	}
}

func TestEnvOverrides(t *testing.T) {
	env := []string{
		"PATH=/usr/bin",
		"HOPPER_QUEUE_NAME=from-env",
		"HOPPER_BROKER_URLS=amqp://a:5672/, amqp://b:5672/,,amqps://c:5671/",
		"HOPPER_RETRY_MAX_ATTEMPTS=4",
		"HOPPER_RETRY_TIERS=2s,1m,1h",
		"HOPPER_RETRY_OUTCOMES=4xx=retry,418=ack",
		"HOPPER_TOPOLOGY_DECLARE=false",
		"HOPPER_CONSUMER_PREFETCH=12",
		"HOPPER_BROKER_TLS_SERVER_NAME=rabbit.internal",
		"HOPPER_ADMIN_LISTEN=",
		"HOPPER_APP_TIMEOUT=3s",
	}
	c, warnings, err := config.Load("", env)
	if err != nil || len(warnings) != 0 {
		t.Fatalf("err %v, warnings %v", err, warnings)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	if c.Queue.Name != "from-env" {
		t.Errorf("queue.name = %q", c.Queue.Name)
	}
	if want := []string{"amqp://a:5672/", "amqp://b:5672/", "amqps://c:5671/"}; !slices.Equal(c.Broker.URLs, want) {
		t.Errorf("broker.urls = %q, want %q", c.Broker.URLs, want)
	}
	if c.Retry.MaxAttempts != 4 {
		t.Errorf("retry.maxAttempts = %d", c.Retry.MaxAttempts)
	}
	if want := []time.Duration{2 * time.Second, time.Minute, time.Hour}; !slices.Equal(c.AllTiers(), want) {
		t.Errorf("retry.tiers = %v, want %v", c.AllTiers(), want)
	}
	if want := map[string]string{"4xx": "retry", "418": "ack"}; !reflect.DeepEqual(c.Retry.Outcomes, want) {
		t.Errorf("retry.outcomes = %v, want %v", c.Retry.Outcomes, want)
	}
	if c.Topology.Declare {
		t.Error("topology.declare still true")
	}
	if c.Consumer.Prefetch != 12 || c.Broker.TLS.ServerName != "rabbit.internal" || c.Admin.Listen != "" || c.App.Timeout.D() != 3*time.Second {
		t.Errorf("prefetch %d, serverName %q, admin %q, timeout %v", c.Consumer.Prefetch, c.Broker.TLS.ServerName, c.Admin.Listen, c.App.Timeout)
	}
	// The outcome overrides reach the table: 404 now retries, 418 acks,
	// 425 keeps its own row.
	p := c.Selector().Default
	for status, want := range map[int]retry.Action{404: retry.Retry, 418: retry.Ack, 425: retry.Requeue, 500: retry.Retry, 200: retry.Ack} {
		if got := p.Table.Lookup(retry.Outcome{Kind: retry.Response, Status: status}); got != want {
			t.Errorf("status %d -> %v, want %v", status, got, want)
		}
	}

	c, _, err = config.Load("", []string{"HOPPER_RETRY_MAX_ATTEMPTS=unlimited"})
	if err != nil || c.Retry.MaxAttempts != 0 {
		t.Errorf("unlimited from env: %d %v", c.Retry.MaxAttempts, err)
	}
}

func TestEnvBeatsFile(t *testing.T) {
	path := writeFile(t, `
queue:
  name: from-file
  type: quorum
retry:
  maxAttempts: 9
  tiers: ["1s", "2s"]
topology:
  declare: true
`)
	c, _, err := config.Load(path, []string{"HOPPER_QUEUE_NAME=from-env", "HOPPER_RETRY_TIERS=3s", "HOPPER_TOPOLOGY_DECLARE=false"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Queue.Name != "from-env" || !slices.Equal(c.AllTiers(), []time.Duration{3 * time.Second}) || c.Topology.Declare {
		t.Errorf("env did not win: name %q tiers %v declare %v", c.Queue.Name, c.AllTiers(), c.Topology.Declare)
	}
	// Keys the environment does not set keep the file's values.
	if c.Queue.Type != "quorum" || c.Retry.MaxAttempts != 9 {
		t.Errorf("file values lost: type %q maxAttempts %d", c.Queue.Type, c.Retry.MaxAttempts)
	}
	// And the defaults stay where neither says anything.
	if c.Consumer.Prefetch != 0 {
		t.Errorf("prefetch %d, want 0 (follows the limit)", c.Consumer.Prefetch)
	}
}

func TestEnvWarningsAndErrors(t *testing.T) {
	c, warnings, err := config.Load("", []string{
		"HOPPER_QUEUE_NAME=q",
		"HOPPER_QUEUE_NAEM=typo",
		"HOPPER_RETRY_POLICIES=x", // policies come only from the file
		"NOT_HOPPER_X=1",
		"HOPPER_NOEQUALS",
	})
	if err != nil {
		t.Fatalf("unknown variables must only warn: %v", err)
	}
	slices.Sort(warnings)
	if want := []string{"HOPPER_QUEUE_NAEM", "HOPPER_RETRY_POLICIES"}; !slices.Equal(warnings, want) {
		t.Errorf("warnings %q, want %q", warnings, want)
	}
	if c.Queue.Name != "q" {
		t.Errorf("queue.name %q", c.Queue.Name)
	}

	_, _, err = config.Load("", []string{
		"HOPPER_RETRY_MAX_ATTEMPTS=0",
		"HOPPER_CONSUMER_PREFETCH=lots",
		"HOPPER_TOPOLOGY_DECLARE=maybe",
		"HOPPER_APP_TIMEOUT=30",
		"HOPPER_RETRY_OUTCOMES=4xx",
	})
	mustContain(t, err,
		"retry.maxAttempts (from HOPPER_RETRY_MAX_ATTEMPTS): invalid attempt limit",
		"consumer.prefetch (from HOPPER_CONSUMER_PREFETCH): invalid integer",
		"topology.declare (from HOPPER_TOPOLOGY_DECLARE): invalid boolean",
		`app.timeout (from HOPPER_APP_TIMEOUT): invalid duration "30"`,
		"retry.outcomes (from HOPPER_RETRY_OUTCOMES): invalid entry",
	)

	// A file error and an environment error show together.
	path := writeFile(t, "queue:\n  nam: x\n")
	_, _, err = config.Load(path, []string{"HOPPER_CONSUMER_PREFETCH=x"})
	mustContain(t, err, "queue.nam: unknown key", "consumer.prefetch (from HOPPER_CONSUMER_PREFETCH)")

	if _, _, err := config.Load(filepath.Join(t.TempDir(), "missing.yaml"), nil); err == nil {
		t.Error("missing file accepted")
	}
}

func TestSetKey(t *testing.T) {
	c := valid()
	sets := [][2]string{
		{"queue.name", "flag-q"},
		{"retry.maxAttempts", "5"},
		{"admin.listen", "127.0.0.1:0"},
		{"broker.urls", "amqp://x:1/,amqp://y:2/"},
		{"broker.tls.caFile", "/etc/ca.pem"},
		{"consumer.ordered", "true"},
		{"requeue.maxHold", "2s"},
		{"retry.outcomes", "404=retry"},
	}
	for _, kv := range sets {
		if err := config.SetKey(&c, kv[0], kv[1]); err != nil {
			t.Fatalf("SetKey(%s): %v", kv[0], err)
		}
	}
	if c.Queue.Name != "flag-q" || c.Retry.MaxAttempts != 5 || c.Admin.Listen != "127.0.0.1:0" ||
		!slices.Equal(c.Broker.URLs, []string{"amqp://x:1/", "amqp://y:2/"}) || c.Broker.TLS.CAFile != "/etc/ca.pem" ||
		!c.Consumer.Ordered || c.Requeue.MaxHold.D() != 2*time.Second || c.Retry.Outcomes["404"] != "retry" {
		t.Errorf("SetKey did not set everything: %+v", c)
	}
	if err := config.SetKey(&c, "admin.listen", ""); err != nil || c.Admin.Listen != "" {
		t.Errorf("empty value: %v %q", err, c.Admin.Listen)
	}

	bad := []struct{ key, value, want string }{
		{"queue.nmae", "x", "queue.nmae: unknown key"},
		{"retry.policies", "x", "retry.policies: unknown key"},
		{"queue", "x", "queue: unknown key"},
		{"retry.maxAttempts", "0", "retry.maxAttempts: invalid attempt limit"},
		{"app.timeout", "10", `app.timeout: invalid duration "10"`},
		{"consumer.prefetch", "ten", "consumer.prefetch: invalid integer"},
	}
	before := c
	for _, b := range bad {
		err := config.SetKey(&c, b.key, b.value)
		mustContain(t, err, b.want)
	}
	if !reflect.DeepEqual(before, c) {
		t.Error("a failed SetKey changed the config")
	}
}

func TestSelector(t *testing.T) {
	c, err := parse(t, `
queue:
  name: q
retry:
  maxAttempts: 10
  tiers: ["1s", "5s"]
  outcomes: {"404": retry}
  onExpired: drop
  policies:
    - name: reminders
      match: {routingKey: "reminder.#"}
      maxAttempts: 3
    - name: status
      match: {type: "status.*"}
      maxAttempts: unlimited
      tiers: ["10s", "1m"]
      outcomes: {"4xx": retry}
      onExpired: dlq
    - name: tenant
      match: {header: "tenant=acme=corp"}
    - name: flagged
      match: {header: "x-flag"}
requeue:
  maxRequeues: 7
`)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	s := c.Selector()
	def := s.Default
	if def.Name != "default" || def.MaxAttempts != 10 || !slices.Equal(def.Tiers, []time.Duration{time.Second, 5 * time.Second}) ||
		def.ExpiredAction != retry.Drop || def.MaxRequeues != 7 || def.MaxHold != 5*time.Second || def.MinHold != time.Second {
		t.Fatalf("default policy %+v", def)
	}
	if len(s.Rules) != 4 {
		t.Fatalf("%d rules, want 4", len(s.Rules))
	}
	byName := map[string]*retry.Policy{}
	for _, r := range s.Rules {
		byName[r.Policy.Name] = r.Policy
	}

	rem := byName["reminders"]
	if rem.MaxAttempts != 3 || !slices.Equal(rem.Tiers, def.Tiers) || rem.ExpiredAction != retry.Drop || rem.MaxRequeues != 7 {
		t.Errorf("reminders did not inherit the unset fields: %+v", rem)
	}
	if got := rem.Table.Lookup(retry.Outcome{Kind: retry.Response, Status: 404}); got != retry.Retry {
		t.Errorf("reminders 404 -> %v, want the retry section's override (retry)", got)
	}
	if got := rem.Table.Lookup(retry.Outcome{Kind: retry.Response, Status: 400}); got != retry.DLQ {
		t.Errorf("reminders 400 -> %v, want dlq", got)
	}

	st := byName["status"]
	if st.MaxAttempts != retry.Unlimited || !slices.Equal(st.Tiers, []time.Duration{10 * time.Second, time.Minute}) || st.ExpiredAction != retry.DLQ {
		t.Errorf("status policy %+v", st)
	}
	if got := st.Table.Lookup(retry.Outcome{Kind: retry.Response, Status: 400}); got != retry.Retry {
		t.Errorf("status 400 -> %v, want retry", got)
	}
	if got := st.Table.Lookup(retry.Outcome{Kind: retry.Response, Status: 425}); got != retry.Requeue {
		t.Errorf("status 425 -> %v, want requeue (exact row beats 4xx)", got)
	}
	// A policy's own table does not leak into the default.
	if got := def.Table.Lookup(retry.Outcome{Kind: retry.Response, Status: 400}); got != retry.DLQ {
		t.Errorf("default 400 -> %v, want dlq", got)
	}

	// "name=value" splits at the first "=".
	var ten, flag retry.Match
	for _, r := range s.Rules {
		switch r.Policy.Name {
		case "tenant":
			ten = r.Match
		case "flagged":
			flag = r.Match
		}
	}
	if ten.Header != "tenant" || ten.HeaderValue != "acme=corp" {
		t.Errorf("tenant match %+v", ten)
	}
	if flag.Header != "x-flag" || flag.HeaderValue != "" {
		t.Errorf("flagged match %+v", flag)
	}

	hdr := func(h map[string]string) func(string) (string, bool) {
		return func(n string) (string, bool) { v, ok := h[n]; return v, ok }
	}
	sel := []struct {
		sub  retry.Subject
		want string
	}{
		{retry.Subject{RoutingKey: "reminder.email.daily", Header: hdr(nil)}, "reminders"},
		{retry.Subject{RoutingKey: "order.created", Type: "status.shipped", Header: hdr(nil)}, "status"},
		{retry.Subject{RoutingKey: "order.created", Type: "x", Header: hdr(map[string]string{"tenant": "acme=corp"})}, "tenant"},
		{retry.Subject{RoutingKey: "order.created", Type: "x", Header: hdr(map[string]string{"tenant": "acme"})}, "default"},
		{retry.Subject{RoutingKey: "order.created", Header: hdr(map[string]string{"x-flag": ""})}, "flagged"},
		{retry.Subject{RoutingKey: "reminder.x", Type: "status.y", Header: hdr(nil)}, "reminders"}, // first match wins
		{retry.Subject{RoutingKey: "order", Header: hdr(nil)}, "default"},
	}
	for _, tc := range sel {
		if got := s.Select(tc.sub).Name; got != tc.want {
			t.Errorf("Select(%+v) = %s, want %s", tc.sub, got, tc.want)
		}
	}

	// AllTiers: the union, sorted, without duplicates.
	want := []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, time.Minute}
	if got := c.AllTiers(); !slices.Equal(got, want) {
		t.Errorf("AllTiers = %v, want %v", got, want)
	}
}

func TestAllTiers(t *testing.T) {
	d := func(ds ...time.Duration) []config.Duration {
		out := make([]config.Duration, len(ds))
		for i, x := range ds {
			out[i] = config.Duration(x)
		}
		return out
	}
	c := valid()
	c.Retry.Tiers = d(time.Second, 30*time.Second, time.Hour)
	c.Retry.Policies = []config.Policy{
		{Name: "a", Match: config.Match{Type: "a"}, Tiers: d(30*time.Second, 2*time.Minute)},
		{Name: "b", Match: config.Match{Type: "b"}, Tiers: d(500*time.Millisecond, time.Second, time.Hour)},
		{Name: "c", Match: config.Match{Type: "c"}}, // inherits: adds nothing
	}
	want := []time.Duration{500 * time.Millisecond, time.Second, 30 * time.Second, 2 * time.Minute, time.Hour}
	if got := c.AllTiers(); !slices.Equal(got, want) {
		t.Fatalf("AllTiers = %v, want %v", got, want)
	}
	// The config itself is not reordered.
	if c.Retry.Tiers[2].D() != time.Hour || c.Retry.Policies[1].Tiers[0].D() != 500*time.Millisecond {
		t.Error("AllTiers modified the config's tiers")
	}
}

func TestEnvName(t *testing.T) {
	cases := map[string]string{
		"retry.maxAttempts":             "HOPPER_RETRY_MAX_ATTEMPTS",
		"broker.tls.caFile":             "HOPPER_BROKER_TLS_CA_FILE",
		"broker.tls.insecureSkipVerify": "HOPPER_BROKER_TLS_INSECURE_SKIP_VERIFY",
		"queue.name":                    "HOPPER_QUEUE_NAME",
		"broker.urls":                   "HOPPER_BROKER_URLS",
		"topology.dlqMaxLength":         "HOPPER_TOPOLOGY_DLQ_MAX_LENGTH",
		"app.maxBodyBytes":              "HOPPER_APP_MAX_BODY_BYTES",
		"app.forward.maxHeaderBytes":    "HOPPER_APP_FORWARD_MAX_HEADER_BYTES",
		"admin.listen":                  "HOPPER_ADMIN_LISTEN",
	}
	for path, want := range cases {
		if got := config.EnvName(path); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", path, got, want)
		}
	}

	vars := config.EnvVars()
	for path, name := range cases {
		if vars[name] != path {
			t.Errorf("EnvVars()[%s] = %q, want %q", name, vars[name], path)
		}
	}
	if _, ok := vars["HOPPER_RETRY_POLICIES"]; ok {
		t.Error("policies are file-only but listed as an environment variable")
	}
	// Every variable is a valid name and round-trips through EnvName.
	re := regexp.MustCompile(`^HOPPER_[A-Z0-9_]+$`)
	for name, path := range vars {
		if !re.MatchString(name) || config.EnvName(path) != name {
			t.Errorf("%s -> %s", name, path)
		}
	}
	// One variable per leaf key: no two keys share a name.
	if n := countLeaves(reflect.TypeOf(config.Config{})); len(vars) != n {
		t.Errorf("%d environment variables for %d keys", len(vars), n)
	}
}

// countLeaves counts the keys the environment can set: every field that is
// not a struct (those nest), a list of structs (policies) nor derived
// (yaml:"-").
func countLeaves(t reflect.Type) int {
	n := 0
	for i := range t.NumField() {
		f := t.Field(i)
		switch {
		case f.Tag.Get("yaml") == "-": // derived, not a key
		case f.Type.Kind() == reflect.Struct:
			n += countLeaves(f.Type)
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
		default:
			n++
		}
	}
	return n
}

// TestTypeErrorsNameTheKey: every error names its key path.
// Values the walker does not check (integers, booleans, lists, maps) are
// reported by the YAML decoder with a line number only.
func TestTypeErrorsNameTheKey(t *testing.T) {
	cases := map[string]string{
		"consumer:\n  workers: 1\n  prefetch: lots\n": "consumer.prefetch",
		"topology:\n  declare: maybe\n":               "topology.declare",
		"queue: [1]\n":                                "queue",
		"broker:\n  urls: amqp://x/\n":                "broker.urls",
		"retry:\n  outcomes: [retry]\n":               "retry.outcomes",
	}
	for doc, path := range cases {
		_, err := parse(t, doc)
		mustContain(t, err, path)
	}
}

// TestProblemsOnOneLineAllReported: flow style puts several keys on one
// line; a bad duration there must not hide another bad value.
func TestProblemsOnOneLineAllReported(t *testing.T) {
	_, err := parse(t, "broker: {heartbeat: 30, publishChannels: x}\nqueue: {name: q}\n")
	mustContain(t, err, "broker.heartbeat", "publishChannels")
}

// TestMarshalledPolicyParsesBack: a config with a policy that inherits its
// maxAttempts and tiers, written with yaml.v3, must read back the same.
func TestMarshalledPolicyParsesBack(t *testing.T) {
	c := valid()
	c.Retry.Policies = []config.Policy{{Name: "p", Match: config.Match{Type: "t"}}}
	out, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	back := config.Default()
	if err := config.Parse(out, &back); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := back.Validate(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// TestYAMLAliasesAndMergeKeys: anchors, aliases and merge keys are plain
// YAML that yaml.v3 decodes; the key walker must not reject them.
func TestYAMLAliasesAndMergeKeys(t *testing.T) {
	c, err := parse(t, "app:\n  timeout: &t \"5s\"\nbroker:\n  heartbeat: *t\n")
	if err != nil || c.Broker.Heartbeat.D() != 5*time.Second {
		t.Errorf("alias: heartbeat %v, %v", c.Broker.Heartbeat, err)
	}
	c, err = parse(t, "retry:\n  policies:\n    - &base\n      name: a\n      match: {type: a}\n      tiers: [\"1s\"]\n    - <<: *base\n      name: b\n")
	if err != nil || len(c.Retry.Policies) != 2 || c.Retry.Policies[1].Name != "b" || len(c.Retry.Policies[1].Tiers) != 1 {
		t.Errorf("merge key: %+v, %v", c.Retry.Policies, err)
	}
}

func FuzzParse(f *testing.F) {
	seeds := []string{
		"",
		"queue:\n  name: orders\n",
		"queue:\n  name: orders\n  type: quorum\n  deliveryLimit: 5\nretry:\n  maxAttempts: unlimited\n  tiers: [\"1s\", \"10s\"]\n  outcomes: {\"4xx\": retry, \"418\": ack}\n",
		"broker:\n  urls: [\"amqp://u:p@a:5672/\", \"amqps://b/\"]\n  heartbeat: 5s\n  tls: {serverName: rabbit}\nqueue: {name: q}\napp:\n  url: http://127.0.0.1:9/{routingKey}\n  timeout: 1m30s\n",
		"queue: {name: q}\nretry:\n  policies:\n    - name: a\n      match: {routingKey: \"a.#\", header: \"k=v\"}\n      maxAttempts: 3\n      tiers: [\"2s\"]\n      outcomes: {timeout: dlq}\n      onExpired: drop\n",
		"queue: {name: q}\nretry:\n  policies:\n    - name: inherits\n      match: {type: t}\n",
		"queue:\n  name: q\n  typo: 1\nbroker:\n  heartbeat: 30\n",
		"&a {queue: *a}",
		"queue: !!binary aGVsbG8=\n",
		"admin: {listen: \"\"}\nlog: {level: debug, format: text}\nqueue: {name: \"q\\u0000\"}\n",
		"queue: {name: q}\ntopology:\n  bindings:\n    - {exchange: e, type: fanout}\n    - {exchange: t, type: topic, durable: false, routingKeys: [\"a.*\", \"#\"]}\n    - {exchange: h, type: headers, headers: {k: v}, match: any}\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := config.Default()
		if err := config.Parse(data, &c); err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			return
		}
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("marshal an accepted config: %v", err)
		}
		back := config.Default()
		if err := config.Parse(out, &back); err != nil {
			t.Fatalf("re-parse of marshalled config: %v\ninput:\n%s\nmarshalled:\n%s", err, data, out)
		}
		if err := back.Validate(); err != nil {
			t.Fatalf("marshalled config no longer valid: %v\nmarshalled:\n%s", err, out)
		}
		normalize(&c)
		normalize(&back)
		if !reflect.DeepEqual(c, back) {
			t.Fatalf("round trip changed the config\nbefore: %+v\nafter:  %+v\nmarshalled:\n%s", c, back, out)
		}
	})
}

// normalize maps the nil and empty forms that mean the same (no outcome
// overrides, no policies) to one form.
func normalize(c *config.Config) {
	if len(c.Retry.Outcomes) == 0 {
		c.Retry.Outcomes = nil
	}
	if len(c.Retry.Policies) == 0 {
		c.Retry.Policies = nil
	}
	if len(c.Topology.Bindings) == 0 {
		c.Topology.Bindings = nil
	}
	for i := range c.Topology.Bindings {
		b := &c.Topology.Bindings[i]
		if len(b.RoutingKeys) == 0 {
			b.RoutingKeys = nil
		}
		if len(b.Headers) == 0 {
			b.Headers = nil
		}
	}
	for i := range c.Retry.Policies {
		if len(c.Retry.Policies[i].Outcomes) == 0 {
			c.Retry.Policies[i].Outcomes = nil
		}
	}
}
