// Package forward lets several processes share one ledger file through a
// single writer. The process that holds the file (the writer) serves its
// ledger.Backend on a local socket (Serve); the others (forwarders) use a
// Client instead of opening the file, so their transactions join the
// writer's group commit and the file is never closed and reopened to hand
// it over.
//
// What is forwarded is the backend transaction, not a Go closure and not
// a tool call: fn runs in the forwarder, and each read it makes (Get, a
// cursor move, Bucket, Data) is a round trip to the writer, served inside
// the writer's own bbolt transaction; Put and Delete are sent without
// waiting and applied in order. Every rule of package ledger (claims,
// fencing, the audit chain, the embedded orders and the outbox, which
// write in the ledger's transaction) therefore runs unchanged in the
// forwarder, on the writer's serializable transactions. Forwarding the
// ledger's operations or the service's calls instead would need every
// apply function and every configuration to exist in the writer.
//
// Reads inside the writer's write transaction are the expensive ones:
// every other caller's commit waits for them. So a Client learns the
// reads its transactions make again and again (the ledger's meta keys, the
// audit chain's head) and names them when it begins a transaction; the
// writer reads them in that transaction just before fn runs and sends
// the answers with its start. fn finds them there unless it wrote the
// key (or, for a cursor's first move, the collection) first; anything
// else is a round trip as before. A cursor that moves on gets the next
// moves read ahead, taken while the transaction writes nothing since the
// cursor's latest First, Last or Seek. Data collections a committed
// transaction saw are remembered for the connection (none is ever
// dropped). Not done, and why: running fn first in a read transaction
// to learn all its reads (its random keys too) would run fn one extra
// time on every Update, and fn carries in-transaction appliers whose
// runs are observable (tests count them); validating a read-only prefix
// optimistically would conflict on the audit chain's head, which every
// write transaction moves.
//
// A forwarded Update writes a random marker in its own transaction
// (MarkerCollection, kept ten minutes). When the connection is lost after
// the forwarder sent its commit, the outcome is unknown (ErrOutcomeUnknown);
// the forwarder asks the next writer whether the marker is there
// (ReadBack, or Committed in its own Update when it became the writer)
// and runs the transaction again only when it is not, so a claim is never
// executed twice and never lost. Lost before the commit was sent
// (ErrWriterLost), the transaction certainly did not commit.
package forward
