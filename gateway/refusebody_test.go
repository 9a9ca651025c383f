package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/holdfast/holdfast/actors"
)

// putSlot sends body as a PUT of a slot through h, counting into read the
// body bytes the server reads.
func putSlot(h http.Handler, body string, read *atomic.Int64) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPut, "/api/v1/objects/"+testApp.ID+"/t/k/slot", countingBody{strings.NewReader(body), read})
	req.ContentLength = int64(len(body))
	req.Header.Set("X-App-Key", testApp.Key)
	req.Header.Set("X-App-Secret", testApp.Secret)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// refusingNode is a fakeNode that refuses writes while refusing is set, and
// counts the requests that reached it.
type refusingNode struct {
	fakeNode
	refusing atomic.Bool
	requests atomic.Int64
}

func (n *refusingNode) RefusesWrites() bool { return n.refusing.Load() }

func (n *refusingNode) Request(context.Context, actors.ObjectID, any) (any, error) {
	n.requests.Add(1)
	return nil, &actors.Error{Kind: actors.KindUnavailable, Msg: "refused by the object"}
}

// countingBody counts the bytes read from a request body.
type countingBody struct {
	r    io.Reader
	read *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.read.Add(int64(n))
	return n, err
}

// TestServer_ALargeWriteIsRefusedBeforeItsBodyIsRead: while the node refuses
// writes (over its memory budget), a write with a large body gets 503 with
// retryAfterMs before the gateway reads the body; a small write still goes to
// the node (whose own answer says more), and so does every write once the node
// takes writes again.
func TestServer_ALargeWriteIsRefusedBeforeItsBodyIsRead(t *testing.T) {
	node := &refusingNode{}
	node.ready.Store(true)
	h := New(Config{Node: node, Apps: NewApps([]App{testApp})}).Handler()
	big := `{"value":"` + strings.Repeat("x", 1<<20) + `"}`
	put := func(body string) (*httptest.ResponseRecorder, int64) {
		var read atomic.Int64
		return putSlot(h, body, &read), read.Load()
	}
	node.refusing.Store(true)
	rec, read := put(big)
	var body map[string]any
	_ = json.NewDecoder(bytes.NewReader(rec.Body.Bytes())).Decode(&body)
	if rec.Code != http.StatusServiceUnavailable || body["retryAfterMs"] == nil || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("a large write while refusing: %d %s", rec.Code, rec.Body)
	}
	if read != 0 || node.requests.Load() != 0 {
		t.Fatalf("%d body bytes read and %d requests sent to the node for a refused write", read, node.requests.Load())
	}
	if _, read := put(`{"value":1}`); read == 0 || node.requests.Load() != 1 {
		t.Fatalf("a small write while refusing: %d bytes read, %d requests", read, node.requests.Load())
	}
	node.refusing.Store(false)
	if _, read := put(big); read != int64(len(big)) || node.requests.Load() != 2 {
		t.Fatalf("a large write once writes are taken: %d bytes read, %d requests", read, node.requests.Load())
	}
}

// blockingNode holds every request until release is closed.
type blockingNode struct {
	fakeNode
	entered chan struct{}
	release chan struct{}
}

func (n *blockingNode) Request(context.Context, actors.ObjectID, any) (any, error) {
	n.entered <- struct{}{}
	<-n.release
	return &actors.WriteResult{LogID: 1}, nil
}

// TestServer_WriteBodiesInFlightAreBounded: while writes whose bodies add up
// to MaxBodyBytesInFlight are being served, the next write with a body gets
// 503 with retryAfterMs before its body is read; a request without a body
// still goes through, and writes are taken again once the others finished.
func TestServer_WriteBodiesInFlightAreBounded(t *testing.T) {
	node := &blockingNode{entered: make(chan struct{}, 4), release: make(chan struct{})}
	node.ready.Store(true)
	h := New(Config{Node: node, Apps: NewApps([]App{testApp}), MaxBodyBytesInFlight: 1 << 20}).Handler()
	body := `{"value":"` + strings.Repeat("x", 600<<10) + `"}` // two pass 1 MiB
	put := func() (*httptest.ResponseRecorder, *atomic.Int64) {
		var read atomic.Int64
		return putSlot(h, body, &read), &read
	}
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { rec, _ := put(); done <- rec }()
	<-node.entered // the first write holds its body
	rec, read := put()
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "retryAfterMs") || read.Load() != 0 {
		t.Fatalf("a second write past the bound: %d %s (%d body bytes read)", rec.Code, rec.Body, read.Load())
	}
	close(node.release)
	if first := <-done; first.Code != http.StatusOK {
		t.Fatalf("the first write: %d %s", first.Code, first.Body)
	}
	if rec, _ := put(); rec.Code != http.StatusOK {
		t.Fatalf("a write once the first finished: %d %s", rec.Code, rec.Body)
	}
}
