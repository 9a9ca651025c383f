#!/usr/bin/env bash
# Installs the S3 servers that the tests start as separate processes into the test
# cache ($HOLDFAST_TEST_BIN, default ~/.cache/holdfast-test-bin): MinIO (AGPL; it only
# ever runs as a test server, it is never imported or committed) and versitygw (an
# Apache-licensed S3 gateway that checks conditional writes the way AWS does).
# Both are built with `go install` from the Go module proxy; MinIO takes about 10
# minutes on 2 cores the first time. Already installed binaries are kept.
set -euo pipefail
export PATH=/usr/local/go/bin:$PATH
dir="${HOLDFAST_TEST_BIN:-$HOME/.cache/holdfast-test-bin}"
mkdir -p "$dir"
install() {
  local name=$1 pkg=$2
  if [ -x "$dir/$name" ]; then
    echo "$name: $dir/$name"
    return
  fi
  echo "$name: building $pkg (go install)"
  (cd "$dir" && GOBIN="$dir" go install "$pkg")
  echo "$name: $dir/$name"
}
install versitygw github.com/versity/versitygw/cmd/versitygw@v1.8.0 &
v=$!
install minio github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c &
m=$!
wait $v
wait $m
