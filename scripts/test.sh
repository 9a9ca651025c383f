#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs the S3 test servers (first run
# only; see test-servers.sh), then runs every Go test. The phoenix JavaScript suite
# installs its npm packages on first use (it needs Node.js 20 and npm).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
scripts/test-servers.sh
go test ./... "$@"
