package tools

import (
	"slices"
	"testing"
)

// TestCodesAreTheSchemas: the typed error codes and next actions are
// exactly the enums the output schema publishes, in its order.
func TestCodesAreTheSchemas(t *testing.T) {
	if got, want := errorCodes(), schemaEnum(t, "properties", "error", "properties", "code", "enum"); !slices.Equal(got, want) {
		t.Errorf("Codes() = %v, want the schema's %v", got, want)
	}
	var nexts []string
	for _, n := range NextActions() {
		nexts = append(nexts, string(n))
	}
	if want := schemaEnum(t, "properties", "next_action", "enum"); !slices.Equal(nexts, want) {
		t.Errorf("NextActions() = %v, want the schema's %v", nexts, want)
	}
}
