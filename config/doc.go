// Package config owns the configuration of `holdfast serve` (spec/config.md): the Config
// struct, its defaults, reading the optional YAML file and the HOLDFAST_* environment, and the
// checks that stop start-up on a wrong value. It starts nothing and opens nothing but the file.
//
// Precedence: built-in defaults, then the YAML file, then the environment (HOLDFAST_DATA_DIR,
// HOLDFAST_LISTEN, HOLDFAST_PARTITIONS, HOLDFAST_IDLE_TIMEOUT, HOLDFAST_MAX_CONNECTIONS,
// HOLDFAST_MEMORY_BUDGET), then flags. Load applies the first three; the serve command sets
// fields from its flags and calls Validate again.
//
// Invariants:
//   - Nothing is guessed: an unknown key (at any depth), a key set twice, a wrong type, a null
//     where a value is needed or an out-of-range value is an *Error naming the full key path
//     (types.order.log.retention.maxAge, apps[1].key, cold.s3.bucket) or the environment
//     variable, with the file and line when the value came from the file. Null for a section
//     (`log:` with nothing under it) means nothing is set there; `leases: null` turns leases
//     off and `cluster: null` means a single node.
//   - Durations are Go duration strings ("30s", "168h"); negative ones are refused.
//   - Every type's settings, "*" included, are checked at Load, used or not.
//   - Type(name) lays the type's keys over "*" key by key, then over the built-in defaults,
//     and returns fully resolved values.
//   - Error messages never contain a secret.
//
// Concurrency: Load, Validate and field assignments belong to one goroutine during start-up.
// Afterwards a Config is read-only and Type may be called from any goroutine.
package config
