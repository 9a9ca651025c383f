package actors

import (
	"bufio"
	"bytes"
	"os"
	"path"
	"strconv"
	"strings"
)

// DefaultMemoryBudget returns the memory budget of a node configured with
// none: half of the memory it may use, which is the machine's memory or, when
// the process runs under a cgroup memory limit (a container), that limit if it
// is lower. Half leaves room for what is not Go heap (Badger's memory-mapped
// tables, the page cache that the write-ahead log and Badger read through,
// goroutine stacks) and for other processes. When neither can be read (not
// Linux) it is 1 GiB.
func DefaultMemoryBudget() int64 { return defaultMemoryBudget(os.ReadFile) }

func defaultMemoryBudget(read func(string) ([]byte, error)) int64 {
	total := memTotal(read)
	if lim := cgroupMemoryLimit(read); lim > 0 && (total == 0 || lim < total) {
		total = lim
	}
	if total <= 0 {
		return fallbackMemoryBudget
	}
	return max(total/2, MinMemoryBudget)
}

// memTotal returns MemTotal of /proc/meminfo in bytes, 0 if unknown.
func memTotal(read func(string) ([]byte, error)) int64 {
	b, err := read("/proc/meminfo")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kb <= 0 {
				return 0
			}
			if len(f) >= 3 && f[2] != "kB" {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// cgroupMemoryLimit returns the memory limit of the process's cgroup in bytes,
// 0 when there is none or it cannot be read: the lowest of cgroup v2's
// memory.max of the process's own cgroup (/proc/self/cgroup names it, under
// /sys/fs/cgroup) and of its ancestors (a container sees its own cgroup as the
// root), and of cgroup v1's memory/memory.limit_in_bytes, whose "no limit" is
// a huge number (the caller keeps the machine's memory when that is lower).
func cgroupMemoryLimit(read func(string) ([]byte, error)) int64 {
	paths := []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}
	if b, err := read("/proc/self/cgroup"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			rel, ok := strings.CutPrefix(line, "0::")
			for ok && rel != "/" && rel != "." && rel != "" {
				paths = append(paths, path.Join("/sys/fs/cgroup", rel, "memory.max"))
				rel = path.Dir(rel)
			}
		}
	}
	var limit int64
	for _, p := range paths {
		b, err := read(p)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err == nil && n > 0 && (limit == 0 || n < limit) { // "max" is no limit
			limit = n
		}
	}
	return limit
}
