package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestServe_HeaderTooLargeIsJSON: the served gateway answers a header over
// net/http's limit with the JSON 431 of spec/errors.md (gateway.Listener),
// not net/http's text.
func TestServe_HeaderTooLargeIsJSON(t *testing.T) {
	srv := startClientServer(t)
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		_, _ = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("b", 2*http.DefaultMaxHeaderBytes)+"\r\n\r\n")
	}()
	defer func() { conn.Close(); <-wrote }()
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	var m struct{ Error, Code string }
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || json.Unmarshal(body, &m) != nil || m.Code != "too_large" || m.Error == "" {
		t.Fatalf("reply %d %q, want a JSON 431 with code too_large", resp.StatusCode, body)
	}
}
