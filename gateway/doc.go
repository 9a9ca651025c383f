// Package gateway is Holdfast's HTTP server: the REST routes of spec/objects.md,
// app authentication (spec/auth.md), the error bodies of spec/errors.md, and the
// health endpoints. It turns requests into actor messages sent through a Node and
// never touches storage itself; a raw Go error never reaches a client.
//
// Two servers share the node's port (front.go): fasthttp reads every request
// and serves the hot KV routes itself (fastroutes.go, the mux's code behind an
// adapter); every other request hands its connection to net/http and the mux
// (server.go and the route files). Server.Handler alone is the net/http side,
// for embedding in another server. Handlers hold no per-request state in the
// Server.
//
// Files: server.go (the mux, the request wrapper, errors' logging), front.go
// and fastroutes.go (the Front), objects.go, logs.go, queues.go, alarms.go,
// batch.go, list.go (the routes), socket.go and socketpump.go (the Phoenix
// websocket), apps.go and tokens.go (credentials), errors.go and bodies.go
// (replies and body checks), listener.go (net/http's 431 as JSON).
package gateway
