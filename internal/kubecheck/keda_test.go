package kubecheck

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	kedav1alpha1 "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// kedaParam is one parameter of KEDA's rabbitmq scaler, as its metadata
// struct declares it in a `keda:"name=..., order=..."` tag.
type kedaParam struct {
	orders   []string // triggerMetadata, authParams, resolvedEnv
	optional bool     // optional, or has a default
}

var rabbitmq struct {
	once   sync.Once
	params map[string]kedaParam
	err    string
}

// rabbitmqParams reads the parameters of the rabbitmq scaler from KEDA's
// own source (pkg/scalers/rabbitmq_scaler.go of the KEDA module this
// module requires, whose apis types the objects are decoded into): the
// fields of rabbitMQMetadata and their keda tags. The scaler package itself
// is not imported: it would pull every scaler's client into this module.
func rabbitmqParams(t *testing.T) map[string]kedaParam {
	t.Helper()
	rabbitmq.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/kedacore/keda/v2").Output()
		if err != nil {
			rabbitmq.err = "go list -m github.com/kedacore/keda/v2: " + err.Error()
			return
		}
		file := filepath.Join(strings.TrimSpace(string(out)), "pkg", "scalers", "rabbitmq_scaler.go")
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
		if err != nil {
			rabbitmq.err = err.Error()
			return
		}
		params := map[string]kedaParam{}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || ts.Name.Name != "rabbitMQMetadata" {
				return true
			}
			for _, fld := range ts.Type.(*ast.StructType).Fields.List {
				if fld.Tag == nil {
					continue
				}
				raw, _ := strconv.Unquote(fld.Tag.Value)
				var p kedaParam
				name := ""
				for _, part := range strings.Split(reflect.StructTag(raw).Get("keda"), ",") {
					k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
					switch k {
					case "name":
						name = v
					case "order":
						p.orders = strings.Split(v, ";")
					case "optional", "default":
						p.optional = true
					}
				}
				if name != "" {
					params[name] = p
				}
			}
			return false
		})
		if len(params) == 0 {
			rabbitmq.err = file + ": no rabbitMQMetadata fields with keda tags"
		}
		rabbitmq.params = params
	})
	if rabbitmq.err != "" {
		t.Fatal(rabbitmq.err)
	}
	return rabbitmq.params
}

// checkRabbitMQAuth checks a rabbitmq trigger together with its
// TriggerAuthentication as KEDA's scaler will read them: every metadata key
// and every auth parameter is one the scaler takes from that place, the
// required ones (queueName, host) are given, the TLS parameters take
// effect (tls resolves to "enable" from a rendered ConfigMap) and name the
// same Secret and keys as Hopper's own broker TLS volume, and with the
// management API the count includes unacknowledged messages.
func checkRabbitMQAuth(t *testing.T, tr kedav1alpha1.ScaleTriggers, ta *kedav1alpha1.TriggerAuthentication, docs []doc, dep *appsv1.Deployment) {
	t.Helper()
	params := rabbitmqParams(t)
	given := map[string]bool{}
	for k := range tr.Metadata {
		p, ok := params[k]
		if !ok || !slices.Contains(p.orders, "triggerMetadata") {
			t.Errorf("trigger metadata %q is not a rabbitmq scaler trigger parameter (scaler declares %v)", k, p.orders)
		}
		given[k] = true
	}
	refs := map[string]kedav1alpha1.AuthTargetRef{}
	for _, r := range ta.Spec.SecretTargetRef {
		refs[r.Parameter] = kedav1alpha1.AuthTargetRef(r)
	}
	cmRefs := map[string]kedav1alpha1.AuthTargetRef{}
	for _, r := range ta.Spec.ConfigMapTargetRef {
		cmRefs[r.Parameter] = kedav1alpha1.AuthTargetRef(r)
	}
	for _, m := range []map[string]kedav1alpha1.AuthTargetRef{refs, cmRefs} {
		for name, r := range m {
			p, ok := params[name]
			if !ok || !slices.Contains(p.orders, "authParams") {
				t.Errorf("TriggerAuthentication %s parameter %q is not a rabbitmq scaler auth parameter (scaler declares %v)", ta.Name, name, p.orders)
			}
			if r.Name == "" || r.Key == "" {
				t.Errorf("TriggerAuthentication %s parameter %q: %+v names no object and key", ta.Name, name, r)
			}
			given[name] = true
		}
	}
	for name, p := range params {
		if !p.optional && !given[name] {
			t.Errorf("rabbitmq trigger on %q: the scaler requires %q, given neither in the metadata nor by TriggerAuthentication %s", tr.Metadata["queueName"], name, ta.Name)
		}
	}
	if given["username"] != given["password"] {
		t.Errorf("TriggerAuthentication %s: the scaler takes username and password together", ta.Name)
	}
	if given["cert"] != given["key"] {
		t.Errorf("TriggerAuthentication %s: the scaler takes cert and key together", ta.Name)
	}
	if tr.Metadata["protocol"] == "http" && tr.Metadata["excludeUnacknowledged"] == "true" {
		t.Errorf("trigger on %q counts ready messages only: the messages Hopper holds in flight must count", tr.Metadata["queueName"])
	}

	// TLS: the scaler uses ca/cert/key only when tls is "enable", and they
	// must be what Hopper itself trusts and presents.
	var hopperTLS *corev1.SecretVolumeSource
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == "hopper-tls" && v.Secret != nil {
			hopperTLS = v.Secret
		}
	}
	tlsOn := false
	if r, ok := cmRefs["tls"]; ok {
		val, found := configMapValue(t, docs, r.Name, r.Key)
		if !found || (val != "enable" && val != "disable") {
			t.Errorf("TriggerAuthentication %s tls refers to ConfigMap %s key %s = %q (found %v); the scaler takes enable or disable", ta.Name, r.Name, r.Key, val, found)
		}
		tlsOn = val == "enable"
	}
	if _, ok := refs["tls"]; ok {
		t.Errorf("TriggerAuthentication %s takes tls from a Secret the chart does not render", ta.Name)
	}
	if (hopperTLS != nil) != tlsOn {
		t.Errorf("TriggerAuthentication %s: KEDA's TLS on = %v, Hopper's broker TLS Secret mounted = %v: they must agree", ta.Name, tlsOn, hopperTLS != nil)
	}
	for param, file := range map[string]string{"ca": "ca.crt", "cert": "tls.crt", "key": "tls.key"} {
		r, ok := refs[param]
		var item *corev1.KeyToPath
		if hopperTLS != nil {
			for i := range hopperTLS.Items {
				if hopperTLS.Items[i].Path == file {
					item = &hopperTLS.Items[i]
				}
			}
		}
		switch {
		case ok && item == nil:
			t.Errorf("TriggerAuthentication %s passes %s, which Hopper's broker TLS does not use", ta.Name, param)
		case !ok && item != nil:
			t.Errorf("TriggerAuthentication %s lacks %s, which Hopper's broker TLS uses (%s/%s)", ta.Name, param, hopperTLS.SecretName, item.Key)
		case ok && (r.Name != hopperTLS.SecretName || r.Key != item.Key):
			t.Errorf("TriggerAuthentication %s %s = %s/%s, Hopper's = %s/%s", ta.Name, param, r.Name, r.Key, hopperTLS.SecretName, item.Key)
		}
	}
}

// configMapValue is key of the rendered ConfigMap name.
func configMapValue(t *testing.T, docs []doc, name, key string) (string, bool) {
	t.Helper()
	for _, d := range docs {
		if d.kind != "ConfigMap" || d.name != name {
			continue
		}
		var cm corev1.ConfigMap
		if err := decodeStrict(d, &cm); err != nil {
			t.Error(err)
			return "", false
		}
		v, ok := cm.Data[key]
		return v, ok
	}
	return "", false
}
