package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstallScriptRefreshesStaleLists runs the RabbitMQ install script's
// apt_install against an apt whose lists came with the image: it knows
// each package, but at a version the mirror no longer has, so an install
// fails until apt-get update has run. Every package the script installs
// goes through it, mmdebstrap as well as rabbitmq-server.
func TestInstallScriptRefreshesStaleLists(t *testing.T) {
	bin := t.TempDir()
	calls := filepath.Join(bin, "calls")
	stub := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	stub("apt-cache", `exit 0 # the stale lists know every package`+"\n")
	stub("apt-get", `echo "apt-get $*" >>`+calls+`
case "$1" in
update) touch `+filepath.Join(bin, "updated")+` ;;
install)
	[ -e `+filepath.Join(bin, "updated")+` ] && exit 0
	echo "E: Can't find a source to download version '1.0-1' of 'pkg:amd64'" >&2
	exit 100 ;;
esac
`)
	for _, pkg := range []string{"mmdebstrap", "rabbitmq-server"} {
		os.Remove(filepath.Join(bin, "updated"))
		os.Remove(calls)
		cmd := exec.Command("bash", "-c", `source "$1" all && apt_install "$2"`, "bash", repoPath("scripts", "install-rabbitmq.sh"), pkg)
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", pkg, err, out)
		}
		got, err := os.ReadFile(calls)
		if err != nil {
			t.Fatal(err)
		}
		want := "apt-get install -y --no-install-recommends " + pkg + "\napt-get update\napt-get install -y --no-install-recommends " + pkg + "\n"
		if string(got) != want {
			t.Errorf("%s: apt-get calls\n%s\nwant\n%s", pkg, got, want)
		}
		if !strings.Contains(string(out), "running apt-get update and retrying") {
			t.Errorf("%s: the retry is not logged:\n%s", pkg, out)
		}
	}
}
