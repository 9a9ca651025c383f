// Package pipehook holds the test hooks of persistence's commit pipeline
// (persistence.PipelineConfig.Hooks). It is internal to this module, so no
// program outside it can set them: they are for the module's own tests, which
// hold the committer or the applier at a chosen point to see what the others
// do meanwhile.
package pipehook

// Hooks are called on the pipeline's own goroutines; a hook may block to hold
// that goroutine.
type Hooks struct {
	// BeforeCommit is called on the goroutine committing (the committer, or a
	// writer's in Help) just before each commit, with the number of writes it
	// covers.
	BeforeCommit func(writes int)
	// BeforeApply is called on the applier goroutine before each record is
	// applied to Badger.
	BeforeApply func(seq uint64)
}
