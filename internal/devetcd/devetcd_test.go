package devetcd

import (
	"context"
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestStartPutGet(t *testing.T) {
	s, err := Start(Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	r, err := c.Get(ctx, "k")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
		t.Fatalf("get = %v, %v", r, err)
	}
}

// TestStart_PortTakenBeforeItListens: another process took the client port
// between the pick and etcd's listen; Start picks fresh ports and serves.
func TestStart_PortTakenBeforeItListens(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	pick := freeAddr
	picks := 0
	freeAddr = func() (string, error) {
		picks++
		if picks == 1 {
			return taken.Addr().String(), nil
		}
		return pick()
	}
	defer func() { freeAddr = pick }()
	s, err := Start(Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Endpoint() == taken.Addr().String() || picks < 3 {
		t.Fatalf("endpoint %s after %d picks, want fresh ports after the taken %s", s.Endpoint(), picks, taken.Addr())
	}
}
