package config

import "testing"

func TestLoad_MemoryBudget(t *testing.T) {
	if c := mustLoad(t, "", nil); c.MemoryBudget != 0 {
		t.Fatalf("default memoryBudget %d, want 0 (half of the machine's memory)", c.MemoryBudget)
	}
	c := mustLoad(t, "memoryBudget: 2147483648\n", nil)
	if c.MemoryBudget != 2<<30 {
		t.Fatalf("file memoryBudget %d", c.MemoryBudget)
	}
	c = mustLoad(t, "memoryBudget: 2147483648\n", map[string]string{EnvMemoryBudget: "1073741824"})
	if c.MemoryBudget != 1<<30 {
		t.Fatalf("env memoryBudget %d, want the environment's", c.MemoryBudget)
	}
	for _, tc := range []struct {
		name, yaml string
		env        map[string]string
		key, want  string
	}{
		{"too small", "memoryBudget: 512\n", nil, "memoryBudget", "below the minimum 33554432 (32 MiB)"},
		{"negative", "memoryBudget: -1\n", nil, "memoryBudget", "below the minimum"},
		{"string", "memoryBudget: 2GiB\n", nil, "memoryBudget", "expected an integer, got a string"},
		{"env not a number", "", map[string]string{EnvMemoryBudget: "2GiB"}, EnvMemoryBudget, `expected a number of bytes, got "2GiB"`},
		{"env too small", "", map[string]string{EnvMemoryBudget: "1024"}, EnvMemoryBudget, "below the minimum"},
	} {
		path := ""
		if tc.yaml != "" {
			path = writeConfig(t, tc.yaml)
		}
		_, err := Load(path, env(tc.env))
		checkErr(t, tc.name, err, tc.key, tc.want)
	}
	c = Default()
	c.MemoryBudget = 100 // as a flag would set it
	checkErr(t, "after flags", c.Validate(), "memoryBudget", "below the minimum")
}
