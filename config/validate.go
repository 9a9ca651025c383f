package config

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Validate checks every value, naming the key of the first wrong one; the serve command calls
// it again after applying flags. It also derives Cold.FS.Dir from DataDir when Cold.FS.Dir
// was not set, so that a flag that moves the data directory moves the default cold directory.
// It reads no environment: an app whose Secret is still empty is refused.
func (c *Config) Validate() error { return c.validate(checker{}) }

// checker makes the errors of validate. Load gives it the file and the line of each key
// path it read, so that an error about a value of the file names its line.
type checker struct {
	file  string
	lines map[string]int
}

// check returns nil for a nil err, else an *Error for key with the line of key, or of the
// nearest enclosing key the file set (apps[0] for a missing apps[0].id).
func (k checker) check(key string, err error) error {
	if err == nil {
		return nil
	}
	e := &Error{Key: key, Msg: err.Error()}
	for at := key; at != "" && k.lines != nil; at = at[:max(strings.LastIndexAny(at, ".["), 0)] {
		if line, ok := k.lines[at]; ok {
			e.File, e.Line = k.file, line
			break
		}
	}
	return e
}

func (c *Config) validate(k checker) error {
	if c.DataDir == "" {
		return k.check("dataDir", errors.New("must not be empty"))
	}
	c.resolveColdDir()
	return first(
		k.check("listen", checkListen(c.Listen)),
		k.check("partitions", checkPartitions(int64(c.Partitions))),
		k.check("idleTimeout", checkPositive(c.IdleTimeout)),
		k.check("maxConnections", checkMaxConnections(int64(c.MaxConnections))),
		k.check("memoryBudget", checkMemoryBudget(c.MemoryBudget)),
		c.validateApps(k),
		c.validateCold(k),
		c.validateCluster(k),
		c.validateTypes(k),
	)
}

func first(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (c *Config) validateApps(k checker) error {
	ids, keys := map[string]int{}, map[string]int{}
	for i, a := range c.Apps {
		at := fmt.Sprintf("apps[%d]", i)
		secretKey, secretErr := at+".secret", checkSecret(a.Secret)
		if a.SecretEnv != "" {
			secretKey = at + ".secretEnv"
			if a.Secret == "" {
				secretErr = fmt.Errorf("environment variable %s is not set or empty", a.SecretEnv)
			} else if secretErr != nil {
				secretErr = fmt.Errorf("the value of %s: %w", a.SecretEnv, secretErr)
			}
		}
		var dup error
		if j, ok := ids[a.ID]; ok {
			dup = k.check(at+".id", fmt.Errorf("%s is already the id of apps[%d]", a.ID, j))
		} else if j, ok := keys[a.Key]; ok {
			dup = k.check(at+".key", fmt.Errorf("%s is already the key of apps[%d]", a.Key, j))
		}
		idErr := checkPrefixed(a.ID, "app_")
		if idErr == nil && len(a.ID) > maxAppIDBytes {
			idErr = fmt.Errorf("must be at most %d bytes, got %d", maxAppIDBytes, len(a.ID))
		}
		if err := first(k.check(at+".id", idErr), k.check(at+".key", checkPrefixed(a.Key, "pk_")),
			k.check(secretKey, secretErr), dup); err != nil {
			return err
		}
		ids[a.ID], keys[a.Key] = i, i
	}
	return nil
}

func (c *Config) validateCold(k checker) error {
	s := c.Cold.S3
	switch c.Cold.Store {
	case "fs", "none":
		return nil
	case "s3":
	default:
		return k.check("cold.store", fmt.Errorf("must be fs, s3 or none, got %q", c.Cold.Store))
	}
	return first(
		k.check("cold.s3.endpoint", required(s.Endpoint)),
		k.check("cold.s3.endpoint", when(strings.Contains(s.Endpoint, "/"), "must be host:port, without a scheme or path (secure selects TLS)")),
		k.check("cold.s3.bucket", required(s.Bucket)),
		k.check("cold.s3", when((s.AccessKeyEnv == "") != (s.SecretKeyEnv == ""), "set both accessKeyEnv and secretKeyEnv, or neither")),
	)
}

func (c *Config) validateCluster(k checker) error {
	cl := c.Cluster
	if cl == nil {
		return nil
	}
	host, port, err := net.SplitHostPort(cl.Advertise)
	errs := []error{
		k.check("cluster.name", required(cl.Name)),
		k.check("cluster.nodeId", required(cl.NodeID)),
		k.check("cluster.advertise", required(cl.Advertise)),
		k.check("cluster.advertise", when(err != nil || host == "" || checkPort(port) != nil || port == "0",
			fmt.Sprintf("expected host:port, got %q", cl.Advertise))),
		k.check("cluster.bind", checkBind(cl.Bind)),
		k.check("cluster.etcd.endpoints", when(len(cl.Etcd.Endpoints) == 0, "at least one endpoint is required")),
		k.check("cluster.leaseTtl", when(cl.LeaseTTL != 0 && (cl.LeaseTTL < 2*time.Second || cl.LeaseTTL > time.Minute || cl.LeaseTTL%time.Second != 0),
			fmt.Sprintf("expected whole seconds from 2s to 60s, got %v", cl.LeaseTTL))),
		k.check("cluster.replicationFactor", when(cl.ReplicationFactor < 0 || cl.ReplicationFactor > 7,
			fmt.Sprintf("expected 1 to 7 (the nodes that keep each partition), got %d", cl.ReplicationFactor))),
		k.check("cluster.failoverTimeout", when(cl.FailoverTimeout != 0 && (cl.FailoverTimeout < 200*time.Millisecond || cl.FailoverTimeout > time.Minute),
			fmt.Sprintf("expected 200ms to 60s, got %v", cl.FailoverTimeout))),
		k.check("cluster.replaceAfter", when(cl.ReplaceAfter != 0 && (cl.ReplaceAfter < time.Second || cl.ReplaceAfter > 30*24*time.Hour),
			fmt.Sprintf("expected 1s to 720h, got %v", cl.ReplaceAfter))),
		k.check("cluster.raftAdvertise", when(cl.RaftAdvertise != "" && checkHostPort(cl.RaftAdvertise) != nil,
			fmt.Sprintf("expected host:port, got %q", cl.RaftAdvertise))),
		k.check("cluster.raftBind", checkBind(cl.RaftBind)),
	}
	for i, e := range cl.Etcd.Endpoints {
		errs = append(errs, k.check(fmt.Sprintf("cluster.etcd.endpoints[%d]", i), required(e)))
	}
	// A node creates an app on first start only when it runs alone: the nodes of
	// a cluster must share their apps, so the file lists them.
	errs = append(errs, k.check("apps", when(len(c.Apps) == 0, "a cluster needs its apps listed in the configuration (the same on every node)")))
	return first(errs...)
}

// validateTypes checks every value each type set ("*" first), then what involves several
// keys on the type's merged settings.
func (c *Config) validateTypes(k checker) error {
	names := slices.DeleteFunc(slices.Sorted(maps.Keys(c.types)), func(n string) bool { return n == "*" })
	for _, n := range append([]string{"*"}, names...) {
		at := "types." + n
		if n == "" || strings.ContainsAny(n, "/:") {
			return k.check(at, errors.New("a type name must be non-empty, without '/' or ':'"))
		}
		for _, r := range slices.Sorted(maps.Keys(c.types[n])) {
			if err := k.check(at+"."+r, checkLeaf(leaves[r], c.types[n][r])); err != nil {
				return err
			}
		}
		t := c.Type(n)
		b := t.Queue.Backoff
		if err := first(
			k.check(at+".queue.backoff.max", when(b.Max < b.Initial, fmt.Sprintf("%v is below queue.backoff.initial %v", b.Max, b.Initial))),
			k.check(at+".log.cold", when(t.Log.Cold && c.Cold.Store == "none", "true needs a cold store, but cold.store is none")),
		); err != nil {
			return err
		}
	}
	return nil
}

// checkLeaf checks one value of a type against its leaf's range.
func checkLeaf(lf leaf, v any) error {
	switch x := v.(type) {
	case int64:
		if x < lf.min {
			return fmt.Errorf("must be at least %d, got %d", lf.min, x)
		}
		if lf.max > 0 && x > lf.max {
			return fmt.Errorf("%d is above the limit %d (%d GiB)", x, lf.max, lf.max>>30)
		}
	case time.Duration:
		if x < 0 {
			return fmt.Errorf("must not be negative, got %v", x)
		}
		if x < time.Duration(lf.min) {
			return fmt.Errorf("must be greater than 0, got %v", x)
		}
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) || x < float64(lf.min) {
			return fmt.Errorf("must be a finite number of at least %d, got %v", lf.min, x)
		}
	case []string:
		if len(x) == 0 {
			return errors.New("needs at least one entry")
		}
		for i, s := range x {
			if s == "" || strings.ContainsFunc(s, isSpaceOrControl) {
				return fmt.Errorf("entry %d must be non-empty, without spaces", i)
			}
			if slices.Contains(x[:i], s) {
				return fmt.Errorf("%q is listed twice", s)
			}
		}
	}
	return nil
}

func checkListen(s string) error {
	_, port, err := net.SplitHostPort(s)
	return when(err != nil || checkPort(port) != nil, fmt.Sprintf("expected host:port (the host may be empty), got %q", s))
}

// checkHostPort checks an advertised host:port: a host and a fixed port.
func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	return when(err != nil || host == "" || checkPort(port) != nil || port == "0", "expected host:port")
}

// checkBind checks cluster.bind: empty (listen on advertise) or host:port with a
// fixed port; the host may be empty (every interface).
func checkBind(s string) error {
	if s == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(s)
	return when(err != nil || checkPort(port) != nil || port == "0",
		fmt.Sprintf("expected host:port (the host may be empty: every interface), got %q", s))
}

func checkPort(p string) error {
	n, err := strconv.Atoi(p)
	return when(err != nil || n < 0 || n > 65535, "bad port")
}

func checkPartitions(n int64) error {
	return when(n < 0 || n > 65536, fmt.Sprintf("%d is out of range 0..65536 (0 = what the data directory holds, or 256)", n))
}

func checkMaxConnections(n int64) error {
	return when(n < 0 || n > math.MaxInt32, fmt.Sprintf("%d is out of range 0..%d (0 = half the descriptor limit)", n, math.MaxInt32))
}

func checkMemoryBudget(n int64) error {
	return when(n != 0 && n < MinMemoryBudget,
		fmt.Sprintf("%d bytes is below the minimum %d (32 MiB); 0 means half of the machine's memory", n, MinMemoryBudget))
}

func checkPositive(d time.Duration) error {
	return when(d <= 0, fmt.Sprintf("must be greater than 0, got %v", d))
}

// maxAppIDBytes bounds a configured app id: it is a component of every cold
// segment's key, and with it at most 64 bytes a log of the longest type and key
// (256 bytes each) still has a key under S3's 1,024 bytes with room for a
// prefix (docs/decisions.md, "Cold paths of long names").
const maxAppIDBytes = 64

// checkPrefixed checks an app id or key: the prefix, then at least one of [A-Za-z0-9_-]
// (ids appear in URL paths, keys in channel topics split on ':').
func checkPrefixed(s, prefix string) error {
	if s == "" {
		return errors.New("required")
	}
	rest, ok := strings.CutPrefix(s, prefix)
	return when(!ok || rest == "" || strings.ContainsFunc(rest, func(r rune) bool {
		return !(r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}), fmt.Sprintf("must be %s followed by letters, digits, '_' or '-', got %q", prefix, s))
}

// minSecretChars is the least number of characters after "sk_" in a configured
// secret (issue 26: "sk_a" was accepted). 16 random characters of the 64 of
// base64url are 96 bits; the secrets Holdfast generates have 48 hex digits.
const minSecretChars = 16

// checkSecret never quotes the secret.
func checkSecret(s string) error {
	if s == "" {
		return errors.New("required (or secretEnv)")
	}
	rest, ok := strings.CutPrefix(s, "sk_")
	if !ok || strings.ContainsFunc(rest, isSpaceOrControl) {
		return errors.New("a secret must be sk_ followed by at least 16 characters, without spaces")
	}
	if n := utf8.RuneCountInString(rest); n < minSecretChars {
		return fmt.Errorf("a secret must have at least %d characters after sk_, this one has %d: generate one with `openssl rand -hex 24` and put sk_ before it", minSecretChars, n)
	}
	return nil
}

func required(s string) error {
	if s == "" {
		return errors.New("required")
	}
	return when(strings.ContainsFunc(s, isSpaceOrControl), fmt.Sprintf("must not contain spaces, got %q", s))
}

// when returns an error with msg if bad.
func when(bad bool, msg string) error {
	if bad {
		return errors.New(msg)
	}
	return nil
}

func isSpaceOrControl(r rune) bool { return r <= ' ' || r == 0x7f }
