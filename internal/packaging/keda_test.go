package packaging

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// kedaObjects is what the chart renders for KEDA: the triggers' metadata,
// the TriggerAuthentication's parameters as "secret/key" or
// "configmap:name/key", and the ConfigMaps of the release by name.
type kedaObjects struct {
	triggers   []map[string]string
	params     map[string]string
	configMaps map[string]*corev1.ConfigMap
}

func renderKeda(t *testing.T, args ...string) kedaObjects {
	t.Helper()
	ms := renderChart(t, args...)
	k := kedaObjects{params: map[string]string{}, configMaps: map[string]*corev1.ConfigMap{}}
	for _, cm := range byKind[*corev1.ConfigMap](ms) {
		k.configMaps[cm.Name] = cm
	}
	var spec struct {
		Triggers []struct {
			Metadata map[string]string `json:"metadata"`
		} `json:"triggers"`
		SecretTargetRef    []struct{ Parameter, Name, Key string } `json:"secretTargetRef"`
		ConfigMapTargetRef []struct{ Parameter, Name, Key string } `json:"configMapTargetRef"`
	}
	for _, o := range byKind[*crdObject](ms) {
		b, err := json.Marshal(o.Spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &spec); err != nil {
			t.Fatalf("%s %s: %v", o.Kind, o.Name, err)
		}
		switch o.Kind {
		case "ScaledObject":
			for _, tr := range spec.Triggers {
				k.triggers = append(k.triggers, tr.Metadata)
			}
		case "TriggerAuthentication":
			for _, r := range spec.SecretTargetRef {
				k.params[r.Parameter] = r.Name + "/" + r.Key
			}
			for _, r := range spec.ConfigMapTargetRef {
				k.params[r.Parameter] = "configmap:" + r.Name + "/" + r.Key
			}
		}
	}
	if len(k.triggers) == 0 {
		t.Fatalf("no ScaledObject triggers in %s", kindsOf(ms))
	}
	return k
}

// TestChartKedaCountsInFlight: by default KEDA reads the queue from the
// management API (protocol http), whose count is ready + unacknowledged
// messages, never with excludeUnacknowledged, so the messages the pods hold
// count and KEDA does not scale busy pods down. The management URL comes
// from keda.managementUrl (trigger metadata, no credentials) with the
// broker's user name and password, or from a Secret key; protocol amqp,
// which counts ready messages only, stays an option.
func TestChartKedaCountsInFlight(t *testing.T) {
	minimal := repoPath(chartDir, "ci", "minimal-values.yaml")
	creds := []string{"--set", "broker.usernameKey=user", "--set", "broker.passwordKey=pass"}
	cases := []struct {
		name     string
		args     []string
		protocol string
		host     string            // trigger metadata host; "" = none
		params   map[string]string // TriggerAuthentication parameters, exactly
	}{
		{"management url", append([]string{"-f", minimal, "--set", "keda.enabled=true", "--set", "keda.managementUrl=http://rabbitmq:15672/orders"}, creds...),
			"http", "http://rabbitmq:15672/orders", map[string]string{"username": "rabbitmq-orders/user", "password": "rabbitmq-orders/pass"}},
		{"management url, vhost named apart", append([]string{"-f", minimal, "--set", "keda.enabled=true", "--set", "keda.managementUrl=http://rabbitmq:15672", "--set", "keda.vhostName=orders",
			"--set", "config.broker.urls={amqp://rabbitmq:5672/orders}"}, creds...),
			"http", "http://rabbitmq:15672", map[string]string{"username": "rabbitmq-orders/user", "password": "rabbitmq-orders/pass"}},
		{"management url from the secret", []string{"-f", minimal, "--set", "keda.enabled=true", "--set", "keda.hostKey=mgmt"},
			"http", "", map[string]string{"host": "rabbitmq-orders/mgmt"}},
		{"amqp", []string{"-f", minimal, "--set", "keda.enabled=true", "--set", "keda.protocol=amqp"},
			"amqp", "", map[string]string{"host": "rabbitmq-orders/url"}},
		{"amqp, one credential key only", []string{"-f", minimal, "--set", "keda.enabled=true", "--set", "keda.protocol=amqp", "--set", "broker.passwordKey=pass"},
			"amqp", "", map[string]string{"host": "rabbitmq-orders/url"}},
		{"ci keda-values", []string{"-f", repoPath(chartDir, "ci", "keda-values.yaml")},
			"http", "https://rabbitmq.messaging:15671/orders", map[string]string{"username": "rabbitmq-orders/username", "password": "rabbitmq-orders/password",
				"ca": "rabbitmq-orders-tls/ca.crt", "tls": "configmap:rel-hopper-keda-tls/tls"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			k := renderKeda(t, c.args...)
			for _, md := range k.triggers {
				if md["protocol"] != c.protocol {
					t.Errorf("trigger protocol %q, want %q", md["protocol"], c.protocol)
				}
				if md["host"] != c.host {
					t.Errorf("trigger host %q, want %q", md["host"], c.host)
				}
				if md["mode"] != "QueueLength" {
					t.Errorf("trigger mode %q, want QueueLength", md["mode"])
				}
				if v, ok := md["excludeUnacknowledged"]; ok {
					t.Errorf("trigger sets excludeUnacknowledged %q: the count must include the messages in flight", v)
				}
			}
			if len(k.params) != len(c.params) {
				t.Errorf("TriggerAuthentication parameters %v, want %v", k.params, c.params)
			}
			for p, want := range c.params {
				if k.params[p] != want {
					t.Errorf("TriggerAuthentication %s = %q, want %q", p, k.params[p], want)
				}
			}
		})
	}
}

// TestChartKedaTLS: with broker.tls.existingSecret the TriggerAuthentication
// hands KEDA the same CA and client certificate Hopper mounts, for both
// protocols, and turns the scaler's TLS on from a ConfigMap the chart
// renders (the scaler ignores ca/cert/key unless tls is "enable").
func TestChartKedaTLS(t *testing.T) {
	minimal := repoPath(chartDir, "ci", "minimal-values.yaml")
	tls := []string{"--set", "broker.tls.existingSecret=rmq-tls", "--set", "broker.tls.certKey=client.crt", "--set", "broker.tls.keyKey=client.key"}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"http", []string{"--set", "keda.hostKey=mgmt"}},
		{"amqp", []string{"--set", "keda.protocol=amqp"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := append(append([]string{"-f", minimal, "--set", "keda.enabled=true"}, tls...), c.args...)
			k := renderKeda(t, args...)
			for p, want := range map[string]string{"ca": "rmq-tls/ca.crt", "cert": "rmq-tls/client.crt", "key": "rmq-tls/client.key"} {
				if k.params[p] != want {
					t.Errorf("TriggerAuthentication %s = %q, want %q (broker.tls)", p, k.params[p], want)
				}
			}
			ref, ok := strings.CutPrefix(k.params["tls"], "configmap:")
			if !ok {
				t.Fatalf("TriggerAuthentication tls = %q, want a configMapTargetRef", k.params["tls"])
			}
			name, key, _ := strings.Cut(ref, "/")
			cm := k.configMaps[name]
			if cm == nil || cm.Data[key] != "enable" {
				t.Errorf("tls refers to ConfigMap %s key %s, which the release does not render as \"enable\": %+v", name, key, cm)
			}
		})
	}
	// Without broker TLS there is nothing to turn on.
	k := renderKeda(t, "-f", minimal, "--set", "keda.enabled=true", "--set", "keda.protocol=amqp")
	for _, p := range []string{"tls", "ca", "cert", "key"} {
		if v, ok := k.params[p]; ok {
			t.Errorf("without broker.tls the TriggerAuthentication sets %s = %q", p, v)
		}
	}
}

// TestChartKedaRejects: a KEDA setup that cannot reach the queue fails the
// render and says what to set.
func TestChartKedaRejects(t *testing.T) {
	minimal := repoPath(chartDir, "ci", "minimal-values.yaml")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"http without a management url", nil, "keda.protocol http reads the queue from RabbitMQ's management API: set keda.managementUrl"},
		{"management url without credentials", []string{"--set", "keda.managementUrl=http://rabbitmq:15672/orders"}, "keda.managementUrl needs broker.existingSecret with broker.usernameKey and broker.passwordKey"},
		{"management url with a password in it", []string{"--set", "keda.managementUrl=http://guest:guest@rabbitmq:15672/orders"}, "/keda/managementUrl"},
		{"management url not http", []string{"--set", "keda.managementUrl=amqp://rabbitmq:5672/orders"}, "/keda/managementUrl"},
		{"management url on another vhost", []string{"--set", "keda.managementUrl=http://rabbitmq:15672", "--set", "broker.usernameKey=u", "--set", "broker.passwordKey=p", "--set", "config.broker.urls={amqp://rabbitmq:5672/orders}"},
			`keda.managementUrl "http://rabbitmq:15672" names vhost "/" but Hopper consumes from vhost "orders"`},
		{"management url on a vhost Hopper does not use", []string{"--set", "keda.managementUrl=http://rabbitmq:15672/orders", "--set", "broker.usernameKey=u", "--set", "broker.passwordKey=p", "--set", "config.broker.urls={amqp://rabbitmq:5672/}"},
			`names vhost "orders" but Hopper consumes from vhost "/"`},
		{"host key without secret", []string{"--set", "keda.hostKey=mgmt", "--set", "broker.existingSecret=", "--set", "broker.urlKey="}, "keda.hostKey names a key of broker.existingSecret"},
		{"stream lag without a stream", []string{"--set", "keda.hostKey=mgmt", "--set", "keda.streamLag.serverAddress=http://prometheus:9090"}, "keda.streamLag.serverAddress scales on the lag of a stream subscription, and the config reads no stream"},
		{"amqp without broker secret", []string{"--set", "keda.protocol=amqp", "--set", "broker.existingSecret=", "--set", "broker.urlKey="}, "keda.protocol amqp needs the broker's URL from a Secret"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := templateArgs(renderCase{chart: repoPath(chartDir), args: append([]string{"-f", minimal, "--set", "keda.enabled=true"}, c.args...)})
			stdout, stderr, err := runHelm(t, args...)
			if err == nil {
				t.Fatalf("helm %s rendered; want an error containing %q\n%s", strings.Join(args, " "), c.want, stdout)
			}
			if !strings.Contains(stderr, c.want) {
				t.Errorf("helm template failed with\n%s\nwant it to mention %q", stderr, c.want)
			}
		})
	}
}

// TestChartKedaStreamLag: for a stream subscription the rabbitmq trigger
// watches the subscription's own queue (a stream's count is everything it
// keeps), and keda.streamLag adds a prometheus trigger on the consumer
// name's lag.
func TestChartKedaStreamLag(t *testing.T) {
	minimal := repoPath(chartDir, "ci", "minimal-values.yaml")
	args := []string{"-f", minimal, "--set", "keda.enabled=true", "--set", "keda.hostKey=mgmt",
		"--set", "config.queue.type=stream", "--set", "config.queue.stream.consumer=billing",
		"--set", "keda.streamLag.serverAddress=http://prometheus.monitoring:9090", "--set-string", "keda.streamLag.activationValue=5"}
	k := renderKeda(t, args...)
	if len(k.triggers) != 2 {
		t.Fatalf("triggers %v, want a rabbitmq and a prometheus one", k.triggers)
	}
	if q := k.triggers[0]["queueName"]; q != "orders.billing" {
		t.Errorf("rabbitmq trigger on %q, want the subscription's own queue orders.billing", q)
	}
	want := map[string]string{"serverAddress": "http://prometheus.monitoring:9090", "query": `max(hopper_stream_lag_messages{queue="orders.billing"})`,
		"threshold": "10000", "activationThreshold": "5", "ignoreNullValues": "true"}
	for key, v := range want {
		if k.triggers[1][key] != v {
			t.Errorf("prometheus trigger %s = %q, want %q", key, k.triggers[1][key], v)
		}
	}
}
