package main

import (
	"context"
	"math/rand"
	"net/http"
	"sync"
	"testing"
	"time"
)

// crashTarget is what a crash test's clients talk to and what it kills: one
// server, or a cluster of server processes (cluster_crash_test.go).
type crashTarget interface {
	// url returns where to send the next request.
	url(r *rand.Rand) string
	// fault SIGKILLs the server (a random node of a cluster), starts it again on
	// its data and returns once it serves; it returns the restarted server.
	fault(t *testing.T, r *rand.Rand) *server
	// close stops what is still running.
	close(t *testing.T)
}

// singleTarget is one server process.
type singleTarget struct {
	dataDir, cfgFile string
	mu               sync.Mutex
	srv              *server
}

func newSingleTarget(t *testing.T, dataDir, cfgFile string) *singleTarget {
	return &singleTarget{dataDir: dataDir, cfgFile: cfgFile, srv: startServer(t, dataDir, cfgFile)}
}

func (s *singleTarget) url(*rand.Rand) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv.url
}

func (s *singleTarget) fault(t *testing.T, r *rand.Rand) *server {
	s.mu.Lock()
	old := s.srv
	s.mu.Unlock()
	old.kill(t)
	time.Sleep(time.Duration(r.Intn(100)) * time.Millisecond)
	srv := startServer(t, s.dataDir, s.cfgFile)
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	return srv
}

func (s *singleTarget) close(t *testing.T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv.kill(t)
}

// A cluster of processes is a crash target too: requests go to a random live
// node, and a fault kills a random node and brings it back with its data.

func (pc *procCluster) url(r *rand.Rand) string {
	for {
		urls := pc.urls()
		if len(urls) > 0 {
			pc.mu.Lock()
			defer pc.mu.Unlock()
			return urls[pc.rng(r).Intn(len(urls))]
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rng returns r, or the cluster's own generator for callers without one.
func (pc *procCluster) rng(r *rand.Rand) *rand.Rand {
	if r != nil {
		return r
	}
	if pc.own == nil {
		pc.own = rand.New(rand.NewSource(time.Now().UnixNano()))
	}
	return pc.own
}

func (pc *procCluster) fault(t *testing.T, r *rand.Rand) *server {
	pc.mu.Lock()
	var ids []string
	for id := range pc.servers {
		ids = append(ids, id)
	}
	pc.mu.Unlock()
	victim := ids[r.Intn(len(ids))]
	pc.kill(victim)
	time.Sleep(time.Duration(r.Intn(100)) * time.Millisecond)
	s := pc.start(victim)
	pc.waitStable(60 * time.Second)
	t.Logf("killed node %s and started it again", victim)
	return s
}

func (pc *procCluster) close(*testing.T) {}

// callSettled is call for a check after the faults: a 503 (a partition still
// being taken up after a restart, a node not yet reachable again) is asked
// again for up to 15 s; any other outcome is returned as it is.
func callSettled(c *http.Client, method, url string) (int, map[string]any, error) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		status, reply, err := call(context.Background(), c, method, url, nil)
		if err != nil || status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			return status, reply, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
