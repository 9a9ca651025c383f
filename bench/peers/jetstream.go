package peers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream is a NATS server with JetStream embedded in this process, with a
// file store and SyncAlways set (the sync_interval: always setting): the file
// store fsyncs every stream write before the publish is acknowledged. Its
// client connects over TCP on 127.0.0.1.
//
// JetStream does not fsync consumer acknowledgements: a consumer's state is
// written by a background flusher (at most about ten times a second), after
// the ack has been confirmed to the client.
type JetStream struct {
	dir  string
	port int // server.RANDOM_PORT until the first start has picked one

	mu   sync.Mutex
	srv  *server.Server
	opts *server.Options
	nc   *nats.Conn
	js   jetstream.JetStream
}

// StartJetStream starts an embedded NATS server with JetStream, its file store
// in dir, fsync on every write, on a random port of 127.0.0.1, and connects a
// client to it.
func StartJetStream(dir string) (*JetStream, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("peers: jetstream dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("peers: jetstream dir: %w", err)
	}
	j := &JetStream{dir: dir, port: server.RANDOM_PORT}
	if _, err := j.start(true, nil); err != nil {
		return nil, err
	}
	slog.Debug("jetstream started", "addr", j.Addr(), "dir", dir)
	return j, nil
}

// options returns the server options: JetStream with its store in the
// directory, and SyncAlways as asked (true except while filling fast).
func (j *JetStream) options(syncAlways bool) *server.Options {
	j.mu.Lock()
	port := j.port
	j.mu.Unlock()
	return &server.Options{
		ServerName:             "holdfast-bench-peer",
		Host:                   "127.0.0.1",
		Port:                   port,
		JetStream:              true,
		StoreDir:               j.dir,
		SyncAlways:             syncAlways,
		NoLog:                  true,
		NoSigs:                 true,
		DisableJetStreamBanner: true,
	}
}

// Name returns "jetstream".
func (j *JetStream) Name() string { return "jetstream" }

// PID returns this process's id: the server is embedded.
func (j *JetStream) PID() int { return os.Getpid() }

// Dir returns the directory the server stores its data under.
func (j *JetStream) Dir() string { return j.dir }

// Addr returns the host:port the server listens on.
func (j *JetStream) Addr() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", fmt.Sprint(j.port))
}

// Server returns the running embedded server.
func (j *JetStream) Server() *server.Server {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.srv
}

// Options returns a copy of the options the server was last started with.
func (j *JetStream) Options() server.Options {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.opts == nil {
		return server.Options{}
	}
	return *j.opts
}

// Conn returns the client connection; it is closed by Close and replaced by
// Restart.
func (j *JetStream) Conn() *nats.Conn {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.nc
}

// JetStream returns the client's JetStream context; it is replaced by
// Restart.
func (j *JetStream) JetStream() jetstream.JetStream {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.js
}

// SyncAlways reports whether the running server's JetStream fsyncs every
// write, as the server itself reports it (Server.JetStreamConfig).
func (j *JetStream) SyncAlways() bool {
	srv := j.Server()
	if srv == nil {
		return false
	}
	cfg := srv.JetStreamConfig()
	return cfg != nil && cfg.SyncAlways
}

// start starts the server and connects the client. When want is not nil, it
// waits until every stream named in it has that many messages. It returns
// the time from creating the server until then.
func (j *JetStream) start(syncAlways bool, want map[string]uint64) (time.Duration, error) {
	opts := j.options(syncAlways)
	t0 := time.Now()
	srv, err := server.NewServer(opts)
	if err != nil {
		return 0, fmt.Errorf("peers: new nats server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(StartTimeout) {
		srv.Shutdown()
		waitShutdown(srv)
		return 0, fmt.Errorf("peers: nats server on 127.0.0.1:%d not ready after %v", opts.Port, StartTimeout)
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		waitShutdown(srv)
		return 0, errors.New("peers: nats server started without JetStream")
	}
	if tcp, ok := srv.Addr().(*net.TCPAddr); ok {
		j.mu.Lock()
		j.port = tcp.Port
		j.mu.Unlock()
	}
	nc, err := nats.Connect(srv.ClientURL(), nats.Name("holdfast-bench"), nats.NoReconnect(), nats.Timeout(StartTimeout))
	if err != nil {
		srv.Shutdown()
		waitShutdown(srv)
		return 0, fmt.Errorf("peers: connect to nats server: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		srv.Shutdown()
		waitShutdown(srv)
		return 0, fmt.Errorf("peers: jetstream client: %w", err)
	}
	j.mu.Lock()
	j.srv, j.opts, j.nc, j.js = srv, opts, nc, js
	j.mu.Unlock()

	deadline := t0.Add(StartTimeout + LoadTimeout)
	for name, msgs := range want {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			info, err := js.Stream(ctx, name)
			var got uint64
			if err == nil {
				var ierr error
				var si *jetstream.StreamInfo
				si, ierr = info.Info(ctx)
				if ierr == nil {
					got = si.State.Msgs
				}
				err = ierr
			}
			cancel()
			if err == nil && got == msgs {
				break
			}
			if time.Now().After(deadline) {
				_ = j.stop()
				if err == nil {
					err = fmt.Errorf("%d messages, want %d", got, msgs)
				}
				return 0, fmt.Errorf("peers: jetstream stream %s not usable after restart within %v: %w", name, StartTimeout+LoadTimeout, err)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return time.Since(t0), nil
}

// waitShutdown waits for the server to finish shutting down, at most
// StopTimeout.
func waitShutdown(srv *server.Server) bool {
	done := make(chan struct{})
	go func() {
		srv.WaitForShutdown()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(StopTimeout):
		return false
	}
}

// stop closes the client and shuts the server down.
func (j *JetStream) stop() error {
	j.mu.Lock()
	srv, nc := j.srv, j.nc
	j.srv, j.nc, j.js = nil, nil, nil
	j.mu.Unlock()
	if nc != nil {
		nc.Close()
	}
	if srv == nil {
		return nil
	}
	srv.Shutdown()
	if !waitShutdown(srv) {
		return fmt.Errorf("peers: nats server did not shut down within %v", StopTimeout)
	}
	return nil
}

// Close closes the client and shuts the server down, waiting for it.
func (j *JetStream) Close() error {
	return j.stop()
}

// streamCounts returns the message count of every stream.
func (j *JetStream) streamCounts(ctx context.Context) (map[string]uint64, error) {
	js := j.JetStream()
	if js == nil {
		return nil, errors.New("peers: jetstream is not running")
	}
	counts := map[string]uint64{}
	lister := js.ListStreams(ctx)
	for si := range lister.Info() {
		counts[si.Config.Name] = si.State.Msgs
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("peers: list streams: %w", err)
	}
	return counts, nil
}

// Restart shuts the server down and starts it again on the same store
// directory and port. It returns the time from creating the new server until
// every stream answers stream info with as many messages as before.
func (j *JetStream) Restart() (time.Duration, error) {
	return j.restart(true)
}

func (j *JetStream) restart(syncAlways bool) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	counts, err := j.streamCounts(ctx)
	if err != nil {
		return 0, fmt.Errorf("peers: jetstream restart: %w", err)
	}
	if err := j.stop(); err != nil {
		return 0, fmt.Errorf("peers: jetstream restart: %w", err)
	}
	took, err := j.start(syncAlways, counts)
	if err != nil {
		return 0, fmt.Errorf("peers: jetstream restart: %w", err)
	}
	slog.Debug("jetstream restarted", "took", took, "streams", len(counts), "syncAlways", syncAlways)
	return took, nil
}
