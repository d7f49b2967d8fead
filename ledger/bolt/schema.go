package bolt

import "idemgate/ledger"

// The bbolt file's layout: every bucket name, meta key and the on-disk
// schema version live here. The ledger's collections (ledger.Collections)
// are top-level buckets; the downstream collections are buckets nested in
// "data".
const boltSchemaVersion = 1

var (
	bucketMeta       = []byte(ledger.MetaCollection)
	bucketRecords    = []byte(ledger.RecordsCollection)
	bucketAudit      = []byte(ledger.AuditCollection)
	bucketAuditByKey = []byte(ledger.AuditByKeyCollection)
	bucketData       = []byte("data") // collection → nested bucket of downstream data
	keySchemaVersion = []byte("schema_version")
	keyMagic         = []byte("magic")        // ledgerMagic: written when the file is created, or when a schema-1 ledger of the build before it is first opened writable
	keyCreatedAt     = []byte("created_at")   // RFC 3339, when the file was created
	keyHealthProbe   = []byte("health_probe") // RFC 3339, the newest health probe commit (and, for a moment, its padding)
)

// ledgerMagic marks a bbolt file as an idemgate ledger (meta/magic). A
// file without it is refused unless it has the exact shape of a ledger
// written before the magic existed (see openSchema).
const ledgerMagic = "idemgate-ledger"

// legacyCore are buckets every ledger of schema version 1 has, with or
// without the magic.
var legacyCore = []string{"meta", "records", "by_time", "audit"}

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
