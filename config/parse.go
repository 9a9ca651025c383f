package config

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// kind is the kind of value a key holds.
type kind int

const (
	kindInt      kind = iota // a YAML integer, kept as int64
	kindDuration             // a Go duration string (30s, 168h), kept as time.Duration
	kindBool                 // true or false
	kindNumber               // an integer or a float, kept as float64
	kindList                 // a list of strings, kept as []string
	kindString               // a string (quoted when YAML would read it as something else)
	kindSection              // a mapping of further keys; null sets nothing
	kindSwitch               // a section whose null means "off": kept as a bool (on)
	kindApps                 // the apps list, kept as []App
	kindTypes                // the types mapping, kept as map[string]layer
)

// A layer is what a mapping set: values by key path relative to it ("log.retention.maxAge"),
// kept as the kinds above say.
type layer map[string]any

// leaf describes one key of a schema: its kind, and for keys under types.<name> its default
// and range (for durations in nanoseconds; max 0 is no maximum).
type leaf struct {
	kind     kind
	def      any
	min, max int64
}

// topKeys is the schema of the file; leaves is that of types.<name>, appKeys that of apps[i].
var (
	topKeys = map[string]leaf{
		"dataDir": {kind: kindString}, "listen": {kind: kindString}, "partitions": {kind: kindInt},
		"idleTimeout": {kind: kindDuration}, "maxConnections": {kind: kindInt}, "memoryBudget": {kind: kindInt}, "apps": {kind: kindApps}, "types": {kind: kindTypes},
		"cold": {kind: kindSection}, "cold.store": {kind: kindString},
		"cold.fs": {kind: kindSection}, "cold.fs.dir": {kind: kindString}, "cold.fs.shared": {kind: kindBool},
		"cold.s3": {kind: kindSection}, "cold.s3.endpoint": {kind: kindString}, "cold.s3.bucket": {kind: kindString},
		"cold.s3.accessKeyEnv": {kind: kindString}, "cold.s3.secretKeyEnv": {kind: kindString},
		"cold.s3.secure": {kind: kindBool}, "cold.s3.region": {kind: kindString}, "cold.s3.prefix": {kind: kindString},
		"cluster": {kind: kindSwitch}, "cluster.name": {kind: kindString}, "cluster.nodeId": {kind: kindString},
		"cluster.advertise": {kind: kindString}, "cluster.bind": {kind: kindString}, "cluster.etcd": {kind: kindSection}, "cluster.etcd.endpoints": {kind: kindList},
		"cluster.leaseTtl": {kind: kindDuration}, "cluster.replicationFactor": {kind: kindInt}, "cluster.failoverTimeout": {kind: kindDuration}, "cluster.replaceAfter": {kind: kindDuration},
		"cluster.raftAdvertise": {kind: kindString}, "cluster.raftBind": {kind: kindString},
	}
	appKeys = map[string]leaf{"id": {kind: kindString}, "key": {kind: kindString},
		"secret": {kind: kindString}, "secretEnv": {kind: kindString}}
)

// parser reads the YAML file by walking its node tree against a schema, so that every error
// names the full key path and the line. It checks keys and kinds; Validate checks values.
// Null for a section means nothing is set there; only `leases: null` and `cluster: null`
// mean something of their own. Null, or another kind than expected, for a value is refused.
type parser struct {
	file   string
	getenv func(string) string
	lines  map[string]int // the line of each key path's value, for Validate's errors
}

func (p *parser) errf(n *yaml.Node, key, format string, args ...any) error {
	e := &Error{Key: key, File: p.file, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line = n.Line
	}
	return e
}

func (p *parser) parse(data []byte, c *Config) (err error) {
	defer func() { // yaml.v3 is not known to panic, but no input may crash start-up
		if r := recover(); r != nil {
			err = &Error{File: p.file, Msg: fmt.Sprintf("not valid YAML (parser panic: %v)", r)}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc, more yaml.Node
	if err := dec.Decode(&doc); err == io.EOF {
		return nil // an empty file sets nothing
	} else if err != nil {
		return &Error{File: p.file, Msg: "not valid YAML", Err: err}
	}
	if err := dec.Decode(&more); err == nil {
		return &Error{File: p.file, Msg: "holds more than one YAML document"}
	} else if err != io.EOF {
		return &Error{File: p.file, Msg: "not valid YAML", Err: err}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	top := layer{}
	if err := p.walk(root, "", "", topKeys, top); err != nil {
		return err
	}
	c.set(top)
	return nil
}

// set copies what the file set into c.
func (c *Config) set(top layer) {
	var cl Cluster
	s := &c.Cold.S3
	for k, dst := range map[string]*string{"dataDir": &c.DataDir, "listen": &c.Listen,
		"cold.store": &c.Cold.Store, "cold.fs.dir": &c.Cold.FS.Dir, "cold.s3.endpoint": &s.Endpoint,
		"cold.s3.bucket": &s.Bucket, "cold.s3.accessKeyEnv": &s.AccessKeyEnv, "cold.s3.secretKeyEnv": &s.SecretKeyEnv,
		"cold.s3.region": &s.Region, "cold.s3.prefix": &s.Prefix,
		"cluster.name": &cl.Name, "cluster.nodeId": &cl.NodeID, "cluster.advertise": &cl.Advertise, "cluster.bind": &cl.Bind,
		"cluster.raftAdvertise": &cl.RaftAdvertise, "cluster.raftBind": &cl.RaftBind} {
		if v, ok := top[k].(string); ok {
			*dst = v
		}
	}
	if n, ok := top["partitions"].(int64); ok {
		c.Partitions = int(max(min(n, math.MaxInt32), math.MinInt32)) // out of range stays out of range
	}
	if n, ok := top["maxConnections"].(int64); ok {
		c.MaxConnections = int(max(min(n, math.MaxInt32), math.MinInt32)) // out of range stays out of range
	}
	if d, ok := top["idleTimeout"].(time.Duration); ok {
		c.IdleTimeout = d
	}
	if n, ok := top["memoryBudget"].(int64); ok {
		c.MemoryBudget = n
	}
	if _, ok := top["cold.fs.dir"]; ok {
		c.autoColdDir = "" // set by the file: not derived from dataDir again
	}
	s.Secure, _ = top["cold.s3.secure"].(bool)
	c.Cold.FS.Shared, _ = top["cold.fs.shared"].(bool)
	cl.Etcd.Endpoints, _ = top["cluster.etcd.endpoints"].([]string)
	cl.LeaseTTL, _ = top["cluster.leaseTtl"].(time.Duration)
	cl.FailoverTimeout, _ = top["cluster.failoverTimeout"].(time.Duration)
	cl.ReplaceAfter, _ = top["cluster.replaceAfter"].(time.Duration)
	if n, ok := top["cluster.replicationFactor"].(int64); ok {
		cl.ReplicationFactor = int(max(min(n, math.MaxInt32), math.MinInt32)) // out of range stays out of range
	}
	if on, _ := top["cluster"].(bool); on {
		c.Cluster = &cl
	}
	c.Apps, _ = top["apps"].([]App)
	c.types, _ = top["types"].(map[string]layer)
}

// walk reads the mapping v at key (rel within schema) into l.
func (p *parser) walk(v *yaml.Node, key, rel string, schema map[string]leaf, l layer) error {
	return p.each(v, key, func(name, key string, k, v *yaml.Node) (err error) {
		r := name
		if rel != "" {
			r = rel + "." + name
		}
		lf, ok := schema[r]
		if !ok {
			return p.errf(k, key, "unknown key (known keys: %s)", strings.Join(children(schema, rel), ", "))
		}
		switch lf.kind {
		case kindSwitch:
			if l[r] = !isNull(deref(v)); l[r] == false {
				return nil
			}
			fallthrough
		case kindSection:
			return p.walk(v, key, r, schema, l)
		case kindApps:
			l[r], err = p.apps(v, key)
		case kindTypes:
			types := map[string]layer{}
			l[r], err = types, p.each(v, key, func(name, key string, k, v *yaml.Node) error {
				types[name] = layer{}
				return p.walk(v, key, "", leaves, types[name])
			})
		default:
			l[r], err = p.value(v, key, lf.kind)
		}
		return err
	})
}

// children lists the keys allowed directly under rel ("" for the top of the schema).
func children(schema map[string]leaf, rel string) []string {
	var out []string
	for k := range schema {
		if i := strings.LastIndexByte(k, '.'); (i < 0 && rel == "") || (i >= 0 && k[:i] == rel) {
			out = append(out, k[i+1:])
		}
	}
	sort.Strings(out)
	return out
}

// apps reads the apps, and the secrets their secretEnv names.
func (p *parser) apps(v *yaml.Node, key string) ([]App, error) {
	if v = deref(v); isNull(v) {
		return nil, nil
	} else if v.Kind != yaml.SequenceNode {
		return nil, p.errf(v, key, "expected a list of apps, got %s", describe(v))
	}
	var apps []App
	for i, item := range v.Content {
		at := fmt.Sprintf("%s[%d]", key, i)
		p.lines[at] = item.Line
		l := layer{}
		if err := p.walk(item, at, "", appKeys, l); err != nil {
			return nil, err
		}
		str := func(k string) string { s, _ := l[k].(string); return s }
		a := App{ID: str("id"), Key: str("key"), Secret: str("secret"), SecretEnv: str("secretEnv")}
		if _, ok := l["secretEnv"]; ok {
			if _, both := l["secret"]; both {
				return nil, p.errf(item, at, "set secret or secretEnv, not both")
			}
			a.Secret = p.getenv(a.SecretEnv)
		}
		apps = append(apps, a)
	}
	return apps, nil
}

// each walks the mapping n (null: nothing), refusing keys set twice.
func (p *parser) each(n *yaml.Node, path string, fn func(name, key string, k, v *yaml.Node) error) error {
	if n = deref(n); isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		if path == "" {
			return p.errf(nil, "", "expected a mapping of keys at the top level, got %s", describe(n))
		}
		return p.errf(n, path, "expected a mapping, got %s", describe(n))
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := k.Value
		if path != "" {
			key = path + "." + k.Value
		}
		switch first, dup := seen[k.Value]; {
		case k.Kind != yaml.ScalarNode:
			return p.errf(k, path, "keys must be plain strings, got %s", describe(k))
		case dup:
			return p.errf(k, key, "set twice (first on line %d)", first)
		}
		seen[k.Value] = k.Line
		p.lines[key] = deref(v).Line
		if err := fn(k.Value, key, k, v); err != nil {
			return err
		}
	}
	return nil
}

// value reads one value of kind k (not a section).
func (p *parser) value(v *yaml.Node, key string, k kind) (any, error) {
	if v = deref(v); k == kindList {
		if v.Kind != yaml.SequenceNode {
			return nil, p.errf(v, key, "expected a list, got %s", describe(v))
		}
		out := make([]string, len(v.Content))
		for i, item := range v.Content {
			s, err := p.value(item, fmt.Sprintf("%s[%d]", key, i), kindString)
			if err != nil {
				return nil, err
			}
			out[i] = s.(string)
		}
		return out, nil
	}
	want := map[kind]string{kindInt: "an integer", kindDuration: "a duration string such as 30s or 0s",
		kindBool: "true or false", kindNumber: "a number", kindString: "a string"}[k]
	tag := map[kind]string{kindInt: "!!int", kindBool: "!!bool", kindNumber: "!!float"}[k]
	if tag == "" {
		tag = "!!str"
	}
	// A bare 0 is a duration too: spec/config.md writes "0 turns it off".
	zeroDuration := k == kindDuration && v.ShortTag() == "!!int" && v.Value == "0"
	if v.Kind != yaml.ScalarNode || (v.ShortTag() != tag && !(k == kindNumber && v.ShortTag() == "!!int") && !zeroDuration) {
		hint := ""
		if k == kindString && v.Kind == yaml.ScalarNode && !isNull(v) {
			hint = " (quote it)"
		}
		return nil, p.errf(v, key, "expected %s, got %s%s", want, describe(v), hint)
	}
	var out any
	var err error
	switch k {
	case kindString:
		return v.Value, nil
	case kindDuration:
		out, err = time.ParseDuration(v.Value)
	case kindInt:
		var i int64
		err = v.Decode(&i)
		out = i
	case kindNumber:
		var f float64
		err = v.Decode(&f)
		out = f
	case kindBool:
		var b bool
		err = v.Decode(&b)
		out = b
	}
	if err != nil { // never a secret: those are strings
		return nil, p.errf(v, key, "expected %s, got %q", want, v.Value)
	}
	return out, nil
}

// deref follows aliases to the anchored node.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; i < 8 && n.Kind == yaml.AliasNode && n.Alias != nil; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == 0 || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe names what a node is, never quoting it (it may be a secret).
func describe(n *yaml.Node) string {
	if d, ok := map[yaml.Kind]string{yaml.MappingNode: "a mapping", yaml.SequenceNode: "a list",
		yaml.AliasNode: "an alias", yaml.DocumentNode: "a document"}[n.Kind]; ok {
		return d
	}
	if d, ok := map[string]string{"!!str": "a string", "!!int": "an integer", "!!float": "a number",
		"!!bool": "a boolean", "!!null": "null", "!!timestamp": "a timestamp"}[n.ShortTag()]; ok {
		return d
	}
	return "a value tagged " + n.ShortTag()
}
