package ledger

// The bbolt file's layout: every bucket name, meta key and the on-disk
// schema version live here.
const boltSchemaVersion = 1

var (
	bucketMeta       = []byte("meta")              // schema_version → decimal
	bucketRecords    = []byte("records")           // tenant \x00 key → Record JSON
	bucketByTime     = []byte("by_time")           // first_seen (8 bytes BE ns) tenant \x00 key → ""
	bucketExpiry     = []byte("expiry")            // completed_at (8 bytes BE ns) tenant \x00 key → ""
	bucketFPIndex    = []byte("fp_index")          // tenant \x00 fingerprint → fpEntry JSON (latest executed key)
	bucketIssued     = []byte("issued")            // tenant \x00 key → issued_at (8 bytes BE ns)
	bucketAudit      = []byte("audit")             // seq (8 bytes BE) → AuditEntry JSON
	bucketData       = []byte("data")              // collection → nested bucket of downstream data
	bucketApprovals  = []byte("approvals")         // tenant \x00 approval_id → key
	bucketPending    = []byte("pending_approvals") // tenant \x00 approval_id → key, while pending
	bucketOpen       = []byte("open")              // state \x00 tenant \x00 key → "" for in_progress, unknown, retryable
	bucketAuditByKey = []byte("audit_by_key")      // tenant \x00 key \x00 seq (8 bytes BE) → ""
	keySchemaVersion = []byte("schema_version")
	keyAuditIndexed  = []byte("audit_indexed") // meta: seq (8 bytes BE) through which every audit entry is in audit_by_key
)

var allBuckets = [][]byte{bucketMeta, bucketRecords, bucketByTime, bucketExpiry, bucketFPIndex, bucketIssued, bucketAudit, bucketData, bucketApprovals, bucketPending, bucketOpen, bucketAuditByKey}
