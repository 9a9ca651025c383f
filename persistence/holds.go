package persistence

// Holds: the one owner of Badger's discard version.

// HoldVersions keeps every version above seq, deletions included, from Badger's
// compaction until release is called: a partition handoff reads the changes made
// after seq, and needs the deletions among them. Holds nest.
func (p *Pipeline) HoldVersions(seq uint64) (release func()) {
	p.holdMu.Lock()
	defer p.holdMu.Unlock()
	if p.holds == nil {
		p.holds = map[*uint64]struct{}{}
	}
	h := new(uint64)
	*h = seq
	p.holds[h] = struct{}{}
	p.updateDiscardLocked()
	return func() {
		p.holdMu.Lock()
		defer p.holdMu.Unlock()
		delete(p.holds, h)
		p.updateDiscardLocked()
	}
}

// updateDiscardLocked sets Badger's discard version, the version at or below
// which it may drop old versions: the newest applied one, or the lowest live
// hold if that is lower. It is the only place that sets it; holdMu is held.
func (p *Pipeline) updateDiscardLocked() {
	v := p.discardAbove
	for h := range p.holds {
		if *h < v {
			v = *h
		}
	}
	if testOnSetDiscard != nil {
		testOnSetDiscard(v)
	}
	p.db.bdb.SetDiscardTs(v)
}
