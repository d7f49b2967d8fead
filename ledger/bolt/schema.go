package bolt

import "idemgate/ledger"

// The bbolt file's layout: every bucket name, meta key and the on-disk
// schema version live here. The ledger's collections (ledger.Collections)
// are top-level buckets; the downstream collections are buckets nested in
// "data".
//
// boltSchemaVersion 2 is the file as reset before 1.0 (one record format,
// ledger.EncodeRecord); files of version 1, written by development builds
// before it, are refused, not converted.
const boltSchemaVersion = 2

var (
	bucketMeta       = []byte(ledger.MetaCollection)
	bucketRecords    = []byte(ledger.RecordsCollection)
	bucketAudit      = []byte(ledger.AuditCollection)
	bucketAuditByKey = []byte(ledger.AuditByKeyCollection)
	bucketData       = []byte("data") // collection → nested bucket of downstream data
	keySchemaVersion = []byte("schema_version")
	keyMagic         = []byte("magic")        // ledgerMagic: written when the file is created
	keyCreatedAt     = []byte("created_at")   // RFC 3339, when the file was created
	keyHealthProbe   = []byte("health_probe") // RFC 3339, the newest health probe commit (and, for a moment, its padding)
)

// ledgerMagic marks a bbolt file as an idemgate ledger (meta/magic).
const ledgerMagic = "idemgate-ledger"

// allBuckets are the file's top-level buckets: the ledger's collections,
// with "data" after "audit" (the order of the buckets' creation).
var allBuckets = func() [][]byte {
	var out [][]byte
	for _, c := range ledger.Collections() {
		out = append(out, []byte(c))
		if c == ledger.AuditCollection {
			out = append(out, bucketData)
		}
	}
	return out
}()

// appendBuckets are the collections whose keys begin with a time or a
// sequence number, so new keys land at (or near) the end: their pages are
// filled to appendFillPercent before they split, instead of bbolt's half,
// so the file grows by about half as many of their pages, and a commit
// splits fewer. The others are keyed by operation keys and hashes, written
// anywhere, where half-full pages leave room for the next insert.
var appendBuckets = []string{ledger.AuditCollection, "by_time", "expiry"}

// appendData are the downstream collections (nested in "data") filled the
// same way: the embedded orders, keyed by tenant and an order id that
// begins with its creation time (orders.ID).
var appendData = []string{"orders"}

// appendFillPercent is bbolt's Bucket.FillPercent for appendBuckets: a
// little room for the few keys that arrive out of order (claims of one
// group commit, the expiry index's several due times).
const appendFillPercent = 0.95
