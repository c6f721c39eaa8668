// Package memlimit reads the memory limit of the container Hopper runs in
// and fits the Go runtime's soft memory limit under it.
package memlimit

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// unlimited is where cgroup v1 reports "no limit" (a page-rounded
// maximum int64); anything at or above it is no limit.
const unlimited = 1 << 62

// Container returns the memory limit of the cgroup mounted at root
// (normally /sys/fs/cgroup), cgroup v2's memory.max or v1's
// memory/memory.limit_in_bytes; ok is false when there is none or it
// cannot be read.
func Container(root string) (limit int64, ok bool) {
	for _, f := range []string{"memory.max", filepath.Join("memory", "memory.limit_in_bytes")} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			continue
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
	return 0, false
}

// Share is the part of a container's limit the Go runtime may use: the
// rest is for what the limit counts and the runtime does not, the
// binary's pages above all.
const Share = 0.9

// Fit returns want, or Share of the container's limit when that is lower
// (capped true): a soft limit above the container's would let the heap
// grow until the container is killed.
func Fit(want, container int64) (limit int64, capped bool) {
	if container <= 0 {
		return want, false
	}
	if c := int64(float64(container) * Share); c < want {
		return c, true
	}
	return want, false
}
