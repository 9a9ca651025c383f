package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
	"github.com/holdfast/holdfast/gateway"
)

// The fan-out benchmark: S websockets subscribed across O objects of a server in
// a child process, while writers make W writes per second over HTTP. Each write's
// value is its send time; every client notes when the change reaches it.
// Reported: events delivered per second, latency from the write's request to the
// client (it includes the write's commit and fsync) at p50 and p99, latency from
// the write's acknowledgement (the moment its writer got the durable reply) to
// the client at p50 and p99, the writes' own round trip, and the server's memory
// per idle socket (Go heap and stacks, after a GC, before and after the sockets
// join). The latency from the acknowledgement is signed, not clamped: the event
// and the reply leave the server once the same commit is durable, so an event
// often reaches its client before the writer has its reply, and that event's
// latency is negative; the share of such events is reported too.

type fanoutConfig struct {
	sockets, objects int
	rate             int // writes per second, all objects together
	duration         time.Duration
	rounds           int
}

// serverInfo is what the child server prints once it listens.
type serverInfo struct {
	URL                string `json:"url"`
	AppID, Key, Secret string
}

// fanoutServer is the child: a node and its gateway on 127.0.0.1, serving until
// stdin closes. GET /debug/mem answers the Go heap and stack bytes after a GC.
func fanoutServer(dir string) int {
	return serveChild(dir, nil, func(mux *http.ServeMux) {
		mux.HandleFunc("GET /debug/mem", func(w http.ResponseWriter, r *http.Request) {
			runtime.GC()
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			_ = json.NewEncoder(w).Encode(map[string]uint64{"heap": ms.HeapAlloc, "stack": ms.StackInuse, "goroutines": uint64(runtime.NumGoroutine())})
		})
	})
}

// serveChild is a child process's server: a node with typeOptions (nil: the
// defaults) and its gateway for the app app_bench, plus what extra adds, on
// 127.0.0.1. It prints a serverInfo line and serves until stdin closes.
//
// With HOLDFAST_BENCH_HTTP_CLUSTER set, the node is a cluster's one member
// (replicationFactor 1, an embedded etcd in the child), as clientServer's:
// the gateway then serves through a cluster member's request path.
func serveChild(dir string, typeOptions func(string) actors.TypeOptions, extra func(*http.ServeMux)) int {
	var node *cluster.Node
	var err error
	if os.Getenv("HOLDFAST_BENCH_HTTP_CLUSTER") != "" {
		var stop func()
		if node, _, stop, err = startClusterMember(dir, typeOptions); err == nil {
			defer stop()
		}
	} else if node, err = cluster.Start(cluster.Config{DataDir: dir, Logger: quietLogger(), TypeOptions: typeOptions}); err == nil {
		defer func() { _ = node.Close(context.Background()) }()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	app := gateway.App{ID: "app_bench", Key: "pk_bench", Secret: "sk_bench"}
	gw := gateway.New(gateway.Config{Node: node, Apps: gateway.NewApps([]gateway.App{app}), Logger: quietLogger()})
	mux := http.NewServeMux()
	mux.Handle("/", gw.Handler())
	if extra != nil {
		extra(mux)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	// Served as holdfast serve does: the gateway's Front (fasthttp, and
	// net/http for the routes it hands off). HOLDFAST_BENCH_NETHTTP=1 serves
	// everything on net/http, as before the Front, for a comparison.
	var srv interface{ Close() error }
	if os.Getenv("HOLDFAST_BENCH_NETHTTP") == "1" {
		hs := &http.Server{Handler: mux}
		go hs.Serve(ln)
		srv = hs
	} else {
		f := gateway.NewFront(gw, &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second})
		go f.Serve(ln)
		srv = f
	}
	// HOLDFAST_BENCH_CPUPROFILE and HOLDFAST_BENCH_ALLOCPROFILE profile this
	// server child (its warm-up and set-up included): in an HTTP case the
	// case's process is the client.
	stopProfile, stopAllocs := profileCPU(), profileAllocs()
	_ = json.NewEncoder(os.Stdout).Encode(serverInfo{URL: "http://" + ln.Addr().String(), AppID: app.ID, Key: app.Key, Secret: app.Secret})
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the driver closes stdin
	stopProfile()
	stopAllocs()
	_ = srv.Close()
	gw.Close()
	return 0 // the node (and its etcd) close in the defers above
}

type fanoutRound struct {
	EventsPerSec    float64 `json:"eventsPerSec"`
	ExpectedPerSec  float64 `json:"expectedPerSec"`
	LatencyP50Ms    float64 `json:"latencyP50Ms"`
	LatencyP99Ms    float64 `json:"latencyP99Ms"`
	AckLatencyP50Ms float64 `json:"ackLatencyP50Ms"` // signed: negative when the event arrived before the writer's reply
	AckLatencyP99Ms float64 `json:"ackLatencyP99Ms"`
	BeforeAckShare  float64 `json:"beforeAckShare"` // events that arrived before their write's reply
	WriteP50Ms      float64 `json:"writeP50Ms"`
	BytesPerSocket  float64 `json:"bytesPerIdleSocket"`
	ClosedSlow      int     `json:"socketsClosed"`
	MissingOrDouble int     `json:"missingOrDoubleEvents"`
}

func runFanout(base string, cfg fanoutConfig, jsonOut string) int {
	var rounds []fanoutRound
	for r := 0; r < cfg.rounds; r++ {
		dir, err := os.MkdirTemp(base, "fanout-")
		if err != nil {
			fatal(err)
		}
		res, err := fanoutOnce(dir, cfg)
		if err != nil {
			fatal(err)
		}
		fmt.Fprintf(os.Stderr, "round %d: %.0f events/s (expected %.0f), from request p50 %.2f ms, p99 %.2f ms, from ack p50 %+.2f ms, p99 %+.2f ms (%.0f%% before the ack), write p50 %.2f ms, %.0f B per idle socket\n",
			r+1, res.EventsPerSec, res.ExpectedPerSec, res.LatencyP50Ms, res.LatencyP99Ms, res.AckLatencyP50Ms, res.AckLatencyP99Ms, 100*res.BeforeAckShare, res.WriteP50Ms, res.BytesPerSocket)
		rounds = append(rounds, res)
		os.RemoveAll(dir)
	}
	med := func(f func(fanoutRound) float64) float64 {
		v := make([]float64, len(rounds))
		for i, r := range rounds {
			v[i] = f(r)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	fmt.Printf("| fan-out: %d sockets over %d objects, %d writes/s, %v per round, median of %d | value |\n|---|---|\n",
		cfg.sockets, cfg.objects, cfg.rate, cfg.duration, len(rounds))
	fmt.Printf("| events delivered per second (expected) | %.0f (%.0f) |\n", med(func(r fanoutRound) float64 { return r.EventsPerSec }), med(func(r fanoutRound) float64 { return r.ExpectedPerSec }))
	fmt.Printf("| latency, write request to client, p50 | %.2f ms |\n", med(func(r fanoutRound) float64 { return r.LatencyP50Ms }))
	fmt.Printf("| latency, write request to client, p99 | %.2f ms |\n", med(func(r fanoutRound) float64 { return r.LatencyP99Ms }))
	fmt.Printf("| latency, write's acknowledgement to client, p50 (signed: below 0, the event arrived before the writer's reply) | %+.2f ms |\n", med(func(r fanoutRound) float64 { return r.AckLatencyP50Ms }))
	fmt.Printf("| latency, write's acknowledgement to client, p99 (signed) | %+.2f ms |\n", med(func(r fanoutRound) float64 { return r.AckLatencyP99Ms }))
	fmt.Printf("| events that arrived before their write's reply | %.0f%% |\n", 100*med(func(r fanoutRound) float64 { return r.BeforeAckShare }))
	fmt.Printf("| the write's own round trip (fsync included), p50 | %.2f ms |\n", med(func(r fanoutRound) float64 { return r.WriteP50Ms }))
	fmt.Printf("| server memory per idle socket (heap + stacks) | %.0f B |\n", med(func(r fanoutRound) float64 { return r.BytesPerSocket }))
	bad := 0
	for _, r := range rounds {
		bad += r.MissingOrDouble + r.ClosedSlow
	}
	fmt.Printf("| events missing or repeated, sockets closed (all rounds) | %d |\n", bad)
	if jsonOut != "" {
		b, _ := json.MarshalIndent(map[string]any{"config": map[string]any{"sockets": cfg.sockets, "objects": cfg.objects, "rate": cfg.rate, "duration": cfg.duration.String()}, "rounds": rounds}, "", "  ")
		if err := os.WriteFile(jsonOut, b, 0o644); err != nil {
			fatal(err)
		}
	}
	if bad > 0 {
		return 1
	}
	return 0
}

func fanoutOnce(dir string, cfg fanoutConfig) (fanoutRound, error) {
	self, err := os.Executable()
	if err != nil {
		return fanoutRound{}, err
	}
	cmd := exec.Command(self, "-case", "fanout-server", "-dir", dir)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return fanoutRound{}, err
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	var info serverInfo
	if err := json.NewDecoder(stdout).Decode(&info); err != nil {
		return fanoutRound{}, fmt.Errorf("fan-out server: %w", err)
	}
	ctx := context.Background()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	put := func(obj int, v int64) error {
		body := []byte(`{"value":` + strconv.FormatInt(v, 10) + `}`)
		req, _ := http.NewRequest("PUT", fmt.Sprintf("%s/api/v1/objects/%s/feed/o%d/t", info.URL, info.AppID, obj), bytes.NewReader(body))
		req.Header.Set("X-App-Key", info.Key)
		req.Header.Set("X-App-Secret", info.Secret)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("PUT: HTTP %d", resp.StatusCode)
		}
		return nil
	}
	mem := func() (float64, error) {
		resp, err := hc.Get(info.URL + "/debug/mem")
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var m map[string]uint64
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			return 0, err
		}
		if os.Getenv("FANOUT_MEM_DEBUG") != "" {
			fmt.Fprintf(os.Stderr, "server heap %d stack %d goroutines %d\n", m["heap"], m["stack"], m["goroutines"])
		}
		return float64(m["heap"] + m["stack"]), nil
	}
	for o := 0; o < cfg.objects; o++ { // activate every object
		if err := put(o, 0); err != nil {
			return fanoutRound{}, err
		}
	}
	time.Sleep(200 * time.Millisecond)
	before, err := mem()
	if err != nil {
		return fanoutRound{}, err
	}

	// Sockets: one client goroutine each, counting events and their latency.
	type sub struct {
		conn   *websocket.Conn
		obj    int
		lastID int64
		bad    int
	}
	// A write is known by its object and value (its send time); an arrival is
	// matched with its write's acknowledgement after the run.
	type writeKey struct {
		obj int
		at  int64
	}
	type arrival struct {
		w  writeKey
		at int64
	}
	var (
		mu        sync.Mutex
		latencies []float64
		arrivals  []arrival
		events    atomic.Int64
		measuring atomic.Bool
		closed    atomic.Int64
		joined    sync.WaitGroup
	)
	wsURL := "ws" + strings.TrimPrefix(info.URL, "http") + "/socket/websocket?vsn=2.0.0&app_key=" + info.Key
	subs := make([]*sub, cfg.sockets)
	var readers sync.WaitGroup
	for i := range subs {
		conn, _, err := websocket.Dial(ctx, wsURL, nil)
		if err != nil {
			return fanoutRound{}, fmt.Errorf("dial socket %d: %w", i, err)
		}
		conn.SetReadLimit(1 << 20)
		s := &sub{conn: conn, obj: i % cfg.objects}
		subs[i] = s
		topic := fmt.Sprintf("durable:%s:feed:o%d", info.Key, s.obj)
		join, _ := json.Marshal([]any{"1", "1", topic, "phx_join", map[string]any{"app_secret": info.Secret}})
		if err := conn.Write(ctx, websocket.MessageText, join); err != nil {
			return fanoutRound{}, err
		}
		joined.Add(1)
		readers.Add(1)
		go func() {
			defer readers.Done()
			var local []float64
			var localArr []arrival
			defer func() {
				mu.Lock()
				latencies = append(latencies, local...)
				arrivals = append(arrivals, localArr...)
				mu.Unlock()
			}()
			snapshot := false
			for {
				_, b, err := conn.Read(context.Background())
				if err != nil {
					if websocket.CloseStatus(err) != websocket.StatusNormalClosure && websocket.CloseStatus(err) != websocket.StatusGoingAway {
						closed.Add(1)
					}
					if !snapshot {
						joined.Done()
					}
					return
				}
				now := time.Now().UnixNano()
				var f [5]json.RawMessage
				if json.Unmarshal(b, &f) != nil {
					continue
				}
				var ev string
				_ = json.Unmarshal(f[3], &ev)
				var p struct {
					Value int64 `json:"value"`
					LogID int64 `json:"log_id"`
				}
				_ = json.Unmarshal(f[4], &p)
				switch ev {
				case "snapshot":
					s.lastID = p.LogID
					snapshot = true
					joined.Done()
				case "change":
					if p.LogID != s.lastID+1 {
						s.bad++
					}
					s.lastID = p.LogID
					if measuring.Load() {
						events.Add(1)
						local = append(local, float64(now-p.Value)/1e6)
						localArr = append(localArr, arrival{writeKey{s.obj, p.Value}, now})
					}
				}
			}
		}()
	}
	joined.Wait()
	time.Sleep(500 * time.Millisecond)
	after, err := mem()
	if err != nil {
		return fanoutRound{}, err
	}

	// Steady writes: a pacer hands out write slots; 32 workers take them.
	var (
		wmu     sync.Mutex
		wlat    []float64
		acks    = map[writeKey]int64{} // when each write's writer got its reply
		werr    atomic.Value
		workers sync.WaitGroup
	)
	slots := make(chan int, cfg.rate)
	for w := 0; w < 32; w++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for obj := range slots {
				start := time.Now()
				if err := put(obj, start.UnixNano()); err != nil {
					werr.Store(err)
					continue
				}
				acked := time.Now()
				wmu.Lock()
				wlat = append(wlat, float64(acked.Sub(start))/1e6)
				acks[writeKey{obj, start.UnixNano()}] = acked.UnixNano()
				wmu.Unlock()
			}
		}()
	}
	pace := func(d time.Duration) int {
		interval := time.Second / time.Duration(cfg.rate)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		end := time.Now().Add(d)
		n := 0
		for time.Now().Before(end) {
			<-tick.C
			slots <- n % cfg.objects
			n++
		}
		return n
	}
	pace(time.Second) // warm-up, not measured
	time.Sleep(200 * time.Millisecond)
	measuring.Store(true)
	start := time.Now()
	written := pace(cfg.duration)
	close(slots)
	workers.Wait()
	time.Sleep(500 * time.Millisecond) // the last events reach their clients
	elapsed := time.Since(start)
	measuring.Store(false)
	if err, _ := werr.Load().(error); err != nil {
		return fanoutRound{}, err
	}
	for _, s := range subs {
		s.conn.Close(websocket.StatusNormalClosure, "")
	}
	readers.Wait()
	bad := 0
	for _, s := range subs {
		bad += s.bad
	}
	var fromAck []float64
	early := 0
	for _, a := range arrivals {
		if at, ok := acks[a.w]; ok {
			fromAck = append(fromAck, float64(a.at-at)/1e6)
			if a.at < at {
				early++
			}
		}
	}
	sort.Float64s(latencies)
	sort.Float64s(fromAck)
	sort.Float64s(wlat)
	pct := func(v []float64, p float64) float64 {
		if len(v) == 0 {
			return 0
		}
		return v[int(float64(len(v)-1)*p)]
	}
	perObject := float64(cfg.sockets) / float64(cfg.objects)
	return fanoutRound{
		EventsPerSec:    float64(events.Load()) / elapsed.Seconds(),
		ExpectedPerSec:  float64(written) * perObject / elapsed.Seconds(),
		LatencyP50Ms:    pct(latencies, 0.5),
		LatencyP99Ms:    pct(latencies, 0.99),
		AckLatencyP50Ms: pct(fromAck, 0.5),
		AckLatencyP99Ms: pct(fromAck, 0.99),
		BeforeAckShare:  float64(early) / float64(max(1, len(fromAck))),
		WriteP50Ms:      pct(wlat, 0.5),
		BytesPerSocket:  (after - before) / float64(cfg.sockets),
		ClosedSlow:      int(closed.Load()),
		MissingOrDouble: bad,
	}, nil
}
