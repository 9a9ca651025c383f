package gateway

import (
	"encoding/json"
	"net"
	"strconv"
)

// Listener wraps the listener a node serves its gateway on, so that the one
// error net/http answers before any handler runs and that a client can cause
// with a well-formed request, a request line and header over
// http.Server.MaxHeaderBytes, goes out as the JSON error of spec/errors.md (431,
// code too_large) instead of net/http's plain text. The limit stays
// net/http's: the header is never read past it, so a client cannot make the
// node buffer more than it did.
func Listener(ln net.Listener) net.Listener { return &jsonErrListener{Listener: ln} }

type jsonErrListener struct{ net.Listener }

var _ net.Listener = (*jsonErrListener)(nil)

func (l *jsonErrListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &jsonErrConn{Conn: c}, nil
}

// netHTTP431 is net/http's whole reply to an over-long header, written to the
// connection in one call (net/http server.go, conn.serve, as of Go 1.26).
// TestValidation_HeaderTooLarge431 fails if a Go release changes it.
const netHTTP431 = "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large"

// jsonErrConn replaces net/http's 431 by the JSON one. Every other write
// passes through: a reply of a handler goes through net/http's buffered
// writer and never is exactly that text, nor is a websocket frame.
type jsonErrConn struct{ net.Conn }

var _ net.Conn = (*jsonErrConn)(nil)

func (c *jsonErrConn) Write(b []byte) (int, error) {
	if len(b) != len(netHTTP431) || string(b) != netHTTP431 {
		return c.Conn.Write(b)
	}
	if _, err := c.Conn.Write(headerTooLargeReply()); err != nil {
		return 0, err
	}
	return len(b), nil
}

// CloseWrite lets net/http half-close the connection after the 431, as it
// does on a bare TCP connection, so that the client reads the reply before
// the connection is closed with the rest of its header unread.
func (c *jsonErrConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// headerTooLargeReply is the whole HTTP reply to an over-long header, with a
// request id of its own (no handler ran to give it one).
func headerTooLargeReply() []byte {
	id := randomHex(8)
	body, _ := json.Marshal(errBody("the request line and header fields are larger than the server accepts", "too_large"))
	body = append(body[:len(body)-1], `,"request_id":"`+id+`"}`+"\n"...)
	head := "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\nConnection: close\r\n" +
		"X-Request-Id: " + id + "\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
	return append([]byte(head), body...)
}
