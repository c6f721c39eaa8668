package memlimit

import (
	"os"
	"path/filepath"
	"testing"
)

func TestContainer(t *testing.T) {
	cases := []struct {
		name, file, content string
		limit               int64
		ok                  bool
	}{
		{"v2 limit", "memory.max", "134217728\n", 134217728, true},
		{"v2 none", "memory.max", "max\n", 0, false},
		{"v1 limit", "memory/memory.limit_in_bytes", "268435456\n", 268435456, true},
		{"v1 none", "memory/memory.limit_in_bytes", "9223372036854771712\n", 0, false},
		{"garbage", "memory.max", "lots\n", 0, false},
		{"no cgroup files", "", "", 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if tc.file != "" {
				p := filepath.Join(root, tc.file)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
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
	const mib = 1 << 20
	cases := []struct {
		name            string
		want, container int64
		limit           int64
		capped          bool
	}{
		{"no container limit", 128 * mib, 0, 128 * mib, false},
		{"room under the container's", 128 * mib, 512 * mib, 128 * mib, false},
		{"the chart's 128Mi", 128 * mib, 128 * mib, 120795955, true},
	}
	for _, tc := range cases {
		limit, capped := Fit(tc.want, tc.container)
		if limit != tc.limit || capped != tc.capped {
			t.Errorf("%s: Fit() = %d, %v; want %d, %v", tc.name, limit, capped, tc.limit, tc.capped)
		}
	}
}
