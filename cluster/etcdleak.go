package cluster

import (
	"reflect"
	"unsafe"

	etcdprovider "github.com/asynkron/protoactor-go/cluster/clusterproviders/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
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
