package s3test

import (
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
)

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
