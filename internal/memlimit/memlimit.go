// Package memlimit reads the memory limit of the container Hopper runs in
// and fits the Go runtime's soft memory limit under it.
//
// The limit is the one of the process's own memory cgroup, found through
// /proc/self/cgroup and /proc/self/mountinfo, not the one at the root of
// the cgroup file system: without a cgroup namespace (cgroup v1 in most
// Kubernetes nodes, or a process placed in a child cgroup) the root shows
// the whole machine, unlimited, while the container's limit sits in a
// nested directory. Limits are hierarchical, so the tightest one on the
// way from the own cgroup up to the mount point is the one that kills.
package memlimit

import (
	"bufio"
	"bytes"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// unlimited is where cgroup v1 reports "no limit" (a page-rounded
// maximum int64); anything at or above it is no limit.
const unlimited = 1 << 62

// Container returns the memory limit of the cgroup this process runs in;
// ok is false when there is none or it cannot be read. root is the file
// system root the /proc and /sys paths are read under: "/" in production.
func Container(root string) (limit int64, ok bool) {
	for _, dir := range ownCgroupDirs(root) {
		if l, found := tightest(dir); found {
			return l, true
		}
	}
	return 0, false
}

// cgroupDir is one place a memory limit may be read from: the own
// cgroup's directory, its mount point (above which nothing is visible) and
// the file that holds the limit there.
type cgroupDir struct {
	own, mount, file string
}

// ownCgroupDirs lists the directories of the process's own memory cgroup,
// v2 (unified) first, then v1. When /proc/self/cgroup or mountinfo cannot
// be read, the conventional mount points stand in for the own cgroup, as
// they do inside a cgroup namespace.
func ownCgroupDirs(root string) []cgroupDir {
	paths := selfCgroups(filepath.Join(root, "proc", "self", "cgroup"))
	mounts := cgroupMounts(filepath.Join(root, "proc", "self", "mountinfo"))
	var dirs []cgroupDir
	add := func(m mount, cgPath, file string) {
		mp := filepath.Join(root, m.point)
		own := mp
		// The mount shows the hierarchy from m.root down: a path outside it
		// (another cgroup namespace) can only be the mount point itself.
		if rel, ok := within(cgPath, m.root); ok {
			own = filepath.Join(mp, filepath.FromSlash(rel))
		}
		dirs = append(dirs, cgroupDir{own: own, mount: mp, file: file})
	}
	if p, ok := paths[""]; ok {
		for _, m := range mounts {
			if m.fstype == "cgroup2" {
				add(m, p, "memory.max")
			}
		}
	}
	if p, ok := paths["memory"]; ok {
		for _, m := range mounts {
			if m.fstype == "cgroup" && m.memory {
				add(m, p, "memory.limit_in_bytes")
			}
		}
	}
	if len(dirs) == 0 {
		sys := filepath.Join(root, "sys", "fs", "cgroup")
		dirs = []cgroupDir{
			{own: sys, mount: sys, file: "memory.max"},
			{own: filepath.Join(sys, "memory"), mount: filepath.Join(sys, "memory"), file: "memory.limit_in_bytes"},
		}
	}
	return dirs
}

// within returns p relative to base when p is base or below it.
func within(p, base string) (string, bool) {
	p, base = path.Clean("/"+p), path.Clean("/"+base)
	if base == "/" {
		return strings.TrimPrefix(p, "/"), true
	}
	if p == base {
		return "", true
	}
	if strings.HasPrefix(p, base+"/") {
		return strings.TrimPrefix(p, base+"/"), true
	}
	return "", false
}

// tightest returns the lowest limit from d.own up to d.mount; found is
// false when no directory on the way has a limit.
func tightest(d cgroupDir) (limit int64, found bool) {
	dir := d.own
	for {
		if l, ok := readLimit(filepath.Join(dir, d.file)); ok && (!found || l < limit) {
			limit, found = l, true
		}
		if dir == d.mount || !strings.HasPrefix(dir, d.mount+string(filepath.Separator)) {
			return limit, found
		}
		dir = filepath.Dir(dir)
	}
}

// readLimit reads one limit file: a byte count, or "max" (v2) or a
// value near the largest int64 (v1) for none.
func readLimit(file string) (int64, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	v := strings.TrimSpace(string(b))
	if v == "max" {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || n >= unlimited {
		return 0, false
	}
	return n, true
}

// selfCgroups reads /proc/self/cgroup ("id:controllers:path" per line):
// the v2 path under key "", each v1 controller's path under its name.
func selfCgroups(file string) map[string]string {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	paths := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			paths[""] = parts[2]
			continue
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			paths[ctl] = parts[2]
		}
	}
	return paths
}

// mount is one cgroup file system from mountinfo.
type mount struct {
	root, point, fstype string
	memory              bool // a v1 hierarchy with the memory controller
}

// cgroupMounts reads the cgroup and cgroup2 mounts of mountinfo: fields
// "id parent major:minor root mountpoint options [optional...] - fstype
// source superoptions".
func cgroupMounts(file string) []mount {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	var mounts []mount
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		left, right, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		lf, rf := strings.Fields(left), strings.Fields(right)
		if len(lf) < 5 || len(rf) < 1 || (rf[0] != "cgroup" && rf[0] != "cgroup2") {
			continue
		}
		m := mount{root: unescape(lf[3]), point: unescape(lf[4]), fstype: rf[0]}
		if len(rf) >= 3 {
			for _, o := range strings.Split(rf[2], ",") {
				m.memory = m.memory || o == "memory"
			}
		}
		mounts = append(mounts, m)
	}
	return mounts
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and
// backslash.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Share is the part of a container's limit the Go runtime may use, and
// Reserve what it leaves at the least: the rest is for what the limit
// counts and the runtime's soft limit does not, the binary's pages (about
// 10 MiB of text), and for the heap running past the soft limit while the
// collector catches up (about 10 MiB with 8 MiB messages). In a 64 MiB
// container 10% was too little: with 8 MiB messages the runtime grew to
// its soft limit and the cgroup's usage reached 63.4 of its 64 MiB, held
// off only by the kernel dropping the binary's pages.
const (
	Share   = 0.9
	Reserve = 24 << 20
)

// Fit returns want, or what the container's limit leaves the runtime when
// that is lower (capped true): Share of it, at most the limit less
// Reserve, never below half of it. A soft limit above the container's
// would let the heap grow until the container is killed.
func Fit(want, container int64) (limit int64, capped bool) {
	if container <= 0 {
		return want, false
	}
	c := min(int64(float64(container)*Share), max(container-Reserve, container/2))
	if c < want {
		return c, true
	}
	return want, false
}
