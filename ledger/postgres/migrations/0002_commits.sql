-- One row per write transaction, written in it: when the connection is
-- lost during COMMIT, the writer reads its row back (after taking the
-- writer lock, so the transaction has certainly ended) to learn whether
-- it committed, instead of guessing. Rows older than ten minutes are
-- deleted.
CREATE TABLE idemgate_commits (
    id text PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now()
);
