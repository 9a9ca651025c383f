package gateway

import (
	"context"
	"net/http"

	"github.com/holdfast/holdfast/actors"
)

// Lister is what a Node that lists the keys of a type offers
// (cluster.Node: every partition, every node of a cluster).
type Lister interface {
	List(ctx context.Context, q actors.ListQuery) (actors.ListPage, error)
}

// listRoutes serves GET /api/v1/{objects,logs,queues}/{app}/{type}
// ?prefix=P&after=K&limit=N (spec/batch.md): a page of the keys of the
// type's objects that hold state, a log, or a queue.
func (s *Server) listRoutes() {
	for base, kind := range map[string]actors.ListKind{
		"/api/v1/objects/{app}/{type}": actors.ListObjects,
		"/api/v1/logs/{app}/{type}":    actors.ListLogs,
		"/api/v1/queues/{app}/{type}":  actors.ListQueues,
	} {
		s.handle("GET "+base, s.list(kind))
	}
	s.handle("GET /api/v1/objects/{app}", s.listTypes)
}

// listTypes serves GET /api/v1/objects/{app}?prefix=P&after=T&limit=N: a
// page of the app's types that have objects holding any stored data, as
// {"types": [...], "next": T} (shell completion, browsing).
func (s *Server) listTypes(w http.ResponseWriter, r *http.Request) {
	app := s.authApp(w, r)
	if app == nil {
		return
	}
	page, ok := s.listPage(w, r, actors.ListQuery{App: app.ID, Kind: actors.ListTypes})
	if ok {
		writeJSON(w, http.StatusOK, struct {
			Types []string `json:"types"`
			Next  string   `json:"next,omitempty"`
		}{page.Keys, page.Next})
	}
}

func (s *Server) list(kind actors.ListKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		app := s.authApp(w, r)
		if app == nil {
			return
		}
		lq := actors.ListQuery{App: app.ID, Type: r.PathValue("type"), Kind: kind}
		page, ok := s.listPage(w, r, lq)
		if !ok {
			return
		}
		writeJSON(w, http.StatusOK, page)
	}
}

// listPage reads the query's prefix, after and limit into lq and runs the
// listing; it writes the error reply itself (ok false).
func (s *Server) listPage(w http.ResponseWriter, r *http.Request, lq actors.ListQuery) (actors.ListPage, bool) {
	q := r.URL.Query()
	limit, err := queryUint(q.Get("limit"), actors.DefaultListLimit)
	if err != nil || limit < 1 {
		badRequest("limit must be a positive integer").write(w)
		return actors.ListPage{}, false
	}
	lq.Prefix, lq.After, lq.Limit = q.Get("prefix"), q.Get("after"), int(min(limit, actors.MaxListLimit))
	l, ok := s.cfg.Node.(Lister)
	if !ok {
		s.fail(w, r, &actors.Error{Kind: actors.KindInternal, Msg: "this node cannot list objects"})
		return actors.ListPage{}, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	page, err := l.List(ctx, lq)
	if err != nil {
		s.fail(w, r, err)
		return actors.ListPage{}, false
	}
	return page, true
}
