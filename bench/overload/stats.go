package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This file holds the pure helpers of the run (no I/O of their own): latency
// percentiles, the classification of a reply, the parsing of /proc/<pid>/status
// and of the Prometheus text format, the values of the large writes, and the
// verdict on an acknowledged write against what was read back.

// percentile is the p-th percentile (0 < p <= 100) of sorted by the nearest-rank
// method: the smallest value with at least p% of the values at or below it.
// It is 0 for no values.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// latencies is the p50, p99 and max of ds (which it sorts).
type latencies struct {
	N             int
	P50, P99, Max time.Duration
}

func summarize(ds []time.Duration) latencies {
	slices.Sort(ds)
	l := latencies{N: len(ds), P50: percentile(ds, 50), P99: percentile(ds, 99)}
	if len(ds) > 0 {
		l.Max = ds[len(ds)-1]
	}
	return l
}

// class is what a reply says about a write's outcome.
type class uint8

const (
	// acked: a 2xx; the write is durable and must be readable.
	acked class = iota
	// refused: a 503 or 429, the node's answer to overload. A 429 wrote
	// nothing; a 503's outcome is unknown (spec/errors.md).
	refused
	// other: any other status, a timeout or a dropped connection.
	other
)

func classify(status int) class {
	switch {
	case status >= 200 && status < 300:
		return acked
	case status == 503 || status == 429:
		return refused
	}
	return other
}

// retryAfter reads a refusal: the body's retryAfterMs (ok false when the body
// is not JSON or has none) and whether a Retry-After header was there.
func retryAfter(body []byte, header string) (ms int64, ok bool, hasHeader bool) {
	var b struct {
		RetryAfterMs *json.Number `json:"retryAfterMs"`
	}
	if err := json.Unmarshal(body, &b); err == nil && b.RetryAfterMs != nil {
		if f, err := b.RetryAfterMs.Float64(); err == nil && f >= 0 {
			ms, ok = int64(f), true
		}
	}
	return ms, ok, strings.TrimSpace(header) != ""
}

// procStatus is the memory of a process from /proc/<pid>/status, in bytes.
type procStatus struct {
	VmRSS, RssAnon, RssFile, RssShmem int64
}

// parseProcStatus reads the kB fields of /proc/<pid>/status that procStatus
// names; a field that is missing stays 0.
func parseProcStatus(r io.Reader) (procStatus, error) {
	var s procStatus
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, rest, found := strings.Cut(sc.Text(), ":")
		if !found {
			continue
		}
		var dst *int64
		switch name {
		case "VmRSS":
			dst = &s.VmRSS
		case "RssAnon":
			dst = &s.RssAnon
		case "RssFile":
			dst = &s.RssFile
		case "RssShmem":
			dst = &s.RssShmem
		default:
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return s, fmt.Errorf("proc status: %s: unexpected %q", name, rest)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return s, fmt.Errorf("proc status: %s: %w", name, err)
		}
		*dst = kb << 10
	}
	return s, sc.Err()
}

// parseMetrics returns the value of every unlabelled sample of the Prometheus
// text format whose name is in want (other lines are skipped).
func parseMetrics(r io.Reader, want map[string]bool) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || !want[f[0]] {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return out, fmt.Errorf("metric %s: %w", f[0], err)
		}
		out[f[0]] = v
	}
	return out, sc.Err()
}

// valueAlphabet is what large values are made of: characters that JSON writes
// as they are, so a value's JSON is the value in quotes.
const valueAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

// values makes the value of a large write from its key and length alone, so
// that the run keeps only (key, length) per acknowledged write and the check
// rebuilds what must be read back.
type values struct {
	base []byte // valueAlphabet characters; at least maxLen longer than span
	span int    // offsets into base are below span
}

func newValues(maxLen int, seed uint64) *values {
	span := 1 << 20
	v := &values{base: make([]byte, span+maxLen), span: span}
	x := seed | 1
	for i := range v.base {
		// xorshift64: the content only needs to differ between keys.
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		v.base[i] = valueAlphabet[x%uint64(len(valueAlphabet))]
	}
	return v
}

// value is key, a dot, then base from an offset the key picks, n bytes in all
// (n is at least len(key)+1).
func (v *values) value(key string, n int) []byte {
	h := uint64(14695981039346656037) // FNV-1a
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	off := int(h % uint64(v.span))
	out := make([]byte, 0, n)
	out = append(out, key...)
	out = append(out, '.')
	return append(out, v.base[off:off+n-len(out)]...)
}

// counterVerdict judges a counter that its group incremented by 1: acked
// increments were acknowledged, uncertain ones had an unknown outcome (a 5xx,
// a timeout). The counter must hold every acked one and cannot hold more than
// acked+uncertain. found false means the object has no such slot (404).
func counterVerdict(ackedN, uncertain int, got int64, found bool) string {
	if !found {
		got = 0
	}
	switch {
	case got < int64(ackedN):
		return fmt.Sprintf("LOST: %d increments acknowledged, the counter is %d", ackedN, got)
	case got > int64(ackedN+uncertain):
		return fmt.Sprintf("PHANTOM: the counter is %d, more than %d acknowledged plus %d of unknown outcome", got, ackedN, uncertain)
	}
	return ""
}

// slotVerdict judges an acknowledged large write: body is the reply of GET
// /{slot} ({"value": ...}), found false a 404. want is the value written.
func slotVerdict(want []byte, body []byte, found bool) string {
	if !found {
		return fmt.Sprintf("LOST: acknowledged %d bytes, the slot is not there", len(want))
	}
	var r struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Sprintf("WRONG: the reply is not {\"value\": ...}: %v", err)
	}
	var got string
	if err := json.Unmarshal(r.Value, &got); err != nil {
		return fmt.Sprintf("WRONG: the value is not a string (%d bytes of JSON)", len(r.Value))
	}
	if got != string(want) {
		return fmt.Sprintf("WRONG: acknowledged %d bytes, read %d bytes that differ", len(want), len(got))
	}
	return ""
}
