package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Config is the whole server configuration (spec/config.md). Default and Load return one that
// is valid; a caller that changes fields (flags) calls Validate again before using it.
type Config struct {
	// DataDir is the data directory (yaml dataDir, env HOLDFAST_DATA_DIR); default
	// "./holdfast-data"; must not be empty.
	DataDir string
	// Listen is the HTTP address, host:port (yaml listen, env HOLDFAST_LISTEN); default
	// "127.0.0.1:7070". An empty host listens on every interface; port 0 picks a free port.
	Listen string
	// Partitions is the partition count (yaml partitions, env HOLDFAST_PARTITIONS), 0..65536.
	// 0 means what the data directory holds, or 256 for a new one.
	Partitions int
	// IdleTimeout is how long an idle object stays in memory (yaml idleTimeout, a Go duration
	// string, env HOLDFAST_IDLE_TIMEOUT); default 60s; must be > 0.
	IdleTimeout time.Duration
	// MaxConnections caps the HTTP connections open at once (yaml maxConnections, env
	// HOLDFAST_MAX_CONNECTIONS); one more waits in the listen backlog until one closes. 0
	// (the default) means half the process's descriptor limit, so that the storage keeps
	// descriptors in reserve; must be >= 0.
	MaxConnections int
	// MemoryBudget bounds the Go heap of the node in bytes (yaml memoryBudget, an integer, env
	// HOLDFAST_MEMORY_BUDGET): from 60% of it the least recently used idle objects are
	// passivated, from 75% new activations and writes get 503 until the heap is under 65%, and
	// `holdfast serve` sets the Go runtime's memory limit to 85% of it. 0 (the default) means half
	// of the machine's memory, or of the container's (cgroup) limit when that is lower; otherwise
	// at least 33554432 (32 MiB).
	MemoryBudget int64
	// Apps are the configured apps. None is allowed: the server then creates one on first
	// start (spec/auth.md).
	Apps []App
	// Cold is the node's cold segment store.
	Cold Cold
	// Cluster is nil for a single node (yaml `cluster: null` or absent).
	Cluster *Cluster

	types       map[string]layer // the "types" section, one layer per name ("*" included)
	autoColdDir string           // the Cold.FS.Dir that Default or Validate last derived
}

// App is one app (spec/auth.md): yaml id, key, and exactly one of secret or secretEnv.
type App struct {
	ID  string // starts with "app_"
	Key string // starts with "pk_"
	// Secret starts with "sk_". When SecretEnv is set, Load fills Secret from that
	// environment variable (which must be set and not empty).
	Secret    string
	SecretEnv string
}

// Cold configures the node's cold segment store.
type Cold struct {
	// Store is "fs" (default), "s3" or "none". With "none" no type may set log.cold.
	Store string
	FS    struct {
		// Dir holds the segments of the fs store. Default <DataDir>/cold: left unset (or
		// equal to what it was derived from), Validate derives it again from DataDir.
		Dir string
		// Shared (yaml shared) says that every node of the cluster mounts Dir (the
		// same files): a replicated cluster requires a cold store every node reads.
		Shared bool
	}
	S3 S3
}

// S3 configures an S3-compatible cold store (store: s3). Endpoint and Bucket are required.
type S3 struct {
	Endpoint string // host:port, without a scheme (Secure selects TLS)
	Bucket   string
	// AccessKeyEnv and SecretKeyEnv name the environment variables that hold the
	// credentials (read by the store, not here): both or neither (anonymous).
	AccessKeyEnv, SecretKeyEnv string
	Secure                     bool
	Region                     string // "" lets the client find it
	Prefix                     string // prepended to every object name; may be ""
}

// Cluster configures a node of a cluster (spec/cluster.md). Every field is required
// unless it says otherwise.
type Cluster struct {
	Name      string // the cluster's name; every node of one cluster uses the same
	NodeID    string // yaml nodeId; unique within the cluster
	Advertise string // host:port that other nodes use to reach this one
	// Bind (yaml bind, optional) is the host:port this node listens on for other
	// nodes; empty means Advertise. They differ when something between the nodes
	// (NAT, a container's port mapping, a test's proxy on each link) forwards
	// Advertise to Bind. An empty host listens on every interface.
	Bind string
	Etcd struct {
		Endpoints []string // at least one
	}
	// LeaseTTL (yaml leaseTtl, optional) is the etcd lease a node serves its
	// partitions under: whole seconds from 2s to 60s; zero means 5s.
	LeaseTTL time.Duration
	// ReplicationFactor (yaml replicationFactor, optional) is how many nodes
	// keep each partition, 1 to 7, fixed when the cluster is created; zero
	// means the cluster's, or 1 for a new cluster (docs/replication.md).
	ReplicationFactor int
	// FailoverTimeout (yaml failoverTimeout, optional) is how long a
	// partition's replicas go without hearing from its leader before they
	// elect another: 200ms to 60s, zero means 1s. Replicated clusters only.
	FailoverTimeout time.Duration
	// ReplaceAfter (yaml replaceAfter, optional) is how long a node with
	// replicas may be down before they are re-created on other nodes: 1s to
	// 30 days, zero means 10m. Replicated clusters only.
	ReplaceAfter time.Duration
	// RaftAdvertise and RaftBind (yaml raftAdvertise, raftBind, optional) are
	// where other nodes reach this node's raft traffic and where it listens
	// for it; empty means the port above advertise's (bind's).
	RaftAdvertise string
	RaftBind      string
}

// Environment variables that override the file.
const (
	EnvDataDir      = "HOLDFAST_DATA_DIR"
	EnvListen       = "HOLDFAST_LISTEN"
	EnvPartitions   = "HOLDFAST_PARTITIONS"
	EnvIdleTimeout  = "HOLDFAST_IDLE_TIMEOUT"
	EnvMaxConns     = "HOLDFAST_MAX_CONNECTIONS"
	EnvMemoryBudget = "HOLDFAST_MEMORY_BUDGET"
)

// MinMemoryBudget is the smallest memoryBudget accepted (other than 0); it matches
// actors.MinMemoryBudget. A smaller one is most likely a unit mistake.
const MinMemoryBudget = 32 << 20

// Default returns the configuration used with no file, no environment and no flags.
func Default() *Config {
	c := &Config{
		DataDir:     "./holdfast-data",
		Listen:      "127.0.0.1:7070",
		IdleTimeout: 60 * time.Second,
	}
	c.Cold.Store = "fs"
	c.resolveColdDir()
	return c
}

// Load reads the YAML file at path (path "" means no file), then the HOLDFAST_* environment
// variables through getenv (os.Getenv when nil; tests pass a map lookup), fills defaults and
// validates. The app secrets that secretEnv names are read through getenv too.
// Every error is an *Error.
func Load(path string, getenv func(string) string) (*Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var data []byte
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return nil, &Error{File: path, Msg: "cannot read the configuration file", Err: err}
		}
	}
	return load(path, data, getenv)
}

// load is Load without the file system.
func load(path string, data []byte, getenv func(string) string) (*Config, error) {
	c := Default()
	p := &parser{file: path, getenv: getenv, lines: map[string]int{}}
	if path != "" {
		if err := p.parse(data, c); err != nil {
			return nil, err
		}
	}
	if err := c.applyEnv(getenv); err != nil {
		return nil, err
	}
	// The environment's values were checked above, so every value that fails here came from
	// the file: its error can carry the file's line.
	if err := c.validate(checker{p.file, p.lines}); err != nil {
		return nil, err
	}
	if c.Cluster != nil && c.Cluster.Bind == "" {
		c.Cluster.Bind = c.Cluster.Advertise
	}
	return c, nil
}

func (c *Config) applyEnv(getenv func(string) string) error {
	for _, e := range []struct {
		name string
		set  func(v string) error
	}{
		{EnvDataDir, func(v string) error { c.DataDir = v; return nil }},
		{EnvListen, func(v string) error { c.Listen = v; return checkListen(v) }},
		{EnvPartitions, func(v string) (err error) {
			if c.Partitions, err = strconv.Atoi(v); err != nil {
				return fmt.Errorf("expected an integer, got %q", v)
			}
			return checkPartitions(int64(c.Partitions))
		}},
		{EnvIdleTimeout, func(v string) (err error) {
			if c.IdleTimeout, err = time.ParseDuration(v); err != nil {
				return fmt.Errorf("expected a duration such as 60s, got %q", v)
			}
			return checkPositive(c.IdleTimeout)
		}},
		{EnvMaxConns, func(v string) (err error) {
			if c.MaxConnections, err = strconv.Atoi(v); err != nil {
				return fmt.Errorf("expected an integer, got %q", v)
			}
			return checkMaxConnections(int64(c.MaxConnections))
		}},
		{EnvMemoryBudget, func(v string) (err error) {
			if c.MemoryBudget, err = strconv.ParseInt(v, 10, 64); err != nil {
				return fmt.Errorf("expected a number of bytes, got %q", v)
			}
			return checkMemoryBudget(c.MemoryBudget)
		}},
	} {
		if v := getenv(e.name); v != "" {
			if err := e.set(v); err != nil {
				return &Error{Key: e.name, Msg: err.Error()}
			}
		}
	}
	return nil
}

func (c *Config) resolveColdDir() {
	if c.Cold.FS.Dir == "" || c.Cold.FS.Dir == c.autoColdDir {
		c.autoColdDir = filepath.Join(c.DataDir, "cold")
		c.Cold.FS.Dir = c.autoColdDir
	}
}
