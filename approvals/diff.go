package approvals

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// Change is one line of a structured diff. Before is null for a created
// field, After is null for a removed one.
type Change struct {
	Path   string `json:"path"`
	Before any    `json:"before"`
	After  any    `json:"after"`
}

// Diff is what an approver is shown: structured changes and the same as
// readable text.
type Diff struct {
	Changes []Change
	Text    string
}

// CreateDiff shows a resource that does not exist yet: every field of it.
func CreateDiff(kind string, resource map[string]any) Diff {
	var changes []Change
	for _, k := range sortedKeys(resource) {
		changes = append(changes, Change{Path: k, Before: nil, After: resource[k]})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "create %s:\n", kind)
	for _, c := range changes {
		fmt.Fprintf(&b, "  + %s: %s\n", c.Path, show(c.After))
	}
	return Diff{Changes: changes, Text: b.String()}
}

// UpdateDiff shows the fields of before that changes would change, and
// nothing else.
func UpdateDiff(kind, id string, version int, before, after map[string]any) Diff {
	var changes []Change
	for _, k := range sortedKeys(after) {
		if !reflect.DeepEqual(normalize(before[k]), normalize(after[k])) {
			changes = append(changes, Change{Path: k, Before: before[k], After: after[k]})
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "change %s %s (version %d):\n", kind, id, version)
	if len(changes) == 0 {
		b.WriteString("  (no field changes)\n")
	}
	for _, c := range changes {
		fmt.Fprintf(&b, "  ~ %s: %s → %s\n", c.Path, show(c.Before), show(c.After))
	}
	return Diff{Changes: changes, Text: b.String()}
}

// CancelDiff shows the resource being cancelled: its status change and,
// when reason is not empty, its cancel_reason set to reason (the agent's
// reason, which approvers read on the approval).
func CancelDiff(kind, id string, version int, resource map[string]any, reason string) Diff {
	changes := []Change{{Path: "status", Before: resource["status"], After: "cancelled"}}
	if reason != "" {
		changes = append(changes, Change{Path: "cancel_reason", Before: resource["cancel_reason"], After: reason})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "cancel %s %s (version %d): status %s → cancelled\n", kind, id, version, show(resource["status"]))
	if reason != "" {
		fmt.Fprintf(&b, "  reason: %s\n", reason)
	}
	b.WriteString("  the order being cancelled:\n")
	for _, k := range sortedKeys(resource) {
		fmt.Fprintf(&b, "    %s: %s\n", k, show(resource[k]))
	}
	return Diff{Changes: changes, Text: b.String()}
}

// ToMap turns a struct into the generic form diffs compare.
func ToMap(v any) map[string]any {
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m
}

func normalize(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	json.Unmarshal(b, &out)
	return out
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// show renders a value on one line, bounded.
func show(v any) string {
	if v == nil {
		return "(none)"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	s := string(b)
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
