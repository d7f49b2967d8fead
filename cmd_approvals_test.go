package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"idemgate/tools"
)

// legacyPrintApprovals is how `idemgate approvals list|show` printed
// before it printed from typed values: from the tool's JSON answer. It is
// the reference for printApprovals' bytes.
func legacyPrintApprovals(w io.Writer, result []byte) error {
	var r struct {
		Approvals []map[string]any `json:"approvals"`
	}
	if err := json.Unmarshal(result, &r); err != nil {
		return err
	}
	if len(r.Approvals) == 0 {
		fmt.Fprintln(w, "no pending approvals")
	}
	for _, a := range r.Approvals {
		fmt.Fprintf(w, "%v  %v  %v  requested by %v  expires %v\n  why: %v\n", a["approval_id"], a["status"], a["tool"], a["requested_by"], a["expires_at"], a["reason"])
		fmt.Fprintf(w, "  operation_key: %v\n", a["operation_key"])
		for _, line := range strings.Split(strings.TrimRight(fmt.Sprint(a["diff_text"]), "\n"), "\n") {
			fmt.Fprintf(w, "  | %s\n", line)
		}
		fmt.Fprintln(w)
	}
	return nil
}

// TestPrintApprovalsBytes: the terminal listing printed from typed
// approvals is byte for byte what the JSON-parsing printer produced.
func TestPrintApprovalsBytes(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 89000, time.UTC)
	views := []tools.ApprovalView{
		{ApprovalID: "ap_1", Status: "pending", Tool: "cancel_order", RequestedBy: "alice", ExpiresAt: at, Reason: "cancel_order always needs a human approver",
			OperationKey: "k1", DiffText: "cancel order o1 (version 1):\n  ~ status: \"placed\" → cancelled\n  reason: customer asked\n"},
		{ApprovalID: "ap_2", Status: "pending", Tool: "create_order", RequestedBy: "bob", ExpiresAt: at.In(time.FixedZone("x", 3600)).Truncate(time.Second), Reason: "big",
			OperationKey: "k2", DiffText: ""},
	}
	for name, list := range map[string][]tools.ApprovalView{"none": {}, "one": views[:1], "two": views} {
		t.Run(name, func(t *testing.T) {
			var got, want bytes.Buffer
			printApprovals(&got, list)
			b, err := json.Marshal(tools.ApprovalList{Approvals: list, Count: len(list)})
			if err != nil {
				t.Fatal(err)
			}
			if err := legacyPrintApprovals(&want, b); err != nil {
				t.Fatal(err)
			}
			if got.String() != want.String() {
				t.Errorf("printed\n%s\nwant\n%s", got.String(), want.String())
			}
		})
	}
}
