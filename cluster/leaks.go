package cluster

import (
	"context"
	"reflect"
	"sync"
	"unsafe"

	etcdprovider "github.com/asynkron/protoactor-go/cluster/clusterproviders/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// closeProviderClient closes the etcd client that protoactor-go's etcd provider
// made for itself (etcdprovider.NewWithConfig) and never closes, not even in
// Shutdown: its connection and its goroutines (gRPC's, and a lease keep-alive
// stream's) would outlive the member, one set per member start (TRAPS.md). The
// provider keeps it in an unexported field, read here once the provider shut
// down; if a version of the provider names or types it otherwise, nothing is
// closed (and the package's leak check says so).
func closeProviderClient(p *etcdprovider.Provider) {
	if p == nil {
		return
	}
	f := reflect.ValueOf(p).Elem().FieldByName("client")
	if !f.IsValid() || f.Type() != reflect.TypeFor[*clientv3.Client]() || f.IsNil() {
		return
	}
	if cli := (*clientv3.Client)(unsafe.Pointer(f.Pointer())); cli != nil {
		_ = cli.Close()
	}
}

// grpcConns records the gRPC connections protoactor-go's remote dials for a
// transport (through interceptors: the library offers no other hook), so that
// the transport's stop closes every one of them. The library closes a
// connection only when its endpoint writer stops: a writer whose connect
// failed (a peer that crashed) leaves its connection redialing for ever.
type grpcConns struct {
	mu     sync.Mutex
	m      map[*grpc.ClientConn]struct{}
	closed bool
}

func newGRPCConns() *grpcConns { return &grpcConns{m: map[*grpc.ClientConn]struct{}{}} }

// add records cc; connections already shut down are forgotten. After close, cc
// is closed at once.
func (s *grpcConns) add(cc *grpc.ClientConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = cc.Close()
		return
	}
	if _, ok := s.m[cc]; ok {
		return
	}
	for c := range s.m {
		if c.GetState() == connectivity.Shutdown {
			delete(s.m, c)
		}
	}
	s.m[cc] = struct{}{}
}

// close closes every connection recorded, and any recorded later.
func (s *grpcConns) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c := range s.m {
		_ = c.Close()
	}
	clear(s.m)
}

func (s *grpcConns) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			s.add(cc)
			return streamer(ctx, desc, cc, method, opts...)
		}),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			s.add(cc)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
	}
}
