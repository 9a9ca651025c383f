package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// specExample is the block from spec/config.md, verbatim.
const specExample = `
dataDir: ./holdfast-data          # flag --data-dir, env HOLDFAST_DATA_DIR
listen: 127.0.0.1:7070            # flag --listen, env HOLDFAST_LISTEN
partitions: 256                   # fixed when the data directory is created

apps:
  - id: app_demo
    key: pk_demo
    secret: sk_demo_change_me_0123456789     # or secretEnv: NAME

cold:
  store: fs                       # fs | s3 | none
  fs: {dir: ./holdfast-data/cold}
  s3:
    endpoint: 127.0.0.1:9000
    bucket: holdfast
    accessKeyEnv: HOLDFAST_S3_ACCESS_KEY
    secretKeyEnv: HOLDFAST_S3_SECRET_KEY
    secure: false
    region: us-east-1
    prefix: segments/

types:                            # per object type; "*" is the default for every type
  "*":
    objects: {changeLogEntries: 10000}
    log:
      maxBatchSize: 100
      retention: {maxAge: 0s, maxRecords: 0, maxBytes: 0, trimEvery: 1m}   # 0 = no limit
      cold: false
      leases: null                # or {maxParallelism: 1, leaseDuration: 30s, maxAttempts: 0}
    queue:
      targets: [default]
      maxAttempts: 5
      visibilityTimeout: 30s
      backoff: {initial: 1s, multiplier: 2, max: 5m}
      completedRetention: 24h
      deadLetterRetention: 336h
      maxPending: 1000000
      concurrency: 1
    alarms: {maxAttempts: 5}
  partition:                      # example: a type whose logs keep a week and flush to cold
    log:
      retention: {maxAge: 168h, maxRecords: 100000, maxBytes: 536870912}
      cold: true
      leases: {maxParallelism: 4, leaseDuration: 30s, maxAttempts: 5}

cluster: null                     # single node; see cluster.md for several nodes
`

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "holdfast.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func mustLoad(t *testing.T, body string, vars map[string]string) *Config {
	t.Helper()
	path := ""
	if body != "" {
		path = writeConfig(t, body)
	}
	c, err := Load(path, env(vars))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return c
}

func TestLoad_SpecExample(t *testing.T) {
	c := mustLoad(t, specExample, nil)
	if c.DataDir != "./holdfast-data" || c.Listen != "127.0.0.1:7070" || c.Partitions != 256 || c.IdleTimeout != time.Minute {
		t.Errorf("top level: %+v", c)
	}
	if want := []App{{ID: "app_demo", Key: "pk_demo", Secret: "sk_demo_change_me_0123456789"}}; !reflect.DeepEqual(c.Apps, want) {
		t.Errorf("apps = %+v, want %+v", c.Apps, want)
	}
	wantS3 := S3{Endpoint: "127.0.0.1:9000", Bucket: "holdfast", AccessKeyEnv: "HOLDFAST_S3_ACCESS_KEY",
		SecretKeyEnv: "HOLDFAST_S3_SECRET_KEY", Region: "us-east-1", Prefix: "segments/"}
	if c.Cold.Store != "fs" || c.Cold.FS.Dir != "./holdfast-data/cold" || c.Cold.S3 != wantS3 {
		t.Errorf("cold = %+v", c.Cold)
	}
	if c.Cluster != nil {
		t.Errorf("cluster = %+v, want nil", c.Cluster)
	}

	star := TypeConfig{
		Objects: ObjectsConfig{ChangeLogEntries: 10000},
		Log:     LogConfig{MaxBatchSize: 100, Retention: Retention{TrimEvery: time.Minute}},
		Queue: QueueConfig{Targets: []string{"default"}, MaxAttempts: 5, VisibilityTimeout: 30 * time.Second,
			Backoff:            Backoff{Initial: time.Second, Multiplier: 2, Max: 5 * time.Minute},
			CompletedRetention: 24 * time.Hour, DeadLetterRetention: 336 * time.Hour, MaxPending: 1000000, Concurrency: 1},
		Alarms: AlarmsConfig{MaxAttempts: 5, MaxPerObject: 10000},
	}
	partition := star
	partition.Log = LogConfig{
		MaxBatchSize: 100, // from "*"
		Retention:    Retention{MaxAge: 168 * time.Hour, MaxRecords: 100000, MaxBytes: 536870912, TrimEvery: time.Minute},
		Cold:         true,
		Leases:       &Leases{MaxParallelism: 4, LeaseDuration: 30 * time.Second, MaxAttempts: 5},
	}
	for _, tc := range []struct {
		name string
		want TypeConfig
	}{{"*", star}, {"partition", partition}, {"other", star}} {
		if got := c.Type(tc.name); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Type(%q) =\n%+v\nwant\n%+v", tc.name, got, tc.want)
		}
	}
	if c.Type("other").Log.Leases != nil {
		t.Error("Type(other) has leases")
	}
}

func TestLoad_Defaults(t *testing.T) {
	c, err := Load("", env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.DataDir != "./holdfast-data" || c.Listen != "127.0.0.1:7070" || c.Partitions != 0 ||
		c.IdleTimeout != 60*time.Second || len(c.Apps) != 0 || c.Cluster != nil {
		t.Errorf("defaults: %+v", c)
	}
	if c.Cold.Store != "fs" || c.Cold.FS.Dir != filepath.Join("holdfast-data", "cold") || c.Cold.FS.Shared {
		t.Errorf("cold defaults: %+v", c.Cold)
	}
	want := TypeConfig{
		Objects: ObjectsConfig{ChangeLogEntries: 10000},
		Log:     LogConfig{MaxBatchSize: 100},
		Queue: QueueConfig{Targets: []string{"default"}, MaxAttempts: 5, VisibilityTimeout: 30 * time.Second,
			Backoff:            Backoff{Initial: time.Second, Multiplier: 2, Max: 5 * time.Minute},
			CompletedRetention: 24 * time.Hour, DeadLetterRetention: 336 * time.Hour, MaxPending: 1000000, Concurrency: 1},
		Alarms: AlarmsConfig{MaxAttempts: 5, MaxPerObject: 10000},
	}
	if got := c.Type("anything"); !reflect.DeepEqual(got, want) {
		t.Errorf("Type = %+v, want %+v", got, want)
	}
	if d := Default(); d.Validate() != nil || d.Cold.FS.Dir != c.Cold.FS.Dir {
		t.Errorf("Default() = %+v", d)
	}
	// an empty file is the same as no file
	if e := mustLoad(t, "# nothing\n", nil); !reflect.DeepEqual(e, c) {
		t.Errorf("empty file: %+v, want %+v", e, c)
	}
}

func TestLoad_EnvOverridesFile(t *testing.T) {
	file := "dataDir: /from/file\nlisten: 127.0.0.1:1\npartitions: 16\nidleTimeout: 5s\nmaxConnections: 100\n"
	c := mustLoad(t, file, nil)
	if c.DataDir != "/from/file" || c.Listen != "127.0.0.1:1" || c.Partitions != 16 || c.IdleTimeout != 5*time.Second || c.MaxConnections != 100 {
		t.Fatalf("file values: %+v", c)
	}
	if c.Cold.FS.Dir != "/from/file/cold" {
		t.Errorf("cold dir = %q, want /from/file/cold", c.Cold.FS.Dir)
	}
	c = mustLoad(t, file, map[string]string{
		"HOLDFAST_DATA_DIR": "/from/env", "HOLDFAST_LISTEN": ":8080",
		"HOLDFAST_PARTITIONS": "1024", "HOLDFAST_IDLE_TIMEOUT": "2m", "HOLDFAST_MAX_CONNECTIONS": "7",
	})
	if c.DataDir != "/from/env" || c.Listen != ":8080" || c.Partitions != 1024 || c.IdleTimeout != 2*time.Minute || c.MaxConnections != 7 {
		t.Errorf("env values: %+v", c)
	}
	if c.Cold.FS.Dir != "/from/env/cold" {
		t.Errorf("cold dir = %q, want /from/env/cold", c.Cold.FS.Dir)
	}
}

func TestValidate_AfterFlags(t *testing.T) {
	c := mustLoad(t, "dataDir: /a\n", nil)
	c.DataDir = "/b" // --data-dir
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Cold.FS.Dir != "/b/cold" {
		t.Errorf("default cold dir did not follow dataDir: %q", c.Cold.FS.Dir)
	}
	c = mustLoad(t, "dataDir: /a\ncold: {fs: {dir: /a/cold}}\n", nil)
	c.DataDir = "/b"
	if err := c.Validate(); err != nil || c.Cold.FS.Dir != "/a/cold" {
		t.Errorf("a cold dir set in the file must stay: %q, %v", c.Cold.FS.Dir, err)
	}
	for _, tc := range []struct {
		key string
		set func(*Config)
	}{
		{"listen", func(c *Config) { c.Listen = "nope" }},
		{"partitions", func(c *Config) { c.Partitions = 65537 }},
		{"idleTimeout", func(c *Config) { c.IdleTimeout = 0 }},
		{"dataDir", func(c *Config) { c.DataDir = "" }},
		{"cold.store", func(c *Config) { c.Cold.Store = "tape" }},
		{"cold.s3.endpoint", func(c *Config) { c.Cold.Store = "s3" }},
		{"apps[1].id", func(c *Config) {
			c.Apps = []App{{ID: "app_a", Key: "pk_a", Secret: "sk_a_0123456789abcdef"}, {ID: "app_a", Key: "pk_b", Secret: "sk_b_0123456789abcdef"}}
		}},
		{"apps[0].secretEnv", func(c *Config) { c.Apps = []App{{ID: "app_a", Key: "pk_a", SecretEnv: "X"}} }},
		{"cluster.name", func(c *Config) { c.Cluster = &Cluster{} }},
	} {
		c := Default()
		tc.set(c)
		checkErr(t, tc.key, c.Validate(), tc.key, "")
	}
}

// checkErr asserts err is an *Error for key whose text starts with "config: ", names the key
// and contains want.
func checkErr(t *testing.T, name string, err error, key, want string) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Errorf("%s: err = %v, want an *Error", name, err)
		return nil
	}
	msg := err.Error()
	if e.Key != key || !strings.HasPrefix(msg, "config: "+key) || !strings.Contains(msg, want) {
		t.Errorf("%s: err = %q (key %q), want key %q and %q", name, msg, e.Key, key, want)
	}
	return e
}

func TestLoad_Refusals(t *testing.T) {
	vars := map[string]string{"APP_SECRET": "sk_from_env_0123456789abcdef", "BAD_SECRET": "nope", "SHORT_SECRET": "sk_short", "S3_KEY": "k"}
	for _, tc := range []struct {
		name, yaml string
		env        map[string]string
		key, want  string
	}{
		// unknown keys at several depths
		{"unknown top", "dataDri: x\n", nil, "dataDri", "unknown key"},
		{"unknown app key", "apps: [{id: app_a, key: pk_a, secret: sk_a_0123456789abcdef, role: admin}]\n", nil, "apps[0].role", "unknown key"},
		{"unknown cold", "cold: {store: fs, disk: x}\n", nil, "cold.disk", "unknown key"},
		{"unknown s3", "cold: {s3: {bucket: b, tls: true}}\n", nil, "cold.s3.tls", "unknown key"},
		{"unknown type section", "types: {order: {logs: {}}}\n", nil, "types.order.logs", "unknown key"},
		{"unknown retention key", "types:\n  order:\n    log:\n      retention:\n        maxAgee: 1h\n", nil,
			"types.order.log.retention.maxAgee", "unknown key (known keys: maxAge, maxBytes, maxRecords, trimEvery)"},
		{"unknown leases key", "types: {'*': {log: {leases: {parallelism: 2}}}}\n", nil, "types.*.log.leases.parallelism", "unknown key"},
		{"unknown cluster key", "cluster: {name: c, zone: a}\n", nil, "cluster.zone", "unknown key"},
		{"unknown etcd key", "cluster: {etcd: {hosts: [a]}}\n", nil, "cluster.etcd.hosts", "unknown key"},
		{"merge key", "types:\n  a: &a {log: {cold: false}}\n  b:\n    <<: *a\n", nil, "types.b.<<", "unknown key"},
		{"set twice", "listen: a:1\nlisten: b:2\n", nil, "listen", "set twice (first on line 1)"},
		// wrong types
		{"partitions abc", "partitions: abc\n", nil, "partitions", "expected an integer, got a string"},
		{"partitions float", "partitions: 1.5\n", nil, "partitions", "expected an integer"},
		{"trimEvery int", "types: {x: {log: {retention: {trimEvery: 5}}}}\n", nil, "types.x.log.retention.trimEvery", "expected a duration string"},
		{"maxAge bad", "types: {x: {log: {retention: {maxAge: 7d}}}}\n", nil, "types.x.log.retention.maxAge", `got "7d"`},
		{"cold yes", "types: {x: {log: {cold: \"yes\"}}}\n", nil, "types.x.log.cold", "expected true or false, got a string"},
		{"idleTimeout int", "idleTimeout: 60\n", nil, "idleTimeout", "expected a duration string"},
		{"listen null", "listen:\n", nil, "listen", "expected a string, got null"},
		{"dataDir int", "dataDir: 5\n", nil, "dataDir", "got an integer (quote it)"},
		{"targets scalar", "types: {x: {queue: {targets: default}}}\n", nil, "types.x.queue.targets", "expected a list"},
		{"log list", "types: {x: {log: [1]}}\n", nil, "types.x.log", "expected a mapping, got a list"},
		{"apps mapping", "apps: {id: app_a}\n", nil, "apps", "expected a list of apps"},
		{"multiplier string", "types: {x: {queue: {backoff: {multiplier: two}}}}\n", nil, "types.x.queue.backoff.multiplier", "expected a number"},
		{"multiplier nan", "types: {x: {queue: {backoff: {multiplier: .nan}}}}\n", nil, "types.x.queue.backoff.multiplier", "finite"},
		{"top list", "- a\n", nil, "", "expected a mapping of keys at the top level"},
		{"secure string", "cold: {s3: {secure: \"no\"}}\n", nil, "cold.s3.secure", "expected true or false"},
		// out of range
		{"partitions high", "partitions: 65537\n", nil, "partitions", "out of range 0..65536"},
		{"partitions negative", "partitions: -1\n", nil, "partitions", "out of range"},
		{"negative duration", "types: {x: {log: {retention: {maxAge: -1h}}}}\n", nil, "types.x.log.retention.maxAge", "must not be negative"},
		{"idleTimeout zero", "idleTimeout: 0s\n", nil, "idleTimeout", "must be greater than 0"},
		{"maxBytes over 1 GiB", "types: {x: {log: {retention: {maxBytes: 1073741825}}}}\n", nil,
			"types.x.log.retention.maxBytes", "above the limit 1073741824 (1 GiB)"},
		{"maxBatchSize 0", "types: {'*': {log: {maxBatchSize: 0}}}\n", nil, "types.*.log.maxBatchSize", "at least 1"},
		{"changeLogEntries 0", "types: {x: {objects: {changeLogEntries: 0}}}\n", nil, "types.x.objects.changeLogEntries", "at least 1"},
		{"maxRecords negative", "types: {x: {log: {retention: {maxRecords: -5}}}}\n", nil, "types.x.log.retention.maxRecords", "at least 0"},
		{"maxBytes negative", "types: {x: {log: {retention: {maxBytes: -5}}}}\n", nil, "types.x.log.retention.maxBytes", "at least 0"},
		{"maxParallelism 0", "types: {partition: {log: {leases: {maxParallelism: 0}}}}\n", nil, "types.partition.log.leases.maxParallelism", "at least 1"},
		{"leaseDuration 0", "types: {x: {log: {leases: {leaseDuration: 0s}}}}\n", nil, "types.x.log.leases.leaseDuration", "greater than 0"},
		{"multiplier below 1", "types: {x: {queue: {backoff: {multiplier: 0.5}}}}\n", nil, "types.x.queue.backoff.multiplier", "at least 1"},
		{"backoff max below initial", "types: {x: {queue: {backoff: {initial: 10s, max: 1s}}}}\n", nil, "types.x.queue.backoff.max", "below"},
		{"targets empty", "types: {x: {queue: {targets: []}}}\n", nil, "types.x.queue.targets", "at least one"},
		{"targets twice", "types: {x: {queue: {targets: [a, a]}}}\n", nil, "types.x.queue.targets", "listed twice"},
		{"queue maxAttempts 0", "types: {x: {queue: {maxAttempts: 0}}}\n", nil, "types.x.queue.maxAttempts", "at least 1"},
		{"alarms maxAttempts 0", "types: {x: {alarms: {maxAttempts: 0}}}\n", nil, "types.x.alarms.maxAttempts", "at least 1"},
		{"bad type name", "types: {'a/b': {}}\n", nil, "types.a/b", "type name"},
		{"cold store", "cold: {store: tape}\n", nil, "cold.store", "must be fs, s3 or none"},
		{"s3 without endpoint", "cold: {store: s3, s3: {bucket: b}}\n", nil, "cold.s3.endpoint", "required"},
		{"s3 without bucket", "cold: {store: s3, s3: {endpoint: 'h:9000'}}\n", nil, "cold.s3.bucket", "required"},
		{"s3 endpoint url", "cold: {store: s3, s3: {endpoint: 'http://h:9000', bucket: b}}\n", nil, "cold.s3.endpoint", "without a scheme"},
		{"s3 one key env", "cold: {store: s3, s3: {endpoint: 'h:1', bucket: b, accessKeyEnv: S3_KEY}}\n", vars, "cold.s3", "both"},
		{"cold true with store none", "cold: {store: none}\ntypes: {x: {log: {cold: true}}}\n", nil, "types.x.log.cold", "cold.store is none"},
		{"cluster missing", "cluster: {name: c, nodeId: n1, advertise: 'h:7071'}\n", nil, "cluster.etcd.endpoints", "at least one"},
		{"cluster advertise", "cluster: {name: c, nodeId: n1, advertise: h, etcd: {endpoints: [e:2379]}}\n", nil, "cluster.advertise", "host:port"},
		{"cluster bind no port", "cluster: {name: c, nodeId: n1, advertise: 'h:1', bind: h, etcd: {endpoints: [e:2379]}}\n", nil, "cluster.bind", "host:port"},
		{"cluster bind port 0", "cluster: {name: c, nodeId: n1, advertise: 'h:1', bind: 'h:0', etcd: {endpoints: [e:2379]}}\n", nil, "cluster.bind", "host:port"},
		{"cluster lease short", "cluster: {name: c, nodeId: n1, advertise: 'h:1', etcd: {endpoints: [e:2379]}, leaseTtl: 1s}\n", nil, "cluster.leaseTtl", "whole seconds"},
		{"cluster lease fraction", "cluster: {name: c, nodeId: n1, advertise: 'h:1', etcd: {endpoints: [e:2379]}, leaseTtl: 2500ms}\n", nil, "cluster.leaseTtl", "whole seconds"},
		{"cluster rf 0 neg", "cluster: {name: c, nodeId: n1, advertise: 'h:1', etcd: {endpoints: [e:2379]}, replicationFactor: -1}\n", nil, "cluster.replicationFactor", "1 to 7"},
		{"cluster rf 8", "cluster: {name: c, nodeId: n1, advertise: 'h:1', etcd: {endpoints: [e:2379]}, replicationFactor: 8}\n", nil, "cluster.replicationFactor", "1 to 7"},
		{"cluster failover short", "cluster: {name: c, nodeId: n1, advertise: 'h:1', etcd: {endpoints: [e:2379]}, failoverTimeout: 100ms}\n", nil, "cluster.failoverTimeout", "200ms to 60s"},
		{"cluster raft advertise", "cluster: {name: c, nodeId: n1, advertise: 'h:1', raftAdvertise: ':5', etcd: {endpoints: [e:2379]}}\n", nil, "cluster.raftAdvertise", "host:port"},
		{"cluster replace after short", "cluster: {name: c, nodeId: n1, advertise: 'h:1', etcd: {endpoints: [e:2379]}, replaceAfter: 10ms}\n", nil, "cluster.replaceAfter", "1s to 720h"},
		{"cluster raft bind", "cluster: {name: c, nodeId: n1, advertise: 'h:1', raftBind: 'h:0', etcd: {endpoints: [e:2379]}}\n", nil, "cluster.raftBind", "host:port"},
		// apps
		{"app id prefix", "apps: [{id: demo, key: pk_a, secret: sk_a_0123456789abcdef}]\n", nil, "apps[0].id", "must be app_"},
		{"app id too long", "apps: [{id: app_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx, key: pk_a, secret: sk_a_0123456789abcdef}]\n", nil, "apps[0].id", "at most 64 bytes, got 65"},
		{"app key prefix", "apps: [{id: app_a, key: demo, secret: sk_a_0123456789abcdef}]\n", nil, "apps[0].key", "must be pk_"},
		{"app secret prefix", "apps: [{id: app_a, key: pk_a, secret: hunter2}]\n", nil, "apps[0].secret", "sk_"},
		{"app no secret", "apps: [{id: app_a, key: pk_a}]\n", nil, "apps[0].secret", "required"},
		{"app secret short", "apps: [{id: app_a, key: pk_a, secret: sk_a}]\n", nil, "apps[0].secret", "at least 16 characters after sk_, this one has 1"},
		{"app secret 15", "apps: [{id: app_a, key: pk_a, secret: sk_0123456789abcde}]\n", nil, "apps[0].secret", "this one has 15"},
		{"app secret empty after prefix", "apps: [{id: app_a, key: pk_a, secret: sk_}]\n", nil, "apps[0].secret", "this one has 0"},
		{"secretEnv short", "apps: [{id: app_a, key: pk_a, secretEnv: SHORT_SECRET}]\n", vars, "apps[0].secretEnv", "at least 16"},
		{"app no id", "apps: [{key: pk_a, secret: sk_a_0123456789abcdef}]\n", nil, "apps[0].id", "required"},
		{"app both secrets", "apps: [{id: app_a, key: pk_a, secret: sk_a_0123456789abcdef, secretEnv: APP_SECRET}]\n", vars, "apps[0]", "not both"},
		{"secretEnv missing", "apps: [{id: app_a, key: pk_a, secretEnv: NOT_SET}]\n", vars, "apps[0].secretEnv", "NOT_SET is not set"},
		{"secretEnv bad value", "apps: [{id: app_a, key: pk_a, secretEnv: BAD_SECRET}]\n", vars, "apps[0].secretEnv", "the value of BAD_SECRET"},
		{"duplicate app id", "apps:\n  - {id: app_a, key: pk_a, secret: sk_a_0123456789abcdef}\n  - {id: app_a, key: pk_b, secret: sk_b_0123456789abcdef}\n", nil, "apps[1].id", "already the id of apps[0]"},
		{"duplicate app key", "apps:\n  - {id: app_a, key: pk_a, secret: sk_a_0123456789abcdef}\n  - {id: app_b, key: pk_a, secret: sk_b_0123456789abcdef}\n", nil, "apps[1].key", "already the key of apps[0]"},
		// environment
		{"env partitions", "", map[string]string{"HOLDFAST_PARTITIONS": "x"}, "HOLDFAST_PARTITIONS", `expected an integer, got "x"`},
		{"env partitions range", "", map[string]string{"HOLDFAST_PARTITIONS": "70000"}, "HOLDFAST_PARTITIONS", "out of range"},
		{"env idle", "", map[string]string{"HOLDFAST_IDLE_TIMEOUT": "soon"}, "HOLDFAST_IDLE_TIMEOUT", "expected a duration"},
		{"env idle zero", "", map[string]string{"HOLDFAST_IDLE_TIMEOUT": "0s"}, "HOLDFAST_IDLE_TIMEOUT", "greater than 0"},
		{"env listen", "", map[string]string{"HOLDFAST_LISTEN": "localhost"}, "HOLDFAST_LISTEN", "host:port"},
		{"env max connections", "", map[string]string{"HOLDFAST_MAX_CONNECTIONS": "many"}, "HOLDFAST_MAX_CONNECTIONS", "expected an integer"},
		{"env max connections negative", "", map[string]string{"HOLDFAST_MAX_CONNECTIONS": "-1"}, "HOLDFAST_MAX_CONNECTIONS", "out of range"},
		{"max connections negative", "maxConnections: -5\n", nil, "maxConnections", "out of range"},
		{"alarms maxPerObject zero", "types: {x: {alarms: {maxPerObject: 0}}}\n", nil, "types.x.alarms.maxPerObject", ""},
	} {
		path := ""
		if tc.yaml != "" {
			path = writeConfig(t, tc.yaml)
		}
		c, err := Load(path, env(tc.env))
		if err == nil {
			t.Errorf("%s: Load succeeded: %+v", tc.name, c)
			continue
		}
		if c != nil {
			t.Errorf("%s: Load returned a Config with an error", tc.name)
		}
		e := checkErr(t, tc.name, err, tc.key, tc.want)
		if e != nil && tc.yaml != "" && tc.key != "" && (e.File != path || e.Line < 1) {
			t.Errorf("%s: err = %q does not name the file and line", tc.name, err)
		}
		if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "nope") {
			t.Errorf("%s: error leaks a secret: %v", tc.name, err)
		}
	}
}

func TestLoad_ErrorLine(t *testing.T) {
	body := "dataDir: ./d\ntypes:\n  order:\n    log:\n      retention:\n        maxAgee: 1h\n"
	path := writeConfig(t, body)
	_, err := Load(path, env(nil))
	e := checkErr(t, "line", err, "types.order.log.retention.maxAgee", "unknown key")
	if e != nil && (e.File != path || e.Line != 6 || !strings.HasSuffix(err.Error(), "("+path+":6)")) {
		t.Errorf("err = %q, file %q line %d, want %s:6", err, e.File, e.Line, path)
	}
}

func TestLoad_FileErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	_, err := Load(missing, env(nil))
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "config: "+missing+": ") {
		t.Errorf("missing file: %v", err)
	}
	for _, body := range []string{"dataDir: [\n", "a: b: c\n", "\t- x\n", "a: 1\n---\nb: 2\n", "x: *nope\n"} {
		path := writeConfig(t, body)
		_, err := Load(path, env(nil))
		var e *Error
		if !errors.As(err, &e) || !strings.HasPrefix(err.Error(), "config: "+path+": ") {
			t.Errorf("%q: err = %v, want one naming the file", body, err)
		}
	}
}

func TestLoad_Secrets(t *testing.T) {
	c := mustLoad(t, "apps: [{id: app_a, key: pk_a, secretEnv: APP_SECRET}]\n", map[string]string{"APP_SECRET": "sk_env_0123456789abcdef"})
	if want := (App{ID: "app_a", Key: "pk_a", Secret: "sk_env_0123456789abcdef", SecretEnv: "APP_SECRET"}); c.Apps[0] != want {
		t.Errorf("app = %+v, want %+v", c.Apps[0], want)
	}
}

func TestType_Merge(t *testing.T) {
	c := mustLoad(t, `
types:
  "*":
    log:
      maxBatchSize: 50
      retention: {maxRecords: 10, maxBytes: 1000}
      leases: {maxParallelism: 3, maxAttempts: 7}
    queue: {targets: [a, b], backoff: {max: 1m}}
  order:
    log:
      retention: {maxAge: 1h}
  noleases:
    log: {leases: null}
  partial:
    log: {leases: {leaseDuration: 5s}}
  untrimmed:
    log: {retention: {trimEvery: 0s}}
  aliased: &shared
    queue: {concurrency: 4}
  alias2: *shared
  empty:
`, nil)
	order := c.Type("order")
	if r := order.Log.Retention; r != (Retention{MaxAge: time.Hour, MaxRecords: 10, MaxBytes: 1000, TrimEvery: time.Minute}) {
		t.Errorf("order retention = %+v", r)
	}
	if order.Log.MaxBatchSize != 50 || !reflect.DeepEqual(order.Queue.Targets, []string{"a", "b"}) ||
		order.Queue.Backoff != (Backoff{Initial: time.Second, Multiplier: 2, Max: time.Minute}) {
		t.Errorf("order = %+v", order)
	}
	if l := order.Log.Leases; l == nil || *l != (Leases{MaxParallelism: 3, LeaseDuration: 30 * time.Second, MaxAttempts: 7}) {
		t.Errorf("order leases = %+v", l)
	}
	if l := c.Type("noleases").Log.Leases; l != nil {
		t.Errorf("leases: null kept %+v", l)
	}
	if l := c.Type("partial").Log.Leases; l == nil || *l != (Leases{MaxParallelism: 3, LeaseDuration: 5 * time.Second, MaxAttempts: 7}) {
		t.Errorf("partial leases = %+v", l)
	}
	if r := c.Type("untrimmed").Log.Retention; r.TrimEvery != 0 || r.MaxRecords != 10 {
		t.Errorf("untrimmed retention = %+v", r)
	}
	if c.Type("aliased").Queue.Concurrency != 4 || c.Type("alias2").Queue.Concurrency != 4 || c.Type("empty").Queue.Concurrency != 1 {
		t.Error("aliases or empty types are not read as written")
	}
	// the result is a copy
	order.Queue.Targets[0] = "changed"
	if c.Type("order").Queue.Targets[0] != "a" {
		t.Error("Type shares its targets")
	}
	// no limit: no periodic trim
	if r := mustLoad(t, "types: {x: {log: {cold: false}}}\n", nil).Type("x").Log.Retention; r.TrimEvery != 0 {
		t.Errorf("TrimEvery without limits = %v", r.TrimEvery)
	}
}

func FuzzLoad(f *testing.F) {
	for _, s := range []string{specExample, "", "partitions: 5\n", "types: {a: &a {log: *a}}\n",
		"a: &a [*a]\n", "apps: [~, {}]\n", "types: {x: {log: {leases: ~}}}\n", "cluster: {}\n", "cold: {fs: ~}\n"} {
		f.Add([]byte(s))
	}
	vars := map[string]string{"HOLDFAST_S3_ACCESS_KEY": "a", "HOLDFAST_S3_SECRET_KEY": "s"}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := load("fuzz.yaml", data, env(vars))
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || !strings.HasPrefix(err.Error(), "config: ") {
				t.Fatalf("err = %v (%T)", err, err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Load accepted what Validate refuses: %v", err)
		}
		for name := range c.types {
			c.Type(name)
		}
	})
}

func TestLoad_BareZeroIsADuration(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/h.yaml"
	if err := os.WriteFile(path, []byte("types: {x: {log: {retention: {maxAge: 1h, trimEvery: 0}}}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path, func(string) string { return "" })
	if err != nil {
		t.Fatalf("trimEvery: 0 refused: %v", err)
	}
	if got := c.Type("x").Log.Retention.TrimEvery; got != 0 {
		t.Fatalf("trimEvery = %v, want 0 (off)", got)
	}
}

func TestLoad_Cluster(t *testing.T) {
	body := "cold: {fs: {dir: /mnt/shared/cold, shared: true}}\n" +
		"cluster: {name: prod, nodeId: n1, advertise: '10.0.0.1:7071', etcd: {endpoints: ['10.0.0.9:2379', '10.0.0.8:2379']}, leaseTtl: 3s,\n" +
		"  replicationFactor: 3, failoverTimeout: 1500ms, replaceAfter: 30m, raftAdvertise: '10.0.0.1:7072', raftBind: ':7072'}\n"
	if _, err := Load(writeConfig(t, body), func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "apps") {
		t.Fatalf("a cluster without apps: %v", err)
	}
	path := writeConfig(t, body+"apps: [{id: app_a, key: pk_a, secret: sk_a_0123456789abcdef}]\n")
	c, err := Load(path, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	cl := c.Cluster
	if cl == nil || cl.Name != "prod" || cl.NodeID != "n1" || cl.Advertise != "10.0.0.1:7071" || cl.LeaseTTL != 3*time.Second ||
		cl.ReplicationFactor != 3 || cl.FailoverTimeout != 1500*time.Millisecond || cl.ReplaceAfter != 30*time.Minute || cl.RaftAdvertise != "10.0.0.1:7072" || cl.RaftBind != ":7072" ||
		!c.Cold.FS.Shared || c.Cold.FS.Dir != "/mnt/shared/cold" ||
		!reflect.DeepEqual(cl.Etcd.Endpoints, []string{"10.0.0.9:2379", "10.0.0.8:2379"}) {
		t.Fatalf("cluster = %+v", cl)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if cl.Bind != cl.Advertise {
		t.Fatalf("bind = %q, want the default: advertise %q", cl.Bind, cl.Advertise)
	}
	// bind apart from advertise, on every interface.
	path = writeConfig(t, strings.Replace(body, "advertise: '10.0.0.1:7071'", "advertise: '10.0.0.1:7071', bind: ':7171'", 1)+
		"apps: [{id: app_a, key: pk_a, secret: sk_a_0123456789abcdef}]\n")
	if c, err = Load(path, func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
	if c.Cluster.Bind != ":7171" || c.Cluster.Advertise != "10.0.0.1:7071" {
		t.Fatalf("bind %q advertise %q", c.Cluster.Bind, c.Cluster.Advertise)
	}
}

func TestConfig_FlushesCold(t *testing.T) {
	for _, c := range []struct {
		body string
		want bool
	}{
		{"", false},
		{"types: {order: {log: {retention: {maxAge: 1h}}}}\n", false},
		{"types: {order: {log: {cold: true}}}\n", true},
		{"types: {\"*\": {log: {cold: true}}}\n", true},
		{"types: {\"*\": {log: {cold: true}}, order: {log: {cold: false}}}\n", true},
	} {
		if got := mustLoad(t, c.body, nil).FlushesCold(); got != c.want {
			t.Errorf("%q: FlushesCold %v, want %v", c.body, got, c.want)
		}
	}
}
