// Package gateway is Holdfast's HTTP server: the REST routes of spec/objects.md,
// app authentication (spec/auth.md), the error bodies of spec/errors.md, and the
// health endpoints. It turns requests into actor messages sent through a Node and
// never touches storage itself; a raw Go error never reaches a client.
//
// Handlers run on net/http's goroutines; Server holds no per-request state.
package gateway
