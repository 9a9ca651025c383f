package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// session is a node's etcd lease: the node serves partitions only while it
// holds one. It is renewed by hand, not by clientv3's KeepAlive stream, so that
// the node knows from its own clock until when the lease certainly holds: etcd
// counts a lease's TTL from when it handles a renewal, which is after the
// renewal was sent, so the lease holds at least until send time + TTL. The node
// stops serving at send time + TTL - margin; another node can only take over
// after etcd expired the lease, later still.
type session struct {
	cli   *clientv3.Client
	ttl   time.Duration
	lease clientv3.LeaseID
	log   *slog.Logger

	validUntil atomic.Int64 // unix nanoseconds
	lost       chan struct{}
	lostOnce   atomic.Bool
	now        func() time.Time
}

// safetyMargin is how long before the computed end of its lease a node stops
// serving: room for clock rate differences and scheduling delays.
func safetyMargin(ttl time.Duration) time.Duration { return max(ttl/10, 200*time.Millisecond) }

// newSession grants a lease of ttl (whole seconds, at least 2).
func newSession(ctx context.Context, cli *clientv3.Client, ttl time.Duration, log *slog.Logger) (*session, error) {
	secs := int64((ttl + time.Second - 1) / time.Second)
	if secs < 2 {
		secs = 2
	}
	s := &session{cli: cli, ttl: time.Duration(secs) * time.Second, log: log, lost: make(chan struct{}), now: time.Now}
	t0 := s.now()
	gctx, cancel := context.WithTimeout(ctx, s.ttl)
	defer cancel()
	resp, err := cli.Grant(gctx, secs)
	if err != nil {
		return nil, fmt.Errorf("grant an etcd lease: %w", err)
	}
	s.lease = resp.ID
	s.validUntil.Store(t0.Add(time.Duration(resp.TTL)*time.Second - safetyMargin(s.ttl)).UnixNano())
	return s, nil
}

// valid reports whether the lease certainly still holds.
func (s *session) valid() bool { return s.now().UnixNano() < s.validUntil.Load() }

// until returns the time until which the lease certainly holds.
func (s *session) until() time.Time { return time.Unix(0, s.validUntil.Load()) }

// Lost is closed once the lease is gone or may be.
func (s *session) Lost() <-chan struct{} { return s.lost }

func (s *session) markLost(why string, err error) {
	if s.lostOnce.CompareAndSwap(false, true) {
		if err != nil || why != "revoked" {
			s.log.Warn("etcd lease lost; this node stops serving its partitions", "why", why, "err", err, "lease", int64(s.lease))
		}
		close(s.lost)
	}
}

// keepAlive renews the lease every third of its TTL until ctx ends or the lease
// is lost (etcd says it is gone, or no renewal succeeded before it might have
// expired).
func (s *session) keepAlive(ctx context.Context) {
	every := s.ttl / 3
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.lost:
			return
		case <-time.After(every):
		}
		t0 := s.now()
		rctx, cancel := context.WithTimeout(ctx, every)
		resp, err := s.cli.KeepAliveOnce(rctx, s.lease)
		cancel()
		switch {
		case err == nil && resp.TTL > 0:
			s.validUntil.Store(t0.Add(time.Duration(resp.TTL)*time.Second - safetyMargin(s.ttl)).UnixNano())
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && resp.TTL <= 0):
			s.markLost("etcd expired the lease", err)
			return
		case ctx.Err() != nil:
			return
		default:
			if !s.valid() {
				s.markLost("no renewal reached etcd in time", err)
				return
			}
			s.log.Debug("etcd lease renewal failed; retrying", "err", err)
		}
	}
}

// revoke gives the lease up (a graceful stop): every key attached to it goes.
func (s *session) revoke() {
	s.validUntil.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, _ = s.cli.Revoke(ctx, s.lease)
	s.markLost("revoked", nil)
}
