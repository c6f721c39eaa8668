package memlimit

import (
	"os"
	"path/filepath"
	"testing"
)

const mib = 1 << 20

// Mount tables as the kernel writes them.
const (
	mountsV2 = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
	mountsV1 = "31 23 0:28 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n" +
		"32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n" +
		"35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" +
		"41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
	// A container without a cgroup namespace: the mount's root is the
	// container's own cgroup, while /proc/self/cgroup shows the host path.
	mountsV1Container = "1200 1190 0:32 /kubepods/burstable/pod1/c1 /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n"
	// A mount point with a space in it, escaped as mountinfo does.
	mountsV2Escaped = "29 23 0:26 / /sys/fs/my\\040cgroup rw - cgroup2 cgroup2 rw\n"
)

func TestContainer(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string // path under the fake root → content
		limit int64
		ok    bool
	}{
		{
			name: "v2 nested own cgroup",
			files: map[string]string{
				"proc/self/cgroup":                          "0::/kubepods/pod1/c1\n",
				"proc/self/mountinfo":                       mountsV2,
				"sys/fs/cgroup/memory.max":                  "max\n",
				"sys/fs/cgroup/kubepods/memory.max":         "max\n",
				"sys/fs/cgroup/kubepods/pod1/c1/memory.max": "134217728\n",
			},
			limit: 128 * mib, ok: true,
		},
		{
			name: "v2 own max, parent limited",
			files: map[string]string{
				"proc/self/cgroup":                          "0::/kubepods/pod1/c1\n",
				"proc/self/mountinfo":                       mountsV2,
				"sys/fs/cgroup/kubepods/pod1/memory.max":    "268435456\n",
				"sys/fs/cgroup/kubepods/pod1/c1/memory.max": "max\n",
			},
			limit: 256 * mib, ok: true,
		},
		{
			name: "v2 the tightest of own and parent",
			files: map[string]string{
				"proc/self/cgroup":             "0::/a/b\n",
				"proc/self/mountinfo":          mountsV2,
				"sys/fs/cgroup/a/memory.max":   "67108864\n",
				"sys/fs/cgroup/a/b/memory.max": "134217728\n",
			},
			limit: 64 * mib, ok: true,
		},
		{
			name: "v2 max everywhere",
			files: map[string]string{
				"proc/self/cgroup":           "0::/a\n",
				"proc/self/mountinfo":        mountsV2,
				"sys/fs/cgroup/memory.max":   "max\n",
				"sys/fs/cgroup/a/memory.max": "max\n",
			},
			ok: false,
		},
		{
			name: "v2 in a cgroup namespace (path /)",
			files: map[string]string{
				"proc/self/cgroup":         "0::/\n",
				"proc/self/mountinfo":      mountsV2,
				"sys/fs/cgroup/memory.max": "134217728\n",
			},
			limit: 128 * mib, ok: true,
		},
		{
			name: "v2 mount point escaped in mountinfo",
			files: map[string]string{
				"proc/self/cgroup":              "0::/c\n",
				"proc/self/mountinfo":           mountsV2Escaped,
				"sys/fs/my cgroup/c/memory.max": "33554432\n",
			},
			limit: 32 * mib, ok: true,
		},
		{
			name: "v1 nested own cgroup, root unlimited",
			files: map[string]string{
				"proc/self/cgroup":                                                   "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/e8b4/hopper\n1:cpu:/\n0::/\n",
				"proc/self/mountinfo":                                                mountsV1,
				"sys/fs/cgroup/memory/memory.limit_in_bytes":                         "9223372036854771712\n",
				"sys/fs/cgroup/memory/process_api/memory.limit_in_bytes":             "9223372036854771712\n",
				"sys/fs/cgroup/memory/process_api/e8b4/memory.limit_in_bytes":        "9223372036854771712\n",
				"sys/fs/cgroup/memory/process_api/e8b4/hopper/memory.limit_in_bytes": "67108864\n",
				// The v2 hierarchy beside it has no memory controller.
				"sys/fs/cgroup/unified/cgroup.procs": "1\n",
			},
			limit: 64 * mib, ok: true,
		},
		{
			name: "v1 controllers listed together",
			files: map[string]string{
				"proc/self/cgroup":    "3:cpu,memory:/job\n",
				"proc/self/mountinfo": "35 31 0:32 / /sys/fs/cgroup/cpu,memory rw - cgroup cgroup rw,cpu,memory\n",
				"sys/fs/cgroup/cpu,memory/job/memory.limit_in_bytes": "100000000\n",
			},
			limit: 100000000, ok: true,
		},
		{
			name: "v1 container: the mount's root is the own cgroup",
			files: map[string]string{
				"proc/self/cgroup":                           "4:memory:/kubepods/burstable/pod1/c1\n",
				"proc/self/mountinfo":                        mountsV1Container,
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "134217728\n",
			},
			limit: 128 * mib, ok: true,
		},
		{
			name: "v1 path outside the mount's root (another namespace): the mount point",
			files: map[string]string{
				"proc/self/cgroup":                           "4:memory:/elsewhere\n",
				"proc/self/mountinfo":                        mountsV1Container,
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "134217728\n",
			},
			limit: 128 * mib, ok: true,
		},
		{
			name: "v1 own cgroup's file missing, parent limited",
			files: map[string]string{
				"proc/self/cgroup":                             "4:memory:/a/b\n",
				"proc/self/mountinfo":                          mountsV1,
				"sys/fs/cgroup/memory/a/memory.limit_in_bytes": "268435456\n",
			},
			limit: 256 * mib, ok: true,
		},
		{
			name: "v1 garbage limit",
			files: map[string]string{
				"proc/self/cgroup":                             "4:memory:/a\n",
				"proc/self/mountinfo":                          mountsV1,
				"sys/fs/cgroup/memory/a/memory.limit_in_bytes": "lots\n",
			},
			ok: false,
		},
		{
			name: "no /proc/self files: the conventional v2 root",
			files: map[string]string{
				"sys/fs/cgroup/memory.max": "134217728\n",
			},
			limit: 128 * mib, ok: true,
		},
		{
			name: "no /proc/self files: the conventional v1 root",
			files: map[string]string{
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "268435456\n",
			},
			limit: 256 * mib, ok: true,
		},
		{
			name:  "nothing at all",
			files: map[string]string{},
			ok:    false,
		},
		{
			name: "own cgroup directory missing",
			files: map[string]string{
				"proc/self/cgroup":    "0::/gone\n",
				"proc/self/mountinfo": mountsV2,
			},
			ok: false,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for name, content := range tc.files {
				p := filepath.Join(root, filepath.FromSlash(name))
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			limit, ok := Container(root)
			if limit != tc.limit || ok != tc.ok {
				t.Errorf("Container() = %d, %v; want %d, %v", limit, ok, tc.limit, tc.ok)
			}
		})
	}
}

func TestFit(t *testing.T) {
	cases := []struct {
		name            string
		want, container int64
		limit           int64
		capped          bool
	}{
		{"no container limit", 128 * mib, 0, 128 * mib, false},
		{"room under the container's", 128 * mib, 512 * mib, 128 * mib, false},
		{"the chart's 128Mi: 24 MiB left", 128 * mib, 128 * mib, 104 * mib, true},
		{"64Mi: 24 MiB left", 128 * mib, 64 * mib, 40 * mib, true},
		{"1Gi: 10% left", 2048 * mib, 1024 * mib, 966367641, true},
		{"32Mi: half of it", 128 * mib, 32 * mib, 16 * mib, true},
	}
	for _, tc := range cases {
		limit, capped := Fit(tc.want, tc.container)
		if limit != tc.limit || capped != tc.capped {
			t.Errorf("%s: Fit() = %d, %v; want %d, %v", tc.name, limit, capped, tc.limit, tc.capped)
		}
	}
}
