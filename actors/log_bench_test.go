package actors

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// BenchmarkLog_AppendBatch100 appends batches of 100 records of 256 bytes to one
// log, one batch at a time (b.N batches).
func BenchmarkLog_AppendBatch100(b *testing.B) {
	n := startNode(&testing.T{}, b.TempDir(), nodeOpts{})
	defer n.stop()
	l := NewLog(n.host, ObjectID{App: "app_b", Type: "stream", Key: "l"})
	in := make([]LogInput, 100)
	for i := range in {
		in[i].Body = json.RawMessage(`"` + strings.Repeat("r", 254) + `"`)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := l.Append(ctx, in...); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(in))/b.Elapsed().Seconds(), "records/s")
}
