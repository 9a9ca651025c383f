package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// The HTTP floor (-http-floor): what an HTTP server costs on this machine
// before it does any work, measured beside Holdfast's REST increment and
// Redis's INCR in the same run. Issue 28 asks for at most 30 µs of server
// CPU per REST increment (1,000 objects, 256 keep-alive callers); the floor
// says how much of that an HTTP/1.1 server spends on reading a request and
// writing a reply alone. Two floor servers, each a child process answering
// every request with a fixed increment reply and nothing else:
//
//   - nethttp: net/http, as the gateway serves (a goroutine per connection,
//     its own request parsing, one read and one write per request);
//   - fasthttp: valyala/fasthttp (a worker pool, reused request and reply
//     objects, no per-request allocation), for how much less a server
//     built for the job spends.
//
// The clients are holdfast-http's: 256 goroutines, net/http keep-alive
// connections, one request in flight each (httpIncrements).

const (
	floorNetHTTP  = "floor-nethttp"
	floorFastHTTP = "floor-fasthttp"
)

// floorServer is the child process of a floor case: kind's server on
// 127.0.0.1 until stdin closes.
func floorServer(kind string) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	var n atomic.Int64
	var stop func()
	switch kind {
	case floorNetHTTP:
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = r.Body.Read(make([]byte, 0)) // as the gateway does, look at the (empty) body
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Request-Id", "0123456789abcdef")
			_, _ = w.Write(strconv.AppendInt([]byte(`{"value":`), n.Add(1), 10))
			_, _ = w.Write([]byte("}\n"))
		})}
		go func() { _ = srv.Serve(ln) }()
		stop = func() { _ = srv.Close() }
	case floorFastHTTP:
		srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
			_ = ctx.PostBody()
			ctx.SetContentType("application/json")
			ctx.Response.Header.Set("X-Request-Id", "0123456789abcdef")
			b := strconv.AppendInt(append(ctx.Response.Body()[:0], `{"value":`...), n.Add(1), 10)
			ctx.SetBody(append(b, "}\n"...))
		}}
		go func() { _ = srv.Serve(ln) }()
		stop = func() { _ = srv.Shutdown() }
	default:
		fmt.Fprintln(os.Stderr, "bench: no floor server", kind)
		return 1
	}
	stopProfile := profileCPU()
	_ = json.NewEncoder(os.Stdout).Encode(serverInfo{URL: "http://" + ln.Addr().String(), AppID: "app_bench", Key: "pk_bench", Secret: "sk_bench"})
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	stopProfile()
	stop()
	return 0
}

// floorCase runs increments-256's HTTP clients against a floor server.
func floorCase(kind string, d, warmup time.Duration) (result, error) {
	h := &httpClient{}
	var err error
	if h.serverChild, err = startServerChild(&h.info, "-case", "server-"+kind); err != nil {
		return result{}, err
	}
	defer h.close()
	const objects, callers = 1000, 256
	h.setClients(callers)
	op, err := httpIncrements(objects, callers).setup(h)
	if err != nil {
		return result{}, err
	}
	r, err := serverLoop(h.serverChild, callers, warmup, d, op)
	r.PayloadBytes = 0
	return r, err
}

// runHTTPFloor runs the floor servers, Holdfast's REST increments and Redis's
// INCR, rounds times in shuffled order, each case in its own process, and
// prints a table of medians.
func runHTTPFloor(base string, rounds int, d, warmup time.Duration, mdOut string) int {
	self, err := os.Executable()
	if err != nil {
		fatal(err)
	}
	if err := ensureRedis(); err != nil {
		fatal(err)
	}
	cases := []string{floorNetHTTP, floorFastHTTP, caseName(sysHoldfastHTTP, "increments-256"), caseName(sysRedis, "increments-256")}
	got := map[string][]result{}
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	for round := range rounds {
		for _, i := range rng.Perm(len(cases)) {
			name := cases[i]
			dir := childDir(base, round, name)
			out, err := exec.Command(self, "-case", name, "-dir", dir, "-duration", d.String(), "-warmup", warmup.String(), "-log-records=0", "-memory-objects=0").Output()
			_ = os.RemoveAll(dir)
			var r result
			if err == nil {
				err = json.Unmarshal(out, &r)
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench: %s: %v\n", name, err)
				return 1
			}
			got[name] = append(got[name], r)
		}
		fmt.Fprintf(os.Stderr, "round %d of %d\n", round+1, rounds)
	}
	med := func(name string, f func(result) float64) string {
		var xs []float64
		for _, r := range got[name] {
			xs = append(xs, f(r))
		}
		sort.Float64s(xs)
		return fmt.Sprintf("%.1f (%.1f-%.1f)", xs[len(xs)/2], xs[0], xs[len(xs)-1])
	}
	var md strings.Builder
	fmt.Fprintf(&md, "Machine: %s\n\n%d rounds, %v measured per case after %v, medians (min-max). 1,000 objects, 256 callers with one request in flight each, keep-alive.\n\n",
		machine(base), rounds, d, warmup)
	md.WriteString("| server | requests/s | server CPU µs per request | client CPU µs per request |\n|---|---|---|---|\n")
	title := map[string]string{floorNetHTTP: "net/http, a fixed reply (floor)", floorFastHTTP: "fasthttp, a fixed reply (floor)",
		cases[2]: "Holdfast REST increment", cases[3]: "Redis INCR (RESP, go-redis)"}
	for _, name := range cases {
		fmt.Fprintf(&md, "| %s | %s | %s | %s |\n", title[name],
			med(name, func(r result) float64 { return r.OpsPerSec }),
			med(name, func(r result) float64 { return r.ServerCPU * 1e6 / float64(max(r.Ops, 1)) }),
			med(name, func(r result) float64 { return r.CPUSeconds * 1e6 / float64(max(r.Ops, 1)) }))
	}
	fmt.Print(md.String())
	if mdOut != "" {
		writeFile(mdOut, []byte(md.String()))
	}
	return 0
}
