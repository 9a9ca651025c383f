// Package cold will own the cold segment store: the contract (create-if-absent,
// read, stat, list, delete), its in-memory implementation, cold/fs and cold/s3
// (the only importer of minio-go), and the conformance suite they all pass.
//
// It holds no code yet: the retained log's cold segments arrive with it. It sits
// below actors and imports nothing of Holdfast's.
package cold
