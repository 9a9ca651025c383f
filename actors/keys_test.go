package actors

import "testing"

// TestKeys_EveryByteIsDistinct: two behaviours (or two index kinds) with one
// byte would read and overwrite each other's keys.
func TestKeys_EveryByteIsDistinct(t *testing.T) {
	for name, set := range map[string][]byte{
		"behaviour":  {behaviourKV, behaviourUser, behaviourLog, behaviourAlarm, behaviourQueue},
		"index kind": {indexAlarms, indexQueues, indexQueueObjects},
	} {
		seen := map[byte]bool{}
		for _, b := range set {
			if seen[b] {
				t.Errorf("%s byte %q is used twice", name, b)
			}
			seen[b] = true
		}
	}
}
