package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/bench/peers"
	"github.com/valyala/fasthttp"
)

// The system "holdfast-http": a Holdfast node and its REST gateway in a child
// process (as redis-server is), its clients in the case's process over
// 127.0.0.1, with keep-alive connections (one per caller).

const sysHoldfastHTTP = "holdfast-http"

// httpServer is the child process of a holdfast-http case: a node with the
// benchmark's type options and the gateway, serving until stdin closes.
func httpServer(dir string, leaseParallelism int) int {
	return serveChild(dir, func(typ string) actors.TypeOptions {
		o := defaultTypeOptions()
		if typ == "jobs" {
			o.Log.Leases = &actors.LeaseOptions{MaxParallelism: leaseParallelism, LeaseDuration: 30 * time.Second}
		}
		return o
	}, nil)
}

// serverChild is a case's server child process: this program run with
// -case <mode>, which prints one JSON line once it serves and serves until
// its stdin closes (the holdfast-http and holdfast-client cases).
type serverChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// startServerChild runs this program with args and decodes the line the child
// prints once it serves into info.
func startServerChild(info any, args ...string) (*serverChild, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &serverChild{cmd: cmd, stdin: stdin}
	if err := json.NewDecoder(stdout).Decode(info); err != nil {
		s.close()
		return nil, fmt.Errorf("the server child %v did not start: %w", args, err)
	}
	return s, nil
}

// close closes the child's stdin, and kills it if it has not exited 30 s later.
func (s *serverChild) close() {
	_ = s.stdin.Close()
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

// httpClient is a case's view of its server child.
type httpClient struct {
	*serverChild
	info serverInfo
	c    *http.Client         // net/http's client, or
	fc   *fasthttp.HostClient // fasthttp's (httpClientKind)
}

func startHTTPServer(dir string, callers, leaseParallelism int) (*httpClient, error) {
	h := &httpClient{}
	var err error
	if h.serverChild, err = startServerChild(&h.info, "-case", "http-server", "-dir", dir, fmt.Sprintf("-lease-parallelism=%d", leaseParallelism)); err != nil {
		return nil, err
	}
	h.setClients(callers)
	return h, nil
}

// httpClientKind names the HTTP client of the holdfast-http cases (and of the
// HTTP floor): "" (or "nethttp"), net/http's keep-alive client, what a Go
// program uses by default; or "fasthttp", fasthttp's HostClient, a client
// built for the job whose CPU per request is go-redis's or less (16-20 µs
// against net/http's 47-50 and go-redis's 24, session 29). Both ends of a case
// share this machine's two cores, so the client's CPU bounds the server's
// throughput: with the lean client a ratio to Redis compares the two servers.
// Set by $HOLDFAST_BENCH_HTTP_CLIENT, so that the case's own process sees it.
var httpClientKind = os.Getenv("HOLDFAST_BENCH_HTTP_CLIENT")

// setClients makes h's client for callers callers, a keep-alive connection
// each, of the kind httpClientKind names.
func (h *httpClient) setClients(callers int) {
	if httpClientKind == "fasthttp" {
		h.fc = &fasthttp.HostClient{Addr: strings.TrimPrefix(h.info.URL, "http://"), MaxConns: callers + 8,
			ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, MaxConnWaitTimeout: 30 * time.Second}
		return
	}
	h.c = keepAliveClient(callers)
}

// httpClientNote says which client a holdfast-http case used.
func httpClientNote() string {
	if httpClientKind == "fasthttp" {
		return "clients: fasthttp's HostClient"
	}
	return "clients: net/http's"
}

// keepAliveClient is the HTTP client of callers callers, a keep-alive
// connection each.
func keepAliveClient(callers int) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: callers + 8, MaxConnsPerHost: callers + 8}}
}

// do sends a request and decodes a 2xx reply into out (if not nil).
func (h *httpClient) do(method, path string, body []byte, out any) error {
	if h.fc != nil {
		return h.doFast(method, path, body, out)
	}
	req, err := http.NewRequest(method, h.info.URL+path, bytes.NewReader(body))

	if err != nil {
		return err
	}
	req.Header.Set("X-App-Key", h.info.Key)
	req.Header.Set("X-App-Secret", h.info.Secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if out != nil && len(b) > 0 { // 204: nothing
		return json.Unmarshal(b, out)
	}
	return nil
}

// doFast is do on fasthttp's client.
func (h *httpClient) doFast(method, path string, body []byte, out any) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(h.info.URL + path)
	req.Header.SetMethod(method)
	req.Header.Set("X-App-Key", h.info.Key)
	req.Header.Set("X-App-Secret", h.info.Secret)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	if err := h.fc.Do(req, resp); err != nil {
		return err
	}
	b := resp.Body()
	if resp.StatusCode()/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode(), b)
	}
	if out != nil && len(b) > 0 {
		return json.Unmarshal(b, out)
	}
	return nil
}

// serverLoop runs workers goroutines repeating op (which returns the
// operations it completed) for warmup, then measures d: throughput, and the
// server child's disk bytes and CPU; this process's CPU is the client's.
func serverLoop(srv *serverChild, workers int, warmup, d time.Duration, op func(w int) (int64, error)) (result, error) {
	if iv, err := runWorkers(workers, warmup, op); err != nil {
		return result{}, err
	} else if iv.note != "" {
		return result{}, errors.New("ran out of records during the warm-up")
	}
	pid := srv.cmd.Process.Pid
	disk0, _ := peers.DiskWriteBytes(pid)
	srv0, cpu0 := peers.PIDCPU(pid), peers.ProcessCPU()
	iv, err := runWorkers(workers, d, op)
	if err != nil {
		return result{}, err
	}
	disk1, _ := peers.DiskWriteBytes(pid)
	r := result{OpsPerSec: iv.perSec(), Ops: iv.ops, CPUSeconds: (peers.ProcessCPU() - cpu0).Seconds(), ServerCPU: (peers.PIDCPU(pid) - srv0).Seconds(),
		PayloadBytes: float64(iv.ops) * peers.PayloadSize, Note: iv.note}
	if disk1 >= disk0 {
		r.DiskBytes = disk1 - disk0
	}
	return r, nil
}

// httpCase runs workload w over HTTP.
func httpCase(w workload, dir string, d, warmup time.Duration) (result, error) {
	if w.http == nil {
		return result{}, fmt.Errorf("%s has no HTTP form", w.name)
	}
	spec := w.http
	h, err := startHTTPServer(filepath.Join(dir, "data"), spec.workers, spec.workers)
	if err != nil {
		return result{}, err
	}
	defer h.close()
	op, err := spec.setup(h)
	if err != nil {
		return result{}, err
	}
	r, err := serverLoop(h.serverChild, spec.workers, warmup, d, op)
	if err != nil {
		return result{}, err
	}
	if !w.payload {
		r.PayloadBytes = 0
	}
	r.Note = strings.TrimPrefix(r.Note+"; Holdfast's REST API: the server in a child process, its clients in the case's process over 127.0.0.1 (keep-alive, one connection per caller); "+httpClientNote(), "; ")
	return r, nil
}

// httpSpec is a workload's HTTP form.
type httpSpec struct {
	workers int
	// setup prepares the server (objects activated, a log filled) and returns
	// the operation of worker w.
	setup func(h *httpClient) (func(w int) (int64, error), error)
}

var setBody = func() []byte {
	b, _ := json.Marshal(map[string]string{"value": string(peers.Payload())})
	return b
}()

// httpWrites: worker w sets slot v of object w mod objects.
func httpWrites(objects, callers int) *httpSpec {
	return &httpSpec{workers: callers, setup: func(h *httpClient) (func(int) (int64, error), error) {
		paths := make([]string, objects)
		for i := range paths {
			paths[i] = fmt.Sprintf("/api/v1/objects/%s/bench/obj-%d/v", h.info.AppID, i)
		}
		if err := httpActivate(h, "PUT", paths, []byte(`{"value":0}`)); err != nil { // every object active before measuring
			return nil, err
		}
		return func(w int) (int64, error) { return 1, h.do("PUT", paths[w%objects], setBody, nil) }, nil
	}}
}

// httpBatches: one producer appending batches of batch records to one log.
func httpBatches(batch int) *httpSpec {
	return &httpSpec{workers: 1, setup: func(h *httpClient) (func(int) (int64, error), error) {
		recs := make([]map[string]json.RawMessage, batch)
		for i := range recs {
			recs[i] = map[string]json.RawMessage{"body": recordBody}
		}
		body, _ := json.Marshal(map[string]any{"records": recs})
		path := fmt.Sprintf("/api/v1/logs/%s/stream/log-0/append", h.info.AppID)
		return func(int) (int64, error) { return int64(batch), h.do("POST", path, body, nil) }, nil
	}}
}

// httpLeases: consumers leasing up to 10 records and acking them, on one
// consumer of a log filled first (appends of 100).
func httpLeases(consumers int) *httpSpec {
	return &httpSpec{workers: consumers, setup: func(h *httpClient) (func(int) (int64, error), error) {
		base := fmt.Sprintf("/api/v1/logs/%s/jobs/q", h.info.AppID)
		recs := make([]map[string]json.RawMessage, 100)
		for i := range recs {
			recs[i] = map[string]json.RawMessage{"body": recordBody}
		}
		body, _ := json.Marshal(map[string]any{"records": recs})
		for n := 0; n < peers.LeaseRecords; n += len(recs) {
			if err := h.do("POST", base+"/append", body, nil); err != nil {
				return nil, err
			}
		}
		return func(int) (int64, error) {
			var lease struct {
				BatchID string `json:"batchId"`
			}
			if err := h.do("POST", base+"/consumers/workers/lease", []byte(`{"limit":10}`), &lease); err != nil {
				return 0, err
			}
			if lease.BatchID == "" {
				return 0, errDry // as in the embedded case: nothing left to lease
			}
			ack, _ := json.Marshal(map[string]string{"batchId": lease.BatchID})
			return 1, h.do("POST", base+"/consumers/workers/ack", ack, nil)
		}, nil
	}}
}

// httpIncrements: worker w increments slot n of object w mod objects, one
// request at a time (POST .../n/increment, no body).
func httpIncrements(objects, callers int) *httpSpec {
	return &httpSpec{workers: callers, setup: func(h *httpClient) (func(int) (int64, error), error) {
		paths := make([]string, objects)
		for i := range paths {
			paths[i] = fmt.Sprintf("/api/v1/objects/%s/bench/obj-%d/n/increment", h.info.AppID, i)
		}
		if err := httpActivate(h, "POST", paths, nil); err != nil {
			return nil, err
		}
		return func(w int) (int64, error) { return 1, h.do("POST", paths[w%objects], nil, nil) }, nil
	}}
}

// httpBatchIncrements: clients workers each sending batches of batch
// increments (POST /api/v1/batch) on consecutive objects, moving on by
// clients×batch objects each round, as peers.Redis.Increments pipelines. Every
// result must be a 200.
func httpBatchIncrements(objects, clients, batch int) *httpSpec {
	return &httpSpec{workers: clients, setup: func(h *httpClient) (func(int) (int64, error), error) {
		paths := make([]string, objects)
		for i := range paths {
			paths[i] = fmt.Sprintf("/api/v1/objects/%s/bench/obj-%d/n/increment", h.info.AppID, i)
		}
		if err := httpActivate(h, "POST", paths, nil); err != nil {
			return nil, err
		}
		// Every batch a client can send, built once: the objects repeat with
		// a period of objects / gcd.
		bodies := make([][][]byte, clients)
		next := make([]int, clients)
		for w := range bodies {
			first := w * batch % objects
			seen := map[int]bool{}
			for !seen[first] {
				seen[first] = true
				ops := make([]string, batch)
				for i := range ops {
					ops[i] = fmt.Sprintf(`{"object":"bench/obj-%d","op":"increment","slot":"n"}`, (first+i)%objects)
				}
				bodies[w] = append(bodies[w], []byte(`{"ops":[`+strings.Join(ops, ",")+`]}`))
				first = (first + clients*batch) % objects
			}
		}
		path := "/api/v1/batch/" + h.info.AppID
		return func(w int) (int64, error) {
			body := bodies[w][next[w]]
			next[w] = (next[w] + 1) % len(bodies[w])
			var reply struct {
				Results []struct {
					Status int `json:"status"`
				} `json:"results"`
			}
			if err := h.do("POST", path, body, &reply); err != nil {
				return 0, err
			}
			if len(reply.Results) != batch {
				return 0, fmt.Errorf("batch: %d results for %d operations", len(reply.Results), batch)
			}
			for _, r := range reply.Results {
				if r.Status != http.StatusOK {
					return 0, fmt.Errorf("batch: an increment got %d", r.Status)
				}
			}
			return int64(batch), nil
		}, nil
	}}
}

// httpActivate sends method with body to every path once, 64 at a time.
func httpActivate(h *httpClient, method string, paths []string, body []byte) error {
	return inParallel(len(paths), func(i int) error { return h.do(method, paths[i], body, nil) })
}
