// Command orders-live serves a web page that shows an order's state live: an
// embedded Holdfast runtime and its HTTP gateway (REST API and websocket) run in
// this process next to the page, and the page's backend mints a capability token
// for the browser, which joins the order's channel with the official phoenix
// JavaScript client. Change the order through the REST API and the page follows.
//
//	go run ./examples/orders-live -listen 127.0.0.1:8080
package main

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/gateway"
)

//go:embed static
var static embed.FS

// Server is the example's process: a runtime, its gateway and the page.
type Server struct {
	URL string      // http://host:port
	App gateway.App // the app created in the data directory on first start
	rt  *holdfast.Runtime
	gw  *gateway.Server
	srv *http.Server
}

// Start opens the runtime in dir, seeds order-42, and serves on addr.
func Start(dir, addr string, logger *slog.Logger) (*Server, error) {
	apps, err := gateway.LoadOrCreateApps(dir, nil, nil)
	if err != nil {
		return nil, err
	}
	rt, err := holdfast.Open(holdfast.Options{DataDir: filepath.Join(dir, "db"), Logger: logger})
	if err != nil {
		return nil, err
	}
	s := &Server{App: apps[0], rt: rt}
	ctx := context.Background()
	order := rt.Object(s.App.ID, "order", "order-42")
	if st, err := order.Get(ctx); err != nil || len(st.State) == 0 {
		if _, err := order.Patch(ctx, []holdfast.PatchEntry{
			{Slot: "status", Value: "placed"}, {Slot: "items", Value: []string{"tea", "mug"}}}); err != nil {
			rt.Close(ctx)
			return nil, fmt.Errorf("seed order-42: %w", err)
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		rt.Close(ctx)
		return nil, err
	}
	s.URL = "http://" + ln.Addr().String()
	s.gw = gateway.New(gateway.Config{Node: rt.Node(), Apps: gateway.NewApps(apps), Logger: logger})
	mux := http.NewServeMux()
	mux.Handle("/api/", s.gw.Handler())    // the REST API (App Key and Secret)
	mux.Handle("/socket/", s.gw.Handler()) // the websocket (a token, or the Secret)
	mux.Handle("GET /static/", http.FileServerFS(static))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, static, "static/index.html")
	})
	mux.HandleFunc("GET /session", s.session)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go s.srv.Serve(ln)
	return s, nil
}

// session is the page's backend: it replies with what the browser needs to
// watch ?order=: the App Key, the channel's topic and a token that lets it read
// that order only. A real backend would check its user's session first. The
// token is minted by the gateway (POST /api/v1/tokens/{app}) with the App
// Secret, which never leaves the server.
func (s *Server) session(w http.ResponseWriter, r *http.Request) {
	order := r.URL.Query().Get("order")
	body, _ := json.Marshal(map[string]any{"capabilities": []string{"object:read:order/" + order}, "ttl_seconds": 300})
	req, _ := http.NewRequestWithContext(r.Context(), "POST", s.URL+"/api/v1/tokens/"+s.App.ID, bytes.NewReader(body))
	req.Header.Set("X-App-Key", s.App.Key)
	req.Header.Set("X-App-Secret", s.App.Secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, "token service unavailable", http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	var minted struct{ Token string }
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&minted) != nil {
		http.Error(w, "no token for this order", http.StatusBadRequest) // e.g. an empty or invalid key
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]string{
		"appKey": s.App.Key,
		"topic":  fmt.Sprintf("durable:%s:order:%s", s.App.Key, order),
		"token":  minted.Token,
	})
}

// Close stops serving, closes the websockets and the runtime.
func (s *Server) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	s.gw.Close() // websockets are hijacked: Shutdown leaves them open
	return errors.Join(err, s.rt.Close(ctx))
}

func main() {
	dir := flag.String("data", "./orders-live-data", "data directory (keeps the app and the orders)")
	addr := flag.String("listen", "127.0.0.1:8080", "address of the page and the API")
	flag.Parse()
	s, err := Start(*dir, *addr, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("Open %s/?order=order-42 and change the order, for example:\n\n"+
		"  curl -X PUT -H 'X-App-Key: %s' -H 'X-App-Secret: %s' \\\n    %s/api/v1/objects/%s/order/order-42/status -d '{\"value\": \"shipped\"}'\n\n"+
		"Ctrl-C stops the server.\n", s.URL, s.App.Key, s.App.Secret, s.URL, s.App.ID)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Close(cctx); err != nil {
		log.Fatal(err)
	}
}
