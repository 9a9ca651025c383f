// Package ownership is the cluster tests' ownership checker. Every reply says
// which node served it, for which partition, under which epoch; the checker
// proves that no two nodes served one partition under one epoch, and that the
// serving periods of different nodes for one partition never overlap in time.
package ownership

import (
	"fmt"
	"sync"
	"time"
)

// Checker collects what replies prove. It is safe for concurrent use.
type Checker struct {
	mu      sync.Mutex
	periods map[uint32]map[uint64]*period // partition, epoch
}

// A reply sent at start and received at end proves that its node served the
// partition at some moment in [start, end]. first is the earliest end seen
// and last the latest start: the node certainly served at both.
type period struct {
	node        string
	first, last time.Time
}

// New returns an empty checker.
func New() *Checker { return &Checker{periods: map[uint32]map[uint64]*period{}} }

// Record notes a reply that node served for partition under epoch, asked at
// start and answered at end. It fails at once if another node already served
// that partition under that epoch.
func (c *Checker) Record(node string, partition uint32, epoch uint64, start, end time.Time) error {
	if node == "" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.periods[partition]
	if m == nil {
		m = map[uint64]*period{}
		c.periods[partition] = m
	}
	pr := m[epoch]
	if pr == nil {
		m[epoch] = &period{node: node, first: end, last: start}
		return nil
	}
	if pr.node != node {
		return fmt.Errorf("partition %d epoch %d served by both %s and %s", partition, epoch, pr.node, node)
	}
	if end.Before(pr.first) {
		pr.first = end
	}
	if start.After(pr.last) {
		pr.last = start
	}
	return nil
}

// Verify checks, for every partition, that a node serving at a higher epoch
// did so only after every other node's serving at a lower epoch: a proven
// moment of epoch e2 > e1 by another node may not come before a proven moment
// of e1.
func (c *Checker) Verify() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, m := range c.periods {
		for e1, a := range m {
			for e2, b := range m {
				if e1 < e2 && a.node != b.node && b.first.Before(a.last) {
					return fmt.Errorf("partition %d: %s served epoch %d until at least %v, but %s served epoch %d already at %v",
						p, a.node, e1, a.last.Format(time.RFC3339Nano), b.node, e2, b.first.Format(time.RFC3339Nano))
				}
			}
		}
	}
	return nil
}

// Replies returns how many (partition, epoch) periods were recorded.
func (c *Checker) Periods() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.periods {
		n += len(m)
	}
	return n
}
