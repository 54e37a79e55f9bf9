-- oncommit: the message table, its claim index and its dedup index.
-- Times are integer milliseconds since the Unix epoch, from the database
-- clock. Ids are the canonical UUID text of a ULID, so they sort by time.
CREATE TABLE outbox (
    id           TEXT    NOT NULL PRIMARY KEY,
    topic        TEXT    NOT NULL,
    message_key  TEXT,
    payload      TEXT    CHECK (payload IS NULL OR json_valid(payload)),
    headers      TEXT    CHECK (headers IS NULL OR json_valid(headers)),
    dedup_key    TEXT,
    state        TEXT    NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'processing', 'delivered', 'dead')),
    attempts     INTEGER NOT NULL DEFAULT 0,
    available_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    created_at   INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    settled_at   INTEGER,
    last_error   TEXT
);

-- Serves the claim: due rows in (available_at, id) order, live states only.
CREATE INDEX outbox_claim_idx ON outbox (available_at, id)
    WHERE state IN ('pending', 'processing');

-- Backs producer-side deduplication (INSERT ... ON CONFLICT DO NOTHING).
CREATE UNIQUE INDEX outbox_dedup_idx ON outbox (dedup_key)
    WHERE dedup_key IS NOT NULL;
