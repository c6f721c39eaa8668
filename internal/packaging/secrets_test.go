package packaging

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// standInPEM is a self-signed certificate and its key, made once: the
// stand-in for every certificate and key a Secret volume holds, so that
// `hopper config validate` and the OTLP exporter load them as Hopper would.
var standInPEM struct {
	once      sync.Once
	cert, key []byte
	err       error
}

func standInCert(t *testing.T) (cert, key []byte) {
	t.Helper()
	standInPEM.once.Do(func() {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			standInPEM.err = err
			return
		}
		tmpl := &x509.Certificate{
			SerialNumber:          big.NewInt(1),
			Subject:               pkix.Name{CommonName: "stand-in"},
			NotBefore:             time.Now().Add(-time.Hour),
			NotAfter:              time.Now().Add(24 * time.Hour),
			IsCA:                  true,
			BasicConstraintsValid: true,
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
			ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
		if err != nil {
			standInPEM.err = err
			return
		}
		kder, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			standInPEM.err = err
			return
		}
		standInPEM.cert = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		standInPEM.key = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	})
	if standInPEM.err != nil {
		t.Fatal(standInPEM.err)
	}
	return standInPEM.cert, standInPEM.key
}

// standInSecret is what a Secret volume's item holds in the stand-in
// mount: a PEM certificate for *.crt, a PEM key for *.key, a Standard
// Webhooks secret for the secrets of app.auth.standardWebhooks, text
// otherwise.
func standInSecret(t *testing.T, it corev1.KeyToPath) []byte {
	cert, key := standInCert(t)
	switch {
	case strings.HasSuffix(it.Path, ".crt"):
		return cert
	case strings.HasSuffix(it.Path, ".key") && it.Path != "key":
		return key
	case it.Path == "secrets":
		return []byte("whsec_" + base64.StdEncoding.EncodeToString([]byte("stand-in for "+it.Key+strings.Repeat(".", 24))) + "\n")
	}
	return []byte("stand-in for " + it.Key)
}

// renderChart renders charts/hopper with args and decodes the manifests.
func renderChart(t *testing.T, args ...string) []manifest {
	t.Helper()
	stdout, stderr, err := runHelm(t, templateArgs(renderCase{chart: repoPath(chartDir), args: args})...)
	if err != nil {
		t.Fatalf("helm template %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return decodeManifests(t, stdout)
}

// hopperPods returns the pod templates that run Hopper (the Deployment's,
// the tool Job's) with their Hopper container.
func hopperPods(t *testing.T, ms []manifest) (pods []*corev1.PodTemplateSpec, hoppers []*corev1.Container) {
	t.Helper()
	var all []*corev1.PodTemplateSpec
	for _, d := range byKind[*appsv1.Deployment](ms) {
		all = append(all, &d.Spec.Template)
	}
	for _, j := range byKind[*batchv1.Job](ms) {
		all = append(all, &j.Spec.Template)
	}
	for _, p := range all {
		h, _ := findHopper(t, p)
		if h == nil {
			t.Fatalf("a pod without a Hopper container")
		}
		pods, hoppers = append(pods, p), append(hoppers, h)
	}
	return pods, hoppers
}

// renderedConfig is the hopper.yaml of the release, as a map.
func renderedConfig(t *testing.T, ms []manifest) map[string]any {
	t.Helper()
	for _, cm := range byKind[*corev1.ConfigMap](ms) {
		if y, ok := cm.Data["hopper.yaml"]; ok {
			var m map[string]any
			if err := yaml.Unmarshal([]byte(y), &m); err != nil {
				t.Fatal(err)
			}
			return m
		}
	}
	t.Fatalf("no hopper.yaml in %s", kindsOf(ms))
	return nil
}

// secretFile checks that path, a file Hopper is told to read, lies in a
// Secret volume mounted read-only as a folder (no subPath, so the kubelet
// updates it when the Secret changes) in c, and that the file there is
// the Secret's key. It returns the volume.
func secretFile(t *testing.T, pod *corev1.PodTemplateSpec, c *corev1.Container, path, secret, key string) {
	t.Helper()
	dir, file := path[:strings.LastIndex(path, "/")], path[strings.LastIndex(path, "/")+1:]
	m := volumeMountAt(c, dir)
	if m == nil {
		t.Errorf("container %s: nothing is mounted at %s, where the config reads %s", c.Name, dir, path)
		return
	}
	if !m.ReadOnly || m.SubPath != "" {
		t.Errorf("container %s: %s is mounted %+v; want read-only and without subPath (a subPath mount never sees a rotated Secret)", c.Name, dir, m)
	}
	v := volumeOf(pod, c, dir)
	if v == nil || v.Secret == nil || v.Secret.SecretName != secret {
		t.Errorf("container %s: %s is not the Secret %s: %+v", c.Name, dir, secret, v)
		return
	}
	if !slices.ContainsFunc(v.Secret.Items, func(it corev1.KeyToPath) bool { return it.Key == key && it.Path == file }) {
		t.Errorf("Secret volume %s: items %+v lack key %s at %s", v.Name, v.Secret.Items, key, file)
	}
}

// TestChartAppSecrets: app.auth.token, app.auth.hmac and app.tls Secrets
// are mounted into the Hopper container (of the Deployment and of the tool
// Job, which reads the same config) and the config points at the mounted
// files; the app itself sees none of them, and with app.tls Hopper talks
// https to the app and the app's readiness probe too.
func TestChartAppSecrets(t *testing.T) {
	ms := renderChart(t, "-f", repoPath(chartDir, "ci", "full-values.yaml"))
	cfg := renderedConfig(t, ms)
	pods, hoppers := hopperPods(t, ms)
	if len(pods) != 2 {
		t.Fatalf("want the Deployment's and the Job's pods, got %d", len(pods))
	}
	files := []struct {
		cfgPath     []string
		secret, key string
	}{
		{[]string{"app", "auth", "token", "file"}, "orders-app-auth", "hopper-token"},
		{[]string{"app", "auth", "hmac", "keyFile"}, "orders-app-auth", "hmac-key"},
		{[]string{"app", "tls", "caFile"}, "orders-app-tls", "ca.crt"},
		{[]string{"app", "tls", "certFile"}, "orders-app-tls", "tls.crt"},
		{[]string{"app", "tls", "keyFile"}, "orders-app-tls", "tls.key"},
	}
	for _, f := range files {
		path, _ := dig(cfg, f.cfgPath...).(string)
		if !strings.HasPrefix(path, "/etc/hopper/") {
			t.Errorf("config %s = %q, want a file the chart mounts under /etc/hopper", strings.Join(f.cfgPath, "."), path)
			continue
		}
		for i := range pods {
			secretFile(t, pods[i], hoppers[i], path, f.secret, f.key)
		}
	}
	if u, _ := dig(cfg, "app", "url").(string); !strings.HasPrefix(u, "https://127.0.0.1:8081/") {
		t.Errorf("app.url %q: with app.tls Hopper must talk https to the app on 127.0.0.1:8081", u)
	}
	dep := byKind[*appsv1.Deployment](ms)[0]
	for _, c := range dep.Spec.Template.Spec.Containers {
		if c.Name == hoppers[0].Name {
			continue
		}
		for _, m := range c.VolumeMounts {
			if strings.HasPrefix(m.Name, "hopper-") {
				t.Errorf("app container %s mounts Hopper's %s", c.Name, m.Name)
			}
		}
		if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("app container %s readiness probe %+v: the app serves https, so the probe must too", c.Name, p)
		}
	}

	// Through a parent chart's includes: hopper.volumes brings the Secret.
	t.Run("parent", func(t *testing.T) {
		stdout, stderr, err := runHelm(t, templateArgs(renderCase{chart: parentChart(t)})...)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		ms := decodeManifests(t, stdout)
		pods, hoppers := hopperPods(t, ms)
		path, _ := dig(renderedConfig(t, ms), "app", "auth", "token", "file").(string)
		secretFile(t, pods[0], hoppers[0], path, "orders-hopper-token", "token")
	})

	// Each alone, in the minimal release.
	minimal := repoPath(chartDir, "ci", "minimal-values.yaml")
	for _, c := range []struct {
		name    string
		args    []string
		cfgPath []string
		secret  string
		key     string
	}{
		{"token", []string{"--set", "app.auth.token.existingSecret=tok"}, []string{"app", "auth", "token", "file"}, "tok", "token"},
		{"hmac", []string{"--set", "app.auth.hmac.existingSecret=sig", "--set", "app.auth.hmac.key=k"}, []string{"app", "auth", "hmac", "keyFile"}, "sig", "k"},
		{"standard webhooks", []string{"--set", "app.auth.standardWebhooks.existingSecret=wh"}, []string{"app", "auth", "standardWebhooks", "secretFile"}, "wh", "secrets"},
		{"tls ca only", []string{"--set", "app.tls.existingSecret=ca"}, []string{"app", "tls", "caFile"}, "ca", "ca.crt"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ms := renderChart(t, append([]string{"-f", minimal}, c.args...)...)
			cfg := renderedConfig(t, ms)
			pods, hoppers := hopperPods(t, ms)
			path, _ := dig(cfg, c.cfgPath...).(string)
			secretFile(t, pods[0], hoppers[0], path, c.secret, c.key)
			auth, _ := dig(cfg, "app", "auth").(map[string]any)
			tls, _ := dig(cfg, "app", "tls").(map[string]any)
			if n := len(auth) + len(tls); n != 1 {
				t.Errorf("config app.auth %v app.tls %v: want only %s set", auth, tls, strings.Join(c.cfgPath, "."))
			}
			if c.name == "tls ca only" && (dig(cfg, "app", "tls", "certFile") != nil || slices.ContainsFunc(pods[0].Spec.Volumes, func(v corev1.Volume) bool {
				return v.Secret != nil && slices.ContainsFunc(v.Secret.Items, func(it corev1.KeyToPath) bool { return it.Path == "tls.key" && v.Name == "hopper-app-tls" })
			})) {
				t.Errorf("app.tls without certKey sets a client certificate: %v", tls)
			}
		})
	}
}

// TestChartServiceAccountToken: app.auth.serviceAccountToken mounts a
// projected token of the pod's ServiceAccount with the audience and
// lifetime given into the Hopper container only (of the Deployment and of
// the tool Job), as a folder so the kubelet's renewals reach the file, and
// makes it app.auth.token.file; without an audience nothing is mounted.
func TestChartServiceAccountToken(t *testing.T) {
	check := func(t *testing.T, ms []manifest, audience string, seconds int64, pods int) {
		t.Helper()
		cfg := renderedConfig(t, ms)
		path, _ := dig(cfg, "app", "auth", "token", "file").(string)
		if path != "/etc/hopper/app-sa-token/token" {
			t.Fatalf("app.auth.token.file = %q, want the projected token", path)
		}
		if h, ok := dig(cfg, "app", "auth", "token", "header").(string); ok && h != "Authorization" {
			t.Errorf("app.auth.token.header = %q", h)
		}
		ps, hoppers := hopperPods(t, ms)
		if len(ps) != pods {
			t.Fatalf("%d pods run Hopper, want %d", len(ps), pods)
		}
		for i, pod := range ps {
			m := volumeMountAt(hoppers[i], "/etc/hopper/app-sa-token")
			if m == nil || !m.ReadOnly || m.SubPath != "" {
				t.Errorf("container %s: the token folder is mounted %+v; want read-only without subPath", hoppers[i].Name, m)
				continue
			}
			v := volumeOf(pod, hoppers[i], "/etc/hopper/app-sa-token")
			if v == nil || v.Projected == nil || len(v.Projected.Sources) != 1 || v.Projected.Sources[0].ServiceAccountToken == nil {
				t.Errorf("container %s: the token volume is %+v, want a projected service-account token", hoppers[i].Name, v)
				continue
			}
			if sat := v.Projected.Sources[0].ServiceAccountToken; sat.Audience != audience || sat.ExpirationSeconds == nil || *sat.ExpirationSeconds != seconds || sat.Path != "token" {
				t.Errorf("serviceAccountToken %+v, want audience %q, %d s, path token", sat, audience, seconds)
			}
			for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
				if c.Name != hoppers[i].Name && slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.Name == m.Name }) {
					t.Errorf("container %s mounts Hopper's service-account token", c.Name)
				}
			}
		}
	}
	minimal := repoPath(chartDir, "ci", "minimal-values.yaml")
	t.Run("minimal", func(t *testing.T) {
		t.Parallel()
		check(t, renderChart(t, "-f", minimal, "--set", "app.auth.serviceAccountToken.audience=orders-api"), "orders-api", 3600, 1)
	})
	t.Run("with the tool Job", func(t *testing.T) {
		t.Parallel()
		ms := renderChart(t, "-f", repoPath(chartDir, "ci", "full-values.yaml"), "--set", "app.auth.token.existingSecret=",
			"--set", "app.auth.serviceAccountToken.audience=https://orders.example", "--set", "app.auth.serviceAccountToken.expirationSeconds=7200")
		check(t, ms, "https://orders.example", 7200, 2)
	})
	t.Run("off", func(t *testing.T) {
		t.Parallel()
		ms := renderChart(t, "-f", minimal)
		pods, hoppers := hopperPods(t, ms)
		if volumeMountAt(hoppers[0], "/etc/hopper/app-sa-token") != nil || slices.ContainsFunc(pods[0].Spec.Volumes, func(v corev1.Volume) bool { return v.Projected != nil }) {
			t.Error("a service-account token is mounted without app.auth.serviceAccountToken.audience")
		}
		if dig(renderedConfig(t, ms), "app", "auth") != nil {
			t.Error("app.auth is set without any of its values")
		}
	})
}

// TestChartOtelSecrets: the collector's headers come from a Secret through
// a secretKeyRef (never the ConfigMap), and its CA is mounted and named by
// OTEL_EXPORTER_OTLP_CERTIFICATE, the variable Hopper's exporter reads.
func TestChartOtelSecrets(t *testing.T) {
	ms := renderChart(t, "-f", repoPath(chartDir, "ci", "full-values.yaml"))
	pods, hoppers := hopperPods(t, ms)
	for i, h := range hoppers {
		env := map[string]corev1.EnvVar{}
		for _, e := range h.Env {
			env[e.Name] = e
		}
		hd := env["OTEL_EXPORTER_OTLP_HEADERS"]
		if hd.Value != "" || hd.ValueFrom == nil || hd.ValueFrom.SecretKeyRef == nil ||
			hd.ValueFrom.SecretKeyRef.Name != "otel-collector-auth" || hd.ValueFrom.SecretKeyRef.Key != "headers" {
			t.Errorf("container %s: OTEL_EXPORTER_OTLP_HEADERS %+v, want a secretKeyRef to otel-collector-auth/headers", h.Name, hd)
		}
		ca := env["OTEL_EXPORTER_OTLP_CERTIFICATE"].Value
		if ca == "" {
			t.Errorf("container %s: no OTEL_EXPORTER_OTLP_CERTIFICATE", h.Name)
			continue
		}
		secretFile(t, pods[i], h, ca, "otel-collector-ca", "ca.crt")
	}
	for _, cm := range byKind[*corev1.ConfigMap](ms) {
		for k, v := range cm.Data {
			if strings.Contains(v, "otel-collector-auth") {
				t.Errorf("ConfigMap %s %s names the headers Secret", cm.Name, k)
			}
		}
	}

	// Off by default, and nothing is mounted with tracing off.
	minimal := repoPath(chartDir, "ci", "minimal-values.yaml")
	for _, args := range [][]string{
		{"-f", minimal, "--set", "otel.enabled=true", "--set", "otel.endpoint=https://c:4318"},
		{"-f", minimal, "--set", "otel.caSecret.name=ca", "--set", "otel.headersSecret.name=h"},
	} {
		_, hoppers := hopperPods(t, renderChart(t, args...))
		for _, e := range hoppers[0].Env {
			if e.Name == "OTEL_EXPORTER_OTLP_HEADERS" || e.Name == "OTEL_EXPORTER_OTLP_CERTIFICATE" {
				t.Errorf("%v: %s is set", args, e.Name)
			}
		}
		if volumeMountAt(hoppers[0], "/etc/hopper/otel") != nil {
			t.Errorf("%v: the collector CA is mounted", args)
		}
	}
}

// TestChartSecretsReject: a Secret given twice, or for the wrong kind of
// endpoint, fails the render with a message naming the values.
func TestChartSecretsReject(t *testing.T) {
	minimal := repoPath(chartDir, "ci", "minimal-values.yaml")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"token twice", []string{"--set", "app.auth.token.existingSecret=s", "--set", "config.app.auth.token.file=/x"}, "set app.auth.token.existingSecret or config.app.auth.token.file, not both"},
		{"hmac twice", []string{"--set", "app.auth.hmac.existingSecret=s", "--set", "config.app.auth.hmac.keyFile=/x"}, "set app.auth.hmac.existingSecret or config.app.auth.hmac.keyFile, not both"},
		{"token without key", []string{"--set", "app.auth.token.existingSecret=s", "--set", "app.auth.token.key="}, "app.auth.token.key is required"},
		{"webhook secrets without key", []string{"--set", "app.auth.standardWebhooks.existingSecret=s", "--set", "app.auth.standardWebhooks.key="}, "app.auth.standardWebhooks.key is required with app.auth.standardWebhooks.existingSecret: the Secret's key holding the Standard Webhooks secrets"},
		{"webhook secrets twice", []string{"--set", "app.auth.standardWebhooks.existingSecret=s", "--set", "config.app.auth.standardWebhooks.secretFile=/x"}, "set app.auth.standardWebhooks.existingSecret or config.app.auth.standardWebhooks.secretFile, not both"},
		{"service-account token and token Secret", []string{"--set", "app.auth.serviceAccountToken.audience=a", "--set", "app.auth.token.existingSecret=s"}, "set app.auth.serviceAccountToken.audience or app.auth.token.existingSecret, not both"},
		{"service-account token and token file", []string{"--set", "app.auth.serviceAccountToken.audience=a", "--set", "config.app.auth.token.file=/x"}, "set app.auth.serviceAccountToken.audience or config.app.auth.token.file, not both"},
		{"service-account token too short", []string{"--set", "app.auth.serviceAccountToken.audience=a", "--set", "app.auth.serviceAccountToken.expirationSeconds=599"}, "expirationSeconds"},
		{"service-account token unknown key", []string{"--set", "app.auth.serviceAccountToken.path=x"}, "additional properties 'path' not allowed"},
		{"app tls twice", []string{"--set", "app.tls.existingSecret=s", "--set", "config.app.tls.caFile=/x"}, "set app.tls.existingSecret or config.app.tls.caFile, not both"},
		{"app tls on http", []string{"--set", "app.tls.existingSecret=s", "--set", "config.app.url=http://127.0.0.1:8080/"}, "app.tls.existingSecret is for an https:// app"},
		{"app client cert without key", []string{"--set", "app.tls.existingSecret=s", "--set", "app.tls.certKey=tls.crt"}, "app.tls.certKey and keyKey must be given together"},
		{"app client cert without secret", []string{"--set", "app.tls.certKey=tls.crt", "--set", "app.tls.keyKey=tls.key"}, "app.tls.certKey/keyKey need app.tls.existingSecret"},
		{"unknown app.auth key", []string{"--set", "app.auth.token.secret=s"}, "additional properties 'secret' not allowed"},
		{"otel ca on plain text", []string{"--set", "otel.enabled=true", "--set", "otel.endpoint=http://c:4318", "--set", "otel.caSecret.name=ca"}, "otel.caSecret is the CA of a TLS collector"},
		{"otel headers without key", []string{"--set", "otel.enabled=true", "--set", "otel.endpoint=https://c:4318", "--set", "otel.headersSecret.name=h", "--set", "otel.headersSecret.key="}, "otel.headersSecret.key is required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := templateArgs(renderCase{chart: repoPath(chartDir), args: append([]string{"-f", minimal}, c.args...)})
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

// TestChartImageRegistry: global.imageRegistry puts every image the chart
// renders (the app's, Hopper's, the tool Job's) behind one registry,
// replacing the registry each repository names, and reaches the sidecar a
// parent chart includes through the parent's global block.
func TestChartImageRegistry(t *testing.T) {
	minimal := repoPath(chartDir, "ci", "minimal-values.yaml")
	cases := []struct {
		name string
		args []string
		want map[string]string // container name -> image
	}{
		{"off", []string{"-f", minimal, "--set", "dlqJob.enabled=true"}, map[string]string{
			"app": "registry.example.com/orders-api:1.4.2", "hopper": "ghcr.io/hopper-sidecar/hopper:0.1.0"}},
		{"replaces the registry", []string{"-f", minimal, "--set", "dlqJob.enabled=true", "--set", "global.imageRegistry=mirror.internal:5000/base/"}, map[string]string{
			"app": "mirror.internal:5000/base/orders-api:1.4.2", "hopper": "mirror.internal:5000/base/hopper-sidecar/hopper:0.1.0"}},
		{"prefixes a repository without one", []string{"-f", minimal, "--set", "global.imageRegistry=mirror.internal",
			"--set", "app.image.repository=library/nginx", "--set", "image.repository=localhost:5000/hopper", "--set", "image.digest=sha256:" + strings.Repeat("ab", 32)}, map[string]string{
			"app": "mirror.internal/library/nginx:1.4.2", "hopper": "mirror.internal/hopper@sha256:" + strings.Repeat("ab", 32)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ms := renderChart(t, c.args...)
			n := 0
			pods, _ := hopperPods(t, ms)
			for _, p := range pods {
				for _, ct := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
					n++
					if want, ok := c.want[ct.Name]; !ok || ct.Image != want {
						t.Errorf("container %s image %q, want %q", ct.Name, ct.Image, want)
					}
				}
			}
			if n < 2 {
				t.Errorf("only %d containers rendered", n)
			}
		})
	}
	t.Run("parent", func(t *testing.T) {
		args := templateArgs(renderCase{chart: parentChart(t), args: []string{"--set", "global.imageRegistry=mirror.internal"}})
		stdout, stderr, err := runHelm(t, args...)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		pods, hoppers := hopperPods(t, decodeManifests(t, stdout))
		if len(pods) != 1 || hoppers[0].Image != "mirror.internal/hopper-sidecar/hopper:0.1.0" {
			t.Errorf("the parent's sidecar image %q, want it from the parent's global.imageRegistry", hoppers[0].Image)
		}
	})
}
