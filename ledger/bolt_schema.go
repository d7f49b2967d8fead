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
	keyMagic         = []byte("magic")         // ledgerMagic: written when the file is created, or when a schema-1 ledger of the build before it is first opened writable
	keyCreatedAt     = []byte("created_at")    // RFC 3339, when the file was created
	keyHealthProbe   = []byte("health_probe")  // RFC 3339, the newest health probe commit
)

// ledgerMagic marks a bbolt file as an idemgate ledger (meta/magic). A
// file without it is refused unless it has the exact shape of a ledger
// written before the magic existed (see openSchema).
const ledgerMagic = "idemgate-ledger"

// legacyCore are buckets every ledger of schema version 1 has, with or
// without the magic.
var legacyCore = []string{"meta", "records", "by_time", "audit"}

var allBuckets = [][]byte{bucketMeta, bucketRecords, bucketByTime, bucketExpiry, bucketFPIndex, bucketIssued, bucketAudit, bucketData, bucketApprovals, bucketPending, bucketOpen, bucketAuditByKey}
