//go:build !linux

package faults

// dropPageCache: only Linux has memory cgroups to charge the pages to.
func dropPageCache(string) error { return nil }
