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
}

func (s *Server) list(kind actors.ListKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		app := s.authApp(w, r)
		if app == nil {
			return
		}
		q := r.URL.Query()
		limit, err := queryUint(q.Get("limit"), actors.DefaultListLimit)
		if err != nil || limit < 1 {
			badRequest("limit must be a positive integer").write(w)
			return
		}
		lq := actors.ListQuery{App: app.ID, Type: r.PathValue("type"), Kind: kind, Prefix: q.Get("prefix"), After: q.Get("after"),
			Limit: int(min(limit, actors.MaxListLimit))}
		l, ok := s.cfg.Node.(Lister)
		if !ok {
			s.fail(w, r, &actors.Error{Kind: actors.KindInternal, Msg: "this node cannot list objects"})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
		defer cancel()
		page, err := l.List(ctx, lq)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, page)
	}
}
