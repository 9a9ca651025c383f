// Command bench measures Holdfast against a raw fsync probe, side by side in one
// run, on the embedded runtime (no network).
//
//	go run ./bench                  # 5 rounds, 3s per case
//	go run ./bench -rounds 7 -duration 5s -json bench/results/run.json
//
// Each round runs the probe and every case in a shuffled order, each case in its
// own process with a fresh data directory. The probe is a 4 KiB overwrite plus
// fdatasync in a pre-written file, run before and after the cases of a round; a
// case's ratio is its throughput over the mean of its round's two probes. The
// report gives the median and spread of each figure over the rounds.
package main
