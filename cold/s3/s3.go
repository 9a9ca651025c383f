// Package s3 is a cold store in an S3 bucket (MinIO, AWS S3, or any S3 server),
// through minio-go. It is the only package that imports minio-go.
//
// Traps it handles (../shared/TRAPS.md): a conditional create disables multipart
// uploads, since minio-go sends If-None-Match only when a multipart upload starts;
// a create that gets 412 compares the stored ETag with the data's MD5, because a
// retried create whose first attempt landed sees its own object; and every call
// has a deadline, few retries and a response-header timeout, since minio-go's
// defaults wait minutes on a hung server.
package s3

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/holdfast/holdfast/cold"
)

// Config configures a Store.
type Config struct {
	Endpoint  string // host:port
	Bucket    string
	AccessKey string
	SecretKey string
	Secure    bool   // HTTPS
	Region    string // default us-east-1
	Prefix    string // prepended to every key, e.g. "segments/"
	// Timeout bounds every call, retries included; zero means 10s.
	Timeout time.Duration
	// MaxRetries is how many times minio-go tries a request; zero means 2.
	MaxRetries int
	// CreateBucket creates the bucket at Open when it does not exist.
	CreateBucket bool
}

// Store is a cold store in one bucket.
type Store struct {
	c       *minio.Client
	bucket  string
	prefix  string
	timeout time.Duration
}

// Open connects to the server and checks (or creates) the bucket.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.MaxRetries <= 0 {
		cfg.MaxRetries = 2
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: cfg.Timeout,
		ExpectContinueTimeout: time.Second,
	}
	c, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:      credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:     cfg.Secure,
		Region:     cfg.Region,
		Transport:  tr,
		MaxRetries: cfg.MaxRetries,
	})
	if err != nil {
		return nil, fmt.Errorf("cold s3: %w", err)
	}
	s := &Store{c: c, bucket: cfg.Bucket, prefix: cfg.Prefix, timeout: cfg.Timeout}
	cctx, cancel := s.deadline(ctx)
	defer cancel()
	ok, err := c.BucketExists(cctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("cold s3: bucket %s at %s: %w", cfg.Bucket, cfg.Endpoint, err)
	}
	if !ok {
		if !cfg.CreateBucket {
			return nil, fmt.Errorf("cold s3: bucket %s does not exist at %s", cfg.Bucket, cfg.Endpoint)
		}
		if err := c.MakeBucket(cctx, cfg.Bucket, minio.MakeBucketOptions{Region: cfg.Region}); err != nil {
			return nil, fmt.Errorf("cold s3: create bucket %s: %w", cfg.Bucket, err)
		}
	}
	return s, nil
}

func (s *Store) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

func status(err error) int { return minio.ToErrorResponse(err).StatusCode }

// check applies the key rules to key, and S3's limit to the object key it
// becomes with the store's prefix.
func (s *Store) check(key string) error {
	if err := cold.CheckKey(key); err != nil {
		return err
	}
	if n := len(s.prefix) + len(key); n > cold.MaxKeyLen {
		return fmt.Errorf("%w: %d bytes with the prefix %q, S3 allows %d", cold.ErrInvalidKey, n, s.prefix, cold.MaxKeyLen)
	}
	return nil
}

func (s *Store) Create(ctx context.Context, key string, data []byte) error {
	if err := s.check(key); err != nil {
		return err
	}
	ctx, cancel := s.deadline(ctx)
	defer cancel()
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream", DisableMultipart: true}
	opts.SetMatchETagExcept("*") // If-None-Match: * — never overwrite
	_, err := s.c.PutObject(ctx, s.bucket, s.prefix+key, bytes.NewReader(data), int64(len(data)), opts)
	if err == nil {
		return nil
	}
	// Refused (412, or 409 from a server racing conditional writes), or failed
	// on the way: a server may answer 412 before reading the body and reset the
	// connection while a large body is still being sent. What the key holds now
	// decides: ours (a retry whose first attempt landed), another's, or nothing.
	info, serr := s.c.StatObject(ctx, s.bucket, s.prefix+key, minio.StatObjectOptions{})
	switch {
	case serr == nil:
		sum := md5.Sum(data)
		if strings.Trim(info.ETag, `"`) == hex.EncodeToString(sum[:]) && info.Size == int64(len(data)) {
			return nil
		}
		return cold.ErrExists
	case status(err) == http.StatusPreconditionFailed || status(err) == http.StatusConflict:
		return fmt.Errorf("cold s3: create %s refused, then stat: %w", key, serr)
	}
	return fmt.Errorf("cold s3: create %s: %w", key, err)
}

func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if err := s.check(key); err != nil {
		return nil, err
	}
	ctx, cancel := s.deadline(ctx)
	defer cancel()
	obj, err := s.c.GetObject(ctx, s.bucket, s.prefix+key, minio.GetObjectOptions{})
	if err == nil {
		var b []byte
		b, err = io.ReadAll(obj)
		obj.Close()
		if err == nil {
			return b, nil
		}
	}
	if status(err) == http.StatusNotFound {
		return nil, cold.ErrNotFound
	}
	return nil, fmt.Errorf("cold s3: get %s: %w", key, err)
}

func (s *Store) Stat(ctx context.Context, key string) (cold.Info, error) {
	if err := s.check(key); err != nil {
		return cold.Info{}, err
	}
	ctx, cancel := s.deadline(ctx)
	defer cancel()
	info, err := s.c.StatObject(ctx, s.bucket, s.prefix+key, minio.StatObjectOptions{})
	if err != nil {
		if status(err) == http.StatusNotFound { // a HEAD error has no body: the status is all
			return cold.Info{}, cold.ErrNotFound
		}
		return cold.Info{}, fmt.Errorf("cold s3: stat %s: %w", key, err)
	}
	return cold.Info{Key: key, Size: info.Size}, nil
}

func (s *Store) List(ctx context.Context, prefix string) ([]cold.Info, error) {
	ctx, cancel := s.deadline(ctx)
	defer cancel()
	var out []cold.Info
	for obj := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("cold s3: list %q: %w", prefix, obj.Err)
		}
		out = append(out, cold.Info{Key: strings.TrimPrefix(obj.Key, s.prefix), Size: obj.Size})
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cold s3: list %q: %w", prefix, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.check(key); err != nil {
		return err
	}
	ctx, cancel := s.deadline(ctx)
	defer cancel()
	err := s.c.RemoveObject(ctx, s.bucket, s.prefix+key, minio.RemoveObjectOptions{})
	if err != nil && status(err) != http.StatusNotFound {
		return fmt.Errorf("cold s3: delete %s: %w", key, err)
	}
	return nil
}
