-- oncommit: the message table, its claim index, its dedup index and its
-- purge index, in one statement (MySQL runs DDL outside transactions).
-- Times are UTC DATETIME(6) from the database clock (UTC_TIMESTAMP(6)).
-- Ids are the canonical UUID text of a ULID, so they sort by time and read
-- back as the id a handler sees. JSON is a native type on MySQL 8 and a
-- LONGTEXT checked with JSON_VALID on MariaDB.
-- claim_at is available_at for live rows (pending, processing) and NULL for
-- terminal ones (delivered, dead): MySQL and MariaDB have no partial index,
-- and an index on (claim_at, id) holds the live rows in claim order, the
-- NULLs out of the way of the claim's range (claim_at <= now).
-- A UNIQUE index allows any number of NULLs, so messages without a dedup key
-- never conflict: the equivalent of PostgreSQL's partial unique index.
CREATE TABLE outbox (
    id           CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    topic        VARCHAR(255) NOT NULL,
    message_key  VARCHAR(255),
    payload      JSON,
    headers      JSON,
    dedup_key    VARCHAR(512),
    state        ENUM('pending', 'processing', 'delivered', 'dead') CHARACTER SET ascii NOT NULL DEFAULT 'pending',
    attempts     INT          NOT NULL DEFAULT 0,
    available_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    created_at   DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    settled_at   DATETIME(6),
    last_error   TEXT,
    claim_at     DATETIME(6)  AS (CASE WHEN state IN ('pending', 'processing') THEN available_at END) STORED,
    PRIMARY KEY (id),
    UNIQUE KEY outbox_dedup_idx (dedup_key),
    KEY outbox_claim_idx (claim_at, id),
    KEY outbox_settled_idx (settled_at)
) ENGINE = InnoDB DEFAULT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
