-- The order of write transactions that journal audit entries, taken in
-- each one's last round trip, after every lock it takes: a transaction
-- that read another's writes takes a greater value (see the package
-- documentation, "Locks"). The ledger's sealer chains journaled entries
-- in this order.
CREATE SEQUENCE idemgate_journal_order;
