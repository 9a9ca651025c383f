package gateway

import (
	"encoding/json"
	"net/http"

	"github.com/holdfast/holdfast/actors"
)

// The alarms' routes (spec/alarms.md, "HTTP").
const alarmBase = "/api/v1/alarms/{app}/{type}/{key}"

func (s *Server) alarmRoutes() {
	s.handle("PUT "+alarmBase+"/{name}", s.object(s.alarmPut))
	s.handle("GET "+alarmBase+"/{name}", s.object(func(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
		s.logSimple(actors.AlarmGet{Name: r.PathValue("name")})(w, r, id)
	}))
	s.handle("DELETE "+alarmBase+"/{name}", s.object(func(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
		if _, ok := s.call(w, r, id, actors.AlarmDelete{Name: r.PathValue("name")}); ok {
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	s.handle("GET "+alarmBase+"/{$}", s.object(s.alarmList))
	s.handle("GET "+alarmBase, s.object(s.alarmList))
}

// alarmList serves GET .../?limit=N&after=CURSOR: one page of the object's
// alarms, {"alarms":[...], "next":CURSOR} ordered by at then name, "next" only
// when more follow. limit defaults to and is capped at 1,000; a page also ends
// once its alarms reach about 1 MiB (actions may be 64 KiB each), always
// holding at least one. after is the "next" of the previous page.
func (s *Server) alarmList(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	q := r.URL.Query()
	limit, err := queryUint(q.Get("limit"), actors.DefaultAlarmPageLimit)
	if err != nil || limit < 1 || (q.Has("limit") && q.Get("limit") == "") {
		badRequest("limit must be a positive integer").write(w)
		return
	}
	m := actors.AlarmListGet{After: q.Get("after"), Limit: int(min(limit, actors.MaxAlarmPageLimit))}
	if q.Has("after") && m.After == "" {
		badRequest(`after must be the "next" cursor of an earlier page of this list`).write(w)
		return
	}
	if reply, ok := s.call(w, r, id, m); ok {
		writeJSON(w, http.StatusOK, reply)
	}
}

// alarmPut serves PUT .../{name} {"at": ms, "action": {...}}. The action may be
// left out when the object's type registers a Go handler for the name.
func (s *Server) alarmPut(w http.ResponseWriter, r *http.Request, id actors.ObjectID) {
	body, aerr := readBody(w, r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	var req struct {
		At     *json.Number    `json:"at"`
		Action json.RawMessage `json:"action"`
	}
	if err := strictJSON(body, &req); err != nil || req.At == nil {
		badRequest(`the body must be {"at": unix milliseconds, "action": {...}}`).write(w)
		return
	}
	at, err := req.At.Int64()
	if err != nil {
		badRequest(`"at" must be an integer number of unix milliseconds`).write(w)
		return
	}
	if string(req.Action) == "null" {
		req.Action = nil
	}
	reply, ok := s.call(w, r, id, actors.AlarmSet{Name: r.PathValue("name"), At: at, Action: req.Action})
	if ok {
		writeJSON(w, http.StatusOK, reply)
	}
}
