DROP TRIGGER IF EXISTS outbox_seq_trg;
DROP TABLE IF EXISTS outbox_keys;
-- Blocked messages become plain pending ones: nothing is lost, the order is.
CREATE TABLE outbox_rebuild (
    id            TEXT    NOT NULL PRIMARY KEY,
    topic         TEXT    NOT NULL,
    message_key   TEXT,
    payload       TEXT    CHECK (payload IS NULL OR json_valid(payload)),
    headers       TEXT    CHECK (headers IS NULL OR json_valid(headers)),
    dedup_key     TEXT,
    state         TEXT    NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'processing', 'delivered', 'dead')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    available_at  INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    created_at    INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    settled_at    INTEGER,
    last_error    TEXT,
    attempts_base INTEGER NOT NULL DEFAULT 0
);
INSERT INTO outbox_rebuild (rowid, id, topic, message_key, payload, headers, dedup_key, state, attempts, available_at, created_at, settled_at, last_error, attempts_base)
    SELECT rowid, id, topic, message_key, payload, headers, dedup_key, CASE WHEN state = 'blocked' THEN 'pending' ELSE state END,
        attempts, available_at, created_at, settled_at, last_error, attempts_base FROM outbox;
DROP TABLE outbox;
ALTER TABLE outbox_rebuild RENAME TO outbox;
CREATE INDEX outbox_claim_idx ON outbox (available_at, id) WHERE state IN ('pending', 'processing');
CREATE UNIQUE INDEX outbox_dedup_idx ON outbox (dedup_key) WHERE dedup_key IS NOT NULL;
CREATE INDEX outbox_settled_idx ON outbox (settled_at) WHERE state IN ('delivered', 'dead');
