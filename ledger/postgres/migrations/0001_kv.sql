-- The ledger's collections as one ordered key-value table. Keys are bytea,
-- which PostgreSQL orders bytewise (memcmp, a prefix first), the order the
-- ledger's indexes need; the primary key is the index every Get, Seek and
-- ordered walk uses.
CREATE TABLE idemgate_kv (
    collection text COLLATE "C" NOT NULL,
    key        bytea NOT NULL,
    value      bytea NOT NULL,
    PRIMARY KEY (collection, key)
);

-- The downstreams' data collections that exist (BTx.Data without create
-- tells a collection never written from an empty one).
CREATE TABLE idemgate_collections (
    name text COLLATE "C" PRIMARY KEY
);
