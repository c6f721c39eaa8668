package packaging

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hopper-sidecar/hopper/config"
)

// No container engine runs here, so the image cannot be built in tests. What
// these tests prove instead: the Dockerfile builds with the Makefile's own
// command (which the next test runs), and the image it describes is static,
// non-root, shell-free and read-only friendly.

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	line int
	cmd  string // upper case: FROM, RUN, ...
	args string
}

type stage struct {
	name, base string
	from       instruction
	body       []instruction
}

func parseDockerfile(t *testing.T, text string) []stage {
	t.Helper()
	var (
		ins     []instruction
		cur     strings.Builder
		start   int
		escaped bool
	)
	sc := bufio.NewScanner(strings.NewReader(text))
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue // comments may sit between continuation lines too
		}
		if !escaped {
			start = n
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`) + " ")
			escaped = true
			continue
		}
		cur.WriteString(trimmed)
		escaped = false
		full := cur.String()
		cur.Reset()
		cmd, args, _ := strings.Cut(full, " ")
		ins = append(ins, instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
	}
	if escaped {
		t.Fatal("Dockerfile ends inside a continuation line")
	}
	var stages []stage
	for _, in := range ins {
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			var rest []string
			for _, w := range f {
				if !strings.HasPrefix(w, "--") {
					rest = append(rest, w)
				}
			}
			if len(rest) == 0 {
				t.Fatalf("line %d: FROM without an image", in.line)
			}
			st := stage{base: rest[0], from: in}
			if len(rest) == 3 && strings.EqualFold(rest[1], "AS") {
				st.name = rest[2]
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("line %d: %s before the first FROM", in.line, in.cmd)
			}
			continue
		}
		stages[len(stages)-1].body = append(stages[len(stages)-1].body, in)
	}
	return stages
}

func (s stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.body {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

func (s stage) index(pred func(instruction) bool) int {
	return slices.IndexFunc(s.body, pred)
}

// makeBuildRecipe is the Makefile's build recipe, as written.
func makeBuildRecipe(t *testing.T) string {
	t.Helper()
	mk := readRepoFile(t, "Makefile")
	lines := strings.Split(mk, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "build:") {
			var recipe []string
			for _, r := range lines[i+1:] {
				if !strings.HasPrefix(r, "\t") {
					break
				}
				recipe = append(recipe, strings.TrimSpace(r))
			}
			return strings.Join(recipe, "\n")
		}
	}
	t.Fatal("Makefile has no build target")
	return ""
}

var makeBuildRE = regexp.MustCompile(`(^|[;&|(]\s*|\s)make(\s+-\S+)*\s+build(\s|$)`)

func TestDockerfileBuildsWithTheMakefileCommand(t *testing.T) {
	stages := parseDockerfile(t, readRepoFile(t, "Dockerfile"))
	if len(stages) < 2 {
		t.Fatalf("want a multi-stage Dockerfile (build + runtime), got %d stage(s)", len(stages))
	}
	build := stages[0]

	// The build image's Go is the go.mod's (major.minor).
	gomod := readRepoFile(t, "go.mod")
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	dockerfile := readRepoFile(t, "Dockerfile")
	goVersion := m[1]
	argDefault := regexp.MustCompile(`(?m)^ARG GO_VERSION=(\S+)`).FindStringSubmatch(dockerfile)
	base := build.base
	if argDefault != nil {
		base = strings.ReplaceAll(base, "${GO_VERSION}", argDefault[1])
	}
	if !regexp.MustCompile(`^golang:` + regexp.QuoteMeta(goVersion) + `(\.\d+)?-bookworm$`).MatchString(base) {
		t.Errorf("build stage FROM %s (= %s): want golang:%s-bookworm, the go.mod's Go on a pinned Debian", build.base, base, goVersion)
	}
	if build.name == "" {
		t.Error("the build stage should be named (FROM ... AS build) so the runtime stage copies from it by name")
	}

	// go mod download runs in its own layer, after copying only go.mod/go.sum.
	runs := build.all("RUN")
	dl := build.index(func(in instruction) bool { return in.cmd == "RUN" && strings.Contains(in.args, "go mod download") })
	copyMod := build.index(func(in instruction) bool {
		return in.cmd == "COPY" && strings.Contains(in.args, "go.mod") && strings.Contains(in.args, "go.sum") && !strings.Contains(in.args, " . ")
	})
	copyAll := build.index(func(in instruction) bool { return in.cmd == "COPY" && strings.HasPrefix(in.args, ". ") })
	switch {
	case dl < 0:
		t.Error("build stage: no RUN go mod download (the dependency layer)")
	case copyMod < 0 || copyMod > dl:
		t.Error("build stage: COPY go.mod go.sum must come before RUN go mod download")
	case copyAll < 0 || copyAll < dl:
		t.Error("build stage: COPY . . must come after RUN go mod download, so the dependency layer is cached")
	}

	// The binary is built by `make build`, i.e. the Makefile's own command.
	var makeRuns []instruction
	for _, r := range runs {
		if makeBuildRE.MatchString(r.args) {
			makeRuns = append(makeRuns, r)
		}
		if strings.Contains(r.args, "go build") {
			t.Errorf("line %d: the Dockerfile runs go build itself; run `make build` so it cannot drift from the Makefile", r.line)
		}
	}
	if len(makeRuns) != 1 {
		t.Fatalf("build stage: want exactly one RUN ... make build, got %d", len(makeRuns))
	}
	if !strings.Contains(makeRuns[0].args, "VERSION=") {
		t.Errorf("line %d: pass VERSION to make build (there is no .git in the build context for git describe)", makeRuns[0].line)
	}
	recipe := makeBuildRecipe(t)
	const wantRecipe = `CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o bin/hopper ./cmd/hopper`
	if recipe != wantRecipe {
		t.Errorf("Makefile build recipe changed:\n got %q\nwant %q\n(update this test and the Dockerfile's COPY --from together)", recipe, wantRecipe)
	}

	// make must exist in the build image: installed when missing.
	if !strings.Contains(dockerfile, "command -v make") {
		t.Error("build stage should install make when the base image lacks it")
	}

	// The runtime stage copies exactly what make build wrote.
	final := stages[len(stages)-1]
	workdir := "/"
	for _, in := range build.all("WORKDIR") {
		workdir = path.Join(workdir, in.args)
	}
	wantSrc := path.Join(workdir, "bin/hopper")
	copies := final.all("COPY")
	if len(copies) != 1 {
		t.Fatalf("runtime stage: want one COPY (the binary), got %d", len(copies))
	}
	f := strings.Fields(copies[0].args)
	if len(f) != 3 || f[0] != "--from="+build.name || f[1] != wantSrc {
		t.Errorf("runtime stage: COPY %s; want COPY --from=%s %s <dest>", copies[0].args, build.name, wantSrc)
	}
}

func TestDockerfileRuntimeStage(t *testing.T) {
	stages := parseDockerfile(t, readRepoFile(t, "Dockerfile"))
	final := stages[len(stages)-1]

	if final.base != "scratch" && !strings.HasPrefix(final.base, "gcr.io/distroless/static") {
		t.Errorf("runtime stage FROM %s: want gcr.io/distroless/static* or scratch", final.base)
	}
	if strings.HasSuffix(final.base, ":latest") || (!strings.Contains(final.base, ":") && final.base != "scratch") {
		t.Errorf("runtime stage FROM %s: pin a tag", final.base)
	}
	for _, in := range final.body {
		switch in.cmd {
		case "RUN", "SHELL", "ADD", "VOLUME", "ONBUILD":
			t.Errorf("line %d: %s in the runtime stage (no shell there; nothing may run or be written at build or run time)", in.line, in.cmd)
		case "HEALTHCHECK":
			if !strings.EqualFold(strings.TrimSpace(in.args), "NONE") {
				t.Errorf("line %d: HEALTHCHECK needs a shell or a client in the image; Kubernetes probes /healthz and /readyz", in.line)
			}
		}
	}

	// Non-root: the last USER is a numeric, non-zero UID (Kubernetes'
	// runAsNonRoot can only verify numeric users).
	users := final.all("USER")
	if len(users) == 0 {
		t.Fatal("runtime stage has no USER: the image would run as root")
	}
	uid, _, _ := strings.Cut(users[len(users)-1].args, ":")
	n, err := strconv.Atoi(uid)
	if err != nil || n == 0 {
		t.Errorf("USER %s: want a numeric non-root UID such as 65532", users[len(users)-1].args)
	}
	if err == nil && n != 65532 {
		t.Errorf("USER %d: the chart's securityContext runs Hopper as 65532 (distroless nonroot)", n)
	}

	// Exec-form entrypoint on the copied binary; run by default.
	var dest string
	if c := final.all("COPY"); len(c) == 1 {
		f := strings.Fields(c[0].args)
		dest = f[len(f)-1]
	}
	wantJSON := func(cmd string, want []string) {
		ins := final.all(cmd)
		if len(ins) != 1 {
			t.Errorf("runtime stage: want one %s, got %d", cmd, len(ins))
			return
		}
		var got []string
		if err := json.Unmarshal([]byte(ins[0].args), &got); err != nil {
			t.Errorf("line %d: %s must be exec form (JSON array; there is no shell): %v", ins[0].line, cmd, err)
			return
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s %q, want %q", cmd, got, want)
		}
	}
	wantJSON("ENTRYPOINT", []string{dest})
	wantJSON("CMD", []string{"run"})
	if dest != "/hopper" {
		t.Errorf("binary copied to %q, want /hopper", dest)
	}

	// The exposed port is Hopper's default admin port.
	_, port, err := net.SplitHostPort(config.Default().Admin.Listen)
	if err != nil {
		t.Fatal(err)
	}
	var exposed []string
	for _, in := range final.all("EXPOSE") {
		for _, p := range strings.Fields(in.args) {
			exposed = append(exposed, strings.TrimSuffix(p, "/tcp"))
		}
	}
	if !slices.Contains(exposed, port) {
		t.Errorf("EXPOSE %v: want the default admin port %s (admin.listen %q)", exposed, port, config.Default().Admin.Listen)
	}

	// HOPPER_CONFIG names the file the chart mounts.
	if !slices.ContainsFunc(final.all("ENV"), func(in instruction) bool {
		return in.args == "HOPPER_CONFIG="+chartConfigPath || in.args == "HOPPER_CONFIG "+chartConfigPath
	}) {
		t.Errorf("runtime stage: want ENV HOPPER_CONFIG=%s (where the chart mounts the config)", chartConfigPath)
	}

	// OCI labels.
	labels := strings.Join(func() []string {
		var l []string
		for _, in := range final.all("LABEL") {
			l = append(l, in.args)
		}
		return l
	}(), " ")
	for _, k := range []string{"title", "description", "source", "version", "revision", "created"} {
		if !strings.Contains(labels, "org.opencontainers.image."+k+"=") {
			t.Errorf("runtime stage: missing LABEL org.opencontainers.image.%s", k)
		}
	}
}

func TestDockerignore(t *testing.T) {
	var entries []string
	for _, l := range strings.Split(readRepoFile(t, ".dockerignore"), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			entries = append(entries, l)
		}
	}
	for _, want := range []string{".git", ".cache", "bin"} {
		if !slices.Contains(entries, want) && !slices.Contains(entries, want+"/") {
			t.Errorf(".dockerignore should exclude %s", want)
		}
	}
	// The build needs the module, the Makefile and every Go package.
	for _, e := range entries {
		if strings.HasPrefix(e, "!") {
			continue
		}
		for _, need := range []string{"go.mod", "go.sum", "Makefile", "cmd", "cmd/hopper", "*", "*.go", "**/*.go", "config"} {
			if strings.TrimSuffix(e, "/") == need {
				t.Errorf(".dockerignore excludes %s, which the build needs", e)
			}
		}
	}
}

// TestBinaryIsStatic builds cmd/hopper with the Makefile's command (what the
// Dockerfile runs) and checks the binary runs on distroless/static: no
// dynamic loader, and the version stamped through VERSION.
func TestBinaryIsStatic(t *testing.T) {
	recipe, err := makeBuildCommand()
	if err != nil {
		if inCI() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	if !strings.HasPrefix(recipe, "CGO_ENABLED=0 ") || !strings.Contains(recipe, "-X main.version="+buildVersion) {
		t.Errorf("make -n build: %q; want CGO_ENABLED=0 and -X main.version=$(VERSION)", recipe)
	}
	bin := hopperBinary(t)
	static, err := isStatic(bin)
	if err != nil {
		t.Fatal(err)
	}
	if !static {
		t.Error("the binary make build produces is dynamically linked; distroless/static has no libc")
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("hopper --version: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), buildVersion) {
		t.Errorf("hopper --version = %q, want it to contain %q (VERSION stamped by make build)", out, buildVersion)
	}
	// The image configures Hopper through ENV HOPPER_CONFIG alone.
	cfg := writeTemp(t, "hopper.yaml", "queue:\n  name: orders\n")
	stdout, stderr, err := runHopper(t, []string{"HOPPER_CONFIG=" + cfg}, "config", "validate")
	if err != nil || !strings.Contains(stdout, `config OK: queue "orders"`) {
		t.Errorf("HOPPER_CONFIG=%s hopper config validate: %v\n%s%s", cfg, err, stdout, stderr)
	}
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
