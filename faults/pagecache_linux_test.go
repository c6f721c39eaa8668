package faults

import (
	"fmt"
	"os"
	"syscall"
)

// dropPageCache asks the kernel to drop the cached pages of a file no
// process maps, so that the next process to read them is charged for them
// in its own memory cgroup, as a container is for its image's binary.
func dropPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	const dontNeed = 4 // POSIX_FADV_DONTNEED
	if _, _, errno := syscall.Syscall6(syscall.SYS_FADVISE64, f.Fd(), 0, 0, dontNeed, 0, 0); errno != 0 {
		return fmt.Errorf("fadvise %s: %w", path, errno)
	}
	return nil
}
