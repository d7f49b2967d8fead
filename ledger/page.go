package ledger

import (
	"encoding/binary"
	"time"
)

// Paging. List and PendingApprovals page by position: a page ends with a
// record, that record's position (ListPosition, ApprovalPosition) is
// passed back as Filter.After or PendingApprovals' after, and the next
// page starts strictly after it. Positions are in the order of an index
// that records never move in (first-seen time, then tenant and key or
// approval id), so paging through a listing while new records are added
// neither repeats nor skips a record that existed when paging began:
// List is newest first, so new records land before the first page and are
// not seen; PendingApprovals is oldest first, so new approvals are seen on
// a later page. A position is bytes, opaque outside this package; a
// position that names no record still orders correctly.

// ListPosition is rec's place in List's order: pass it as Filter.After to
// list the records older than rec.
func ListPosition(rec *Record) string {
	return string(timeKey(rec.FirstSeenAt, rec.Tenant, rec.Key))
}

// ApprovalPosition is the place in PendingApprovals' order of rec, a
// record with an approval: pass it as after to list the approvals
// requested after it.
func ApprovalPosition(rec *Record) string {
	id := ""
	if rec.Approval != nil {
		id = rec.Approval.ID
	}
	return approvalPosition(rec.FirstSeenAt, id)
}

func approvalPosition(t time.Time, id string) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(t.UnixNano()))
	return string(b[:]) + id
}

// OpenPosition is rec's place in OpenRecords' order: pass it as after to
// list the open records after rec. Like every position it is opaque.
func OpenPosition(rec *Record) string {
	return rec.Tenant + "\x00" + rec.Key
}
