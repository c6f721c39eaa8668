package packaging

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// repoRoot is the repository's top folder (this package is internal/packaging).
var repoRoot = func() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		panic("packaging: cannot locate the test source")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}()

// scratch is a temporary folder for the whole test run (helm's home, the
// built binary), removed by TestMain.
var scratch string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hopper-packaging-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	scratch = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func inCI() bool { return os.Getenv("CI") == "true" }

// repoPath joins slash-separated parts onto the repository root.
func repoPath(parts ...string) string {
	return filepath.Join(append([]string{repoRoot}, parts...)...)
}

func readRepoFile(t *testing.T, parts ...string) string {
	t.Helper()
	b, err := os.ReadFile(repoPath(parts...))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// ---- helm ----

var (
	helmOnce sync.Once
	helmBin  string
	helmErr  error
)

// helm returns the helm binary: $HELM, else .cache/bin/helm. When that is
// missing it is installed by scripts/install-helm.sh, except in CI, where the
// CI script must have installed it and its absence fails the test.
func helm(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() { helmBin, helmErr = findHelm() })
	if helmErr != nil {
		t.Fatal(helmErr)
	}
	return helmBin
}

func findHelm() (string, error) {
	if p := os.Getenv("HELM"); p != "" {
		return p, nil
	}
	cached := repoPath(".cache", "bin", "helm")
	if isExecutable(cached) {
		return cached, nil
	}
	if inCI() {
		return "", fmt.Errorf("helm is not installed at %s: CI must run scripts/install-helm.sh before the tests (.ci/run does); the chart tests never skip in CI", cached)
	}
	fmt.Fprintf(os.Stderr, "packaging: helm missing, running scripts/install-helm.sh (about 2 minutes on a cold cache)\n")
	cmd := exec.Command(repoPath("scripts", "install-helm.sh"))
	cmd.Dir = repoRoot
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("scripts/install-helm.sh: %w", err)
	}
	if !isExecutable(cached) {
		return "", fmt.Errorf("scripts/install-helm.sh ran but %s is missing", cached)
	}
	return cached, nil
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// helmEnv keeps helm away from the user's helm config, cache and repositories.
var helmEnv = sync.OnceValue(func() []string {
	dir := filepath.Join(scratch, "helm-home")
	return []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"HELM_CACHE_HOME=" + filepath.Join(dir, "cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(dir, "config"),
		"HELM_DATA_HOME=" + filepath.Join(dir, "data"),
	}
})

// runHelm runs helm with args and returns stdout, stderr and the error.
func runHelm(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, helm(t), args...)
	cmd.Dir = repoRoot
	cmd.Env = helmEnv()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// ---- the hopper binary, built with the Makefile's build command ----

var (
	hopperOnce sync.Once
	hopperBin  string
	hopperErr  error
)

// buildVersion is stamped into the test binary through the Makefile's VERSION.
const buildVersion = "v0.0.0-packaging-test"

// hopperBinary builds cmd/hopper once per test run with the exact command
// `make build` runs (read with `make -n`), writing to a temporary folder
// instead of bin/ so that the test never replaces a developer's build.
func hopperBinary(t *testing.T) string {
	t.Helper()
	hopperOnce.Do(func() { hopperBin, hopperErr = buildHopper() })
	if hopperErr != nil {
		t.Fatal(hopperErr)
	}
	return hopperBin
}

// makeBuildCommand is the recipe `make build` runs, as printed by `make -n`.
func makeBuildCommand() (string, error) {
	if _, err := exec.LookPath("make"); err != nil {
		return "", fmt.Errorf("make is not installed (.ci/run installs it): %w", err)
	}
	cmd := exec.Command("make", "--no-print-directory", "-n", "build", "VERSION="+buildVersion, "GO=go")
	cmd.Dir = repoRoot
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("make -n build: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

func buildHopper() (string, error) {
	recipe, err := makeBuildCommand()
	if err != nil {
		return "", err
	}
	if strings.Count(recipe, " -o bin/hopper ") != 1 || strings.Contains(recipe, "\n") {
		return "", fmt.Errorf("make build should be one command writing -o bin/hopper, got:\n%s", recipe)
	}
	bin := filepath.Join(scratch, "bin", "hopper")
	shell := strings.Replace(recipe, " -o bin/hopper ", " -o "+bin+" ", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", shell)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building hopper with the Makefile's command failed: %v\n$ %s\n%s", err, shell, out)
	}
	return bin, nil
}

// isStatic reports whether the ELF file has no program interpreter and no
// dynamic section, i.e. runs on distroless/static or scratch.
func isStatic(path string) (bool, error) {
	f, err := elf.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			return false, nil
		}
	}
	return true, nil
}

// runHopper runs the hopper binary with exactly env (no inherited HOPPER_*).
func runHopper(t *testing.T, env []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	// Built (once, minutes on a cold cache) before the run's own timeout starts.
	bin := hopperBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("running hopper: %v", err)
	}
	return out.String(), errb.String(), err
}
