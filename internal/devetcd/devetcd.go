// Package devetcd runs a single-member etcd server inside the process, for tests
// and for `holdfast serve --dev-cluster`. A production cluster uses its own etcd.
package devetcd

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is a running embedded etcd.
type Server struct {
	e   *embed.Etcd
	url string
}

// Config configures Start.
type Config struct {
	// Dir holds etcd's data. Required.
	Dir string
	// ClientAddr is the host:port clients connect to; empty means 127.0.0.1 and a
	// free port.
	ClientAddr string
	// PeerAddr is the host:port of the (unused) peer listener; empty means
	// 127.0.0.1 and a free port.
	PeerAddr string
}

// Start starts etcd and waits until it serves. When it picked the ports itself
// and another process took one between the pick and etcd's listen (tests of
// several packages start servers at once), it starts again on fresh ports.
func Start(cfg Config) (*Server, error) {
	picked := cfg.ClientAddr == "" || cfg.PeerAddr == ""
	for attempt := 1; ; attempt++ {
		s, err := start(cfg)
		if err == nil || !picked || !errors.Is(err, syscall.EADDRINUSE) || attempt == 5 {
			return s, err
		}
	}
}

func start(cfg Config) (*Server, error) {
	var err error
	if cfg.ClientAddr == "" {
		if cfg.ClientAddr, err = freeAddr(); err != nil {
			return nil, err
		}
	}
	if cfg.PeerAddr == "" {
		if cfg.PeerAddr, err = freeAddr(); err != nil {
			return nil, err
		}
	}
	curl, err := url.Parse("http://" + cfg.ClientAddr)
	if err != nil {
		return nil, fmt.Errorf("devetcd: client address: %w", err)
	}
	purl, err := url.Parse("http://" + cfg.PeerAddr)
	if err != nil {
		return nil, fmt.Errorf("devetcd: peer address: %w", err)
	}
	ec := embed.NewConfig()
	ec.Name = "holdfast-dev"
	ec.Dir = cfg.Dir
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*curl}, []url.URL{*curl}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*purl}, []url.URL{*purl}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.LogLevel = "error"
	// etcd logs its own shutdown as errors; a dev server stays quiet.
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("devetcd: start: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("devetcd: %w", err)
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, errors.New("devetcd: not ready after 30s")
	}
	return &Server{e: e, url: curl.Host}, nil
}

// Endpoint is the host:port clients use.
func (s *Server) Endpoint() string { return s.url }

// Close stops the server.
func (s *Server) Close() { s.e.Close() }

// freeAddr picks a free port; a variable so that a test can pick a taken one.
var freeAddr = func() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("devetcd: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}
