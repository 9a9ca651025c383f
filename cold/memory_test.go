package cold_test

import (
	"testing"

	"github.com/holdfast/holdfast/cold"
	"github.com/holdfast/holdfast/cold/coldtest"
)

func TestMemoryConformance(t *testing.T) { coldtest.Run(t, cold.NewMemory(), "") }
