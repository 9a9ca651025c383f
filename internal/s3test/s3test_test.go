package s3test

import (
	"context"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// TestMain lets the test binary play an S3 server that is still starting up
// (see TestStart_WaitsUntilS3RequestsAreServed).
func TestMain(m *testing.M) {
	if addr := os.Getenv("S3TEST_FAKE_STARTING_SERVER"); addr != "" {
		fakeStartingServer(addr)
		return
	}
	os.Exit(m.Run())
}

// fakeStartingServer behaves as MinIO does while it starts: its health probe
// answers 200 at once, but for its first second every S3 request gets 503
// XMinioServerNotInitialized. After that it lists no buckets.
func fakeStartingServer(addr string) {
	up := time.Now().Add(time.Second)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/minio/health/live" {
			return
		}
		if time.Now().Before(up) {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`<Error><Code>XMinioServerNotInitialized</Code><Message>Server not initialized yet, please try again.</Message></Error>`))
			return
		}
		w.Header().Set("Content-Type", "application/xml")
		_, _ = w.Write([]byte(`<ListAllMyBucketsResult><Owner><ID>x</ID></Owner><Buckets></Buckets></ListAllMyBucketsResult>`))
	})
	_ = http.ListenAndServe(addr, h)
}

// TestStart_WaitsUntilS3RequestsAreServed: a server counts as started only
// when it serves a signed S3 request, not when its health probe first answers
// (MinIO's does before its object layer is up; CI once failed on that).
func TestStart_WaitsUntilS3RequestsAreServed(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, kind: "fake", bin: self, health: "/minio/health/live"}
	s.listen = func() {
		s.Endpoint = "127.0.0.1:" + strconv.Itoa(freePort(t))
		s.env = []string{"S3TEST_FAKE_STARTING_SERVER=" + s.Endpoint}
	}
	s.first()
	c, err := minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(AccessKey, SecretKey, ""), MaxRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.ListBuckets(ctx); err != nil {
		t.Fatalf("the first S3 request after start: %v", err)
	}
}

// TestListensOn: the check that tells a server's own port from one another
// process answers on.
func TestListensOn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if !listensOn(os.Getpid(), ln.Addr().String()) {
		t.Fatalf("this process listens on %s but listensOn says no", ln.Addr())
	}
	if listensOn(os.Getpid(), "127.0.0.1:"+strconv.Itoa(freePort(t))) {
		t.Fatal("listensOn says yes for a port nobody listens on")
	}
}

// TestMinIO_AnotherProcessOnItsPort: when another process answers the health
// check on the port a MinIO was given, the MinIO (which exits: the port is in
// use) is not taken for started; it starts again on a fresh port and is the
// one that answers there.
func TestMinIO_AnotherProcessOnItsPort(t *testing.T) {
	squatter, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer squatter.Close()
	go http.Serve(squatter, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {})) // 200 to everything
	taken := squatter.Addr().String()
	s := &Server{t: t, kind: "minio", bin: binary(t, "HOLDFAST_MINIO_BIN", "minio"),
		env:    []string{"MINIO_ROOT_USER=" + AccessKey, "MINIO_ROOT_PASSWORD=" + SecretKey, "MINIO_BROWSER=off", "MINIO_UPDATE=off"},
		health: "/minio/health/live"}
	dir, calls := t.TempDir(), 0
	s.listen = func() {
		calls++
		s.Endpoint = taken
		if calls > 1 {
			s.Endpoint = "127.0.0.1:" + strconv.Itoa(freePort(t))
		}
		s.args = []string{"server", "--quiet", "--address", s.Endpoint, "--console-address", "127.0.0.1:" + strconv.Itoa(freePort(t)), dir}
	}
	s.first()
	if calls != 2 || s.Endpoint == taken {
		t.Fatalf("started after %d tries on %s (the taken port is %s)", calls, s.Endpoint, taken)
	}
	if !listensOn(s.cmd.Process.Pid, s.Endpoint) {
		t.Fatalf("the MinIO process does not listen on %s", s.Endpoint)
	}
}
