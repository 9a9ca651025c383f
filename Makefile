# Shortcuts for the commands the README documents; each is one Go command.

.PHONY: serve test bench bench-smoke torture

serve:
	go run ./cmd/holdfast serve

test:
	scripts/test.sh

# Holdfast against Redis and NATS JetStream, side by side: 5 shuffled rounds of every
# case bracketed by a raw fsync probe (about 20 minutes on 2 cores). Installs
# Debian's redis-server when it is missing (as root).
bench:
	go run ./bench -json bench/results/latest.json -md bench/results/latest.md

# The CI profile: 2 short rounds; fails only when a ratio is far below its target.
bench-smoke:
	go run ./bench -smoke

# 10 torture runs of 2 minutes: SIGKILLs under load, histories checked.
torture:
	go run ./bench/torture -runs 10 -duration 2m
