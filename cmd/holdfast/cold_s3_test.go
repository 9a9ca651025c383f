package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	colds3 "github.com/holdfast/holdfast/cold/s3"
	"github.com/holdfast/holdfast/internal/s3test"
)

// TestServe_ColdStoreOnS3: `holdfast serve` configured with `cold.store: s3`
// flushes trimmed records to a MinIO process and reads them back.
func TestServe_ColdStoreOnS3(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	minio := s3test.MinIO(t)
	bucket, err := colds3.Open(context.Background(), colds3.Config{
		Endpoint: minio.Endpoint, Bucket: "holdfast", AccessKey: s3test.AccessKey, SecretKey: s3test.SecretKey, CreateBucket: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfgFile, dataDir, _ := crashSetup(t, `  events:
    log:
      maxBatchSize: 10
      retention: {maxRecords: 5, trimEvery: 0s}
      cold: true
`)
	extra := fmt.Sprintf("cold:\n  store: s3\n  s3: {endpoint: %q, bucket: holdfast, accessKeyEnv: HF_TEST_S3_KEY, secretKeyEnv: HF_TEST_S3_SECRET, prefix: segments/}\n", minio.Endpoint)
	f, err := os.OpenFile(cfgFile, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(extra); err != nil {
		t.Fatal(err)
	}
	f.Close()
	t.Setenv("HF_TEST_S3_KEY", s3test.AccessKey)
	t.Setenv("HF_TEST_S3_SECRET", s3test.SecretKey)
	srv := startServer(t, dataDir, cfgFile)
	defer srv.kill(t)
	c := &http.Client{Timeout: 10 * time.Second}
	ctx := context.Background()
	const logPath = "/api/v1/logs/app_crash/events/e1"
	for i := 0; i < 3; i++ {
		recs := make([]map[string]any, 10)
		for j := range recs {
			recs[j] = map[string]any{"body": i*10 + j}
		}
		if status, reply, err := call(ctx, c, "POST", srv.url+logPath+"/append", map[string]any{"records": recs}); err != nil || status != 200 {
			t.Fatalf("append: %d %v %v", status, reply, err)
		}
	}
	status, reply, err := call(ctx, c, "POST", srv.url+logPath+"/trim", nil)
	if err != nil || status != 200 || reply["removed"] != 25.0 {
		t.Fatalf("trim: %d %v %v", status, reply, err)
	}
	segs, err := bucket.List(ctx, "segments/log/")
	if err != nil || len(segs) != 3 {
		t.Fatalf("segments in the bucket: %v %v", segs, err)
	}
	status, reply, err = call(ctx, c, "GET", srv.url+logPath+"/records?from=3&limit=100", nil)
	recs, _ := reply["records"].([]any)
	if err != nil || status != 200 || len(recs) != 7 || recs[0].(map[string]any)["body"] != 3.0 {
		t.Fatalf("cold read: %d %v %v", status, reply, err)
	}
}
