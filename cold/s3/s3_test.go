package s3

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cold"
	"github.com/holdfast/holdfast/cold/coldtest"
	"github.com/holdfast/holdfast/internal/s3test"
)

func open(t *testing.T, srv *s3test.Server, bucket, prefix string) *Store {
	t.Helper()
	s, err := Open(context.Background(), Config{
		Endpoint: srv.Endpoint, Bucket: bucket, AccessKey: s3test.AccessKey, SecretKey: s3test.SecretKey,
		Prefix: prefix, Timeout: 3 * time.Second, CreateBucket: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMinIOConformance(t *testing.T) {
	srv := s3test.MinIO(t)
	coldtest.Run(t, open(t, srv, "holdfast", "segments/"), "")
}

// TestVersityGWConformance: versitygw checks conditions the way AWS does.
func TestVersityGWConformance(t *testing.T) {
	srv := s3test.VersityGW(t, "holdfast")
	coldtest.Run(t, open(t, srv, "holdfast", ""), "")
}

// TestMinIO_HungServerFailsWithinTheDeadline: a stopped server makes calls fail
// after the configured timeout, not minio-go's minutes of retries.
func TestMinIO_HungServerFailsWithinTheDeadline(t *testing.T) {
	srv := s3test.MinIO(t)
	s := open(t, srv, "holdfast", "")
	if err := s.Create(context.Background(), "a/1", []byte("x")); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	defer srv.Cont()
	start := time.Now()
	_, err := s.Get(context.Background(), "a/1")
	if err == nil || errors.Is(err, cold.ErrNotFound) {
		t.Fatalf("get from a stopped server: %v", err)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("get from a stopped server took %v; the timeout is 3s", d)
	}
	srv.Cont()
	if got, err := s.Get(context.Background(), "a/1"); err != nil || string(got) != "x" {
		t.Fatalf("after the server resumed: %q %v", got, err)
	}
}

// TestMinIO_KeyPastTheLimitWithThePrefix: a key that fits cold.MaxKeyLen alone
// but not with the store's prefix is refused as ErrInvalidKey, before any
// request (S3 would answer KeyTooLongError); one that fits with it is stored.
func TestMinIO_KeyPastTheLimitWithThePrefix(t *testing.T) {
	srv := s3test.MinIO(t)
	prefix := strings.Repeat(strings.Repeat("p", 99)+"/", 3) // 300 bytes
	s := open(t, srv, "holdfast", prefix)
	ctx := context.Background()
	fits := strings.Repeat("k/", 361) + "k" // 723 bytes: 1023 with the prefix
	if err := s.Create(ctx, fits, []byte("x")); err != nil {
		t.Fatalf("create a key of %d bytes with the prefix: %v", len(prefix)+len(fits), err)
	}
	if got, err := s.Get(ctx, fits); err != nil || string(got) != "x" {
		t.Fatalf("get: %q %v", got, err)
	}
	long := fits + "/k"
	for what, call := range map[string]func() error{
		"create": func() error { return s.Create(ctx, long, []byte("x")) },
		"get":    func() error { _, err := s.Get(ctx, long); return err },
		"stat":   func() error { _, err := s.Stat(ctx, long); return err },
		"delete": func() error { return s.Delete(ctx, long) },
	} {
		if err := call(); !errors.Is(err, cold.ErrInvalidKey) {
			t.Errorf("%s a key of %d bytes with the prefix: %v, want ErrInvalidKey", what, len(prefix)+len(long), err)
		}
	}
}
