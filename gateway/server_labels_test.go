package gateway

import "testing"

// The request metrics' method and route labels: a pattern's method apart
// from its path; an unmatched request's method only when it is one of HTTP's.
func TestMetricLabels(t *testing.T) {
	for _, c := range []struct{ pattern, method, wantMethod, wantRoute string }{
		{"PUT /api/v1/objects/{app}/{type}/{key}/{slot}", "PUT", "PUT", "/api/v1/objects/{app}/{type}/{key}/{slot}"},
		{"GET /healthz", "HEAD", "GET", "/healthz"},
		{"", "DELETE", "DELETE", "unmatched"},
		{"", "BREW", "other", "unmatched"},
		{"/metrics", "GET", "GET", "/metrics"},
	} {
		m, r := metricLabels(c.pattern, c.method)
		if m != c.wantMethod || r != c.wantRoute {
			t.Errorf("metricLabels(%q, %q) = %q, %q; want %q, %q", c.pattern, c.method, m, r, c.wantMethod, c.wantRoute)
		}
	}
}
