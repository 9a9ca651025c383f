package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast/cold"
)

// Does every node read the same cold store?
//
// A replicated cluster needs it: a log's leader flushes trimmed records to the
// cold store, and whichever replica leads next must read them there. Start
// refuses a store only one node reads (cold.fs without cold.fs.shared), but
// cold.fs.shared is the operator's word: a directory that is not in fact one
// mount (a typo, a mount that failed and left the local directory, a bucket
// or prefix that differs between nodes) loses nothing at first and makes the
// trimmed records unreadable after the next failover.
//
// So each node checks it, through the store itself, as Kafka's brokers check
// a cluster id: it creates a marker object named after its own id and its
// boot (the per-run token every node publishes in etcd), and looks for every
// other live node's marker of that node's current boot (of the nodes that say
// in etcd that they write one). A marker still
// missing coldShareGrace after this node first saw that boot means the two
// nodes do not read the same store. Until every live node's marker is found
// again (and until its first round found them), the node refuses to create cold objects (coldShare.Create): a flush
// fails as when the store is down (the records stay hot, and the flush is
// tried again), and the error says why. Every node does the same, so a
// cluster with one misconfigured node stops flushing everywhere rather than
// write segments that node could not read when it leads.
//
// Reads, listings and deletes pass through: what was written stays readable
// where it can be.

// coldShareGrace is how long a node's marker may stay invisible before its
// absence counts: network file systems cache a directory's entries (NFS up to
// 60 s by default, acdirmax).
const coldShareGrace = 75 * time.Second

// coldShareEvery is how often a node looks for the other nodes' markers, and
// coldSharePending how often while some marker is not found yet.
const (
	coldShareEvery   = 10 * time.Second
	coldSharePending = 500 * time.Millisecond
)

// coldShare is a node's check, and the cold store its host writes through.
type coldShare struct {
	cold.Store // the node's own store, unguarded
	root       string
	self, boot string
	grace      time.Duration
	log        *slog.Logger
	now        func() time.Time

	mu    sync.Mutex
	wrote bool // this run's marker is in the store
	// storeDown: the marker's write failed, and was logged once.
	storeDown bool
	seen      map[string]bootSeen // node id -> the boot this node last saw, since when
	// refusal is the error Create returns: set while some live node's
	// marker is missing past its grace (and until the first round), cleared
	// by a round that finds every live node's.
	refusal error
}

var _ cold.Store = (*coldShare)(nil)

type bootSeen struct {
	boot  string
	since time.Time
}

// newColdShare guards store for node self (this run: boot) of cluster name;
// a missing marker counts after grace.
func newColdShare(store cold.Store, name, self, boot string, grace time.Duration, log *slog.Logger) *coldShare {
	return &coldShare{
		Store: store, root: "cluster/" + keyName(name) + "/shared/", self: self, boot: boot,
		grace: grace, log: log, now: time.Now,
		seen: map[string]bootSeen{}, refusal: errColdNotChecked,
	}
}

// keyName is name as one valid segment of a cold key: its base64url form, or
// for a long name the hex of its SHA-256, so that a marker's key stays within
// cold.MaxKeyLen whatever the names (cold's own layout, for log segments,
// keeps long names whole, in pieces, and may exceed it).
func keyName(name string) string {
	if s := base64.RawURLEncoding.EncodeToString([]byte(name)); len(s) <= 200 && s != "" {
		return s
	}
	sum := sha256.Sum256([]byte(name))
	return "h" + hex.EncodeToString(sum[:])
}

// marker is the key of node id's marker for its run boot.
func (c *coldShare) marker(id, boot string) string {
	return c.root + keyName(id) + "/" + keyName(boot)
}

// Create creates key in the store, unless some live node does not read it.
func (c *coldShare) Create(ctx context.Context, key string, data []byte) error {
	c.mu.Lock()
	err := c.refusal
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.Store.Create(ctx, key, data)
}

// errColdNotShared wraps every refusal; errColdNotChecked is the refusal
// until the first round found every live node's marker (a node just started
// does not know yet).
var (
	errColdNotShared  = errors.New("cluster: the cold store is not shared by every node")
	errColdNotChecked = fmt.Errorf("%w: not checked yet (this node just started)", errColdNotShared)
)

// check is one round: this run's marker written (and the earlier runs'
// removed) once, then every other live node's marker looked for. nodes are
// the live nodes of the view; only those that say they write a marker
// (NodeInfo.ColdMarker) are looked for: not client members, nodes of an
// earlier version (a rolling upgrade does not stop the flushes), nor nodes
// nothing flushes cold on.
// It reports whether the round left something to learn soon: a node's
// marker not found yet within its grace. A store that did not answer is not
// that: the next round comes at the usual interval.
func (c *coldShare) check(ctx context.Context, nodes map[string]NodeInfo) (pending bool) {
	c.mu.Lock()
	wrote := c.wrote
	c.mu.Unlock()
	if !wrote {
		key := c.marker(c.self, c.boot)
		if err := c.Store.Create(ctx, key, []byte(c.self+" "+c.boot)); err != nil && !errors.Is(err, cold.ErrExists) {
			// Once per outage, not every round: a store down for hours
			// would fill the log.
			c.mu.Lock()
			first := !c.storeDown
			c.storeDown = true
			c.mu.Unlock()
			if first {
				c.log.Warn("cannot write this node's marker in the cold store; trying again every round", "key", key, "err", err)
			}
			return false
		}
		c.mu.Lock()
		c.wrote, c.storeDown = true, false
		c.mu.Unlock()
		c.forgetEarlierRuns(ctx)
	}
	now := c.now()
	var missing []string // node ids, with the key looked for
	allFound := true
	for id, n := range nodes {
		if id == c.self || !n.ColdMarker || n.Boot == "" {
			continue
		}
		c.mu.Lock()
		s, ok := c.seen[id]
		if !ok || s.boot != n.Boot {
			s = bootSeen{boot: n.Boot, since: now}
			c.seen[id] = s
		}
		c.mu.Unlock()
		key := c.marker(id, n.Boot)
		_, err := c.Store.Stat(ctx, key)
		switch {
		case err == nil:
		case errors.Is(err, cold.ErrNotFound):
			allFound = false
			if now.Sub(s.since) >= c.grace {
				missing = append(missing, fmt.Sprintf("node %s (%s)", id, key))
			} else {
				pending = true
			}
		default:
			// The store did not answer: nothing learned this round.
			c.log.Debug("cold store share check: cannot look for a node's marker", "node", id, "key", key, "err", err)
			return false
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.seen {
		if _, live := nodes[id]; !live {
			delete(c.seen, id)
		}
	}
	was := c.refusal
	switch {
	case len(missing) > 0:
		slices.Sort(missing)
		c.refusal = fmt.Errorf("%w: this node (%s) does not find the markers of %s, known for more than %v: cold.fs.dir must be one directory every node mounts, or cold.s3 the same bucket and prefix on every node; no cold segment is written until every live node's marker is found",
			errColdNotShared, c.self, strings.Join(missing, ", "), c.grace)
		if was == nil || was.Error() != c.refusal.Error() {
			c.log.Error("the cold store is not shared by every node: no cold segment is written until it is", "node", c.self, "missing", missing, "grace", c.grace)
		}
	case allFound:
		c.refusal = nil
		if was != nil && !errors.Is(was, errColdNotChecked) {
			c.log.Info("every live node's marker is in the cold store again: cold segments are written again", "node", c.self)
		}
	}
	// Otherwise some node's marker is not found yet, within its grace: the
	// verdict stands.
	return pending
}

// forgetEarlierRuns deletes this node's markers of earlier runs (best
// effort: a leftover marker is harmless, only never looked for).
func (c *coldShare) forgetEarlierRuns(ctx context.Context) {
	prefix := c.root + keyName(c.self) + "/"
	infos, err := c.Store.List(ctx, prefix)
	if err != nil {
		return
	}
	mine := c.marker(c.self, c.boot)
	for _, in := range infos {
		if in.Key != mine {
			_ = c.Store.Delete(ctx, in.Key)
		}
	}
}

// notShared returns the current refusal, nil when none (tests, status).
func (c *coldShare) notShared() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refusal
}

// loop runs check until ctx ends: every every, or every coldSharePending
// while a round left something to learn (so that a node's first round, and
// a new node's marker, count soon: a flush waits for them); timeout bounds
// each round's store calls.
func (c *coldShare) loop(ctx context.Context, every, timeout time.Duration, nodes func() map[string]NodeInfo) {
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		pending := c.check(cctx, nodes())
		cancel()
		wait := every
		if pending {
			wait = min(every, coldSharePending)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// coldShareCheck returns m's cold store share check; nil for a node of one
// copy, without a cold store, or with one nothing flushes to.
func (m *member) coldShareCheck() *coldShare {
	if m == nil {
		return nil
	}
	return m.coldShare
}
