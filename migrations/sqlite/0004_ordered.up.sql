-- oncommit: ordered delivery per key (Config.OrderByKey).
-- key_seq is a message's place in its key's order, NULL for unordered
-- messages; state 'blocked' is an ordered message waiting behind its key's
-- head. The claim index's predicate, state IN ('pending', 'processing'),
-- never sees blocked rows, so claims stay bounded at any backlog.
--
-- SQLite cannot change a CHECK constraint in place, so the table is
-- rebuilt with the state check that admits 'blocked' (SQLite's documented
-- procedure: create, copy, drop, rename, index), in the migration's one
-- transaction. The rebuild drops every index and trigger of the old
-- table: this file recreates oncommit's (the dead index of 0005 too, for
-- a database that had 0005 before this); recreate any of your own.
CREATE TABLE outbox_rebuild (
    id            TEXT    NOT NULL PRIMARY KEY,
    topic         TEXT    NOT NULL,
    message_key   TEXT,
    payload       TEXT    CHECK (payload IS NULL OR json_valid(payload)),
    headers       TEXT    CHECK (headers IS NULL OR json_valid(headers)),
    dedup_key     TEXT,
    state         TEXT    NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'processing', 'delivered', 'dead', 'blocked')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    available_at  INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    created_at    INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    settled_at    INTEGER,
    last_error    TEXT,
    attempts_base INTEGER NOT NULL DEFAULT 0,
    key_seq       INTEGER
);
INSERT INTO outbox_rebuild (rowid, id, topic, message_key, payload, headers, dedup_key, state, attempts, available_at, created_at, settled_at, last_error, attempts_base)
    SELECT rowid, id, topic, message_key, payload, headers, dedup_key, state, attempts, available_at, created_at, settled_at, last_error, attempts_base FROM outbox;
DROP TABLE outbox;
ALTER TABLE outbox_rebuild RENAME TO outbox;
CREATE INDEX outbox_claim_idx ON outbox (available_at, id) WHERE state IN ('pending', 'processing');
CREATE UNIQUE INDEX outbox_dedup_idx ON outbox (dedup_key) WHERE dedup_key IS NOT NULL;
CREATE INDEX outbox_settled_idx ON outbox (settled_at) WHERE state IN ('delivered', 'dead');
CREATE INDEX IF NOT EXISTS outbox_dead_idx ON outbox (id) WHERE state = 'dead';

-- Serves a claim's runs (a key's blocked messages after its head, in
-- key_seq order), promotion (a key's first blocked message), a key's head
-- (pending or processing) and its halted head (dead at halted_seq): each
-- one range of (message_key, state), whatever the key's backlog. Queries
-- name key_seq IS NOT NULL (or compare key_seq), so SQLite may use the
-- partial index.
CREATE INDEX outbox_key_seq_idx ON outbox (message_key, state, key_seq) WHERE key_seq IS NOT NULL;

-- One row per key published ordered: the last key_seq given, the key's
-- messages not settled for good (live, a halted head included), and the
-- key_seq of a head dead under the Halt policy (the key waits for a
-- redrive or a skip).
CREATE TABLE outbox_keys (
    message_key TEXT    NOT NULL PRIMARY KEY,
    last_seq    INTEGER NOT NULL,
    live        INTEGER NOT NULL,
    halted_seq  INTEGER
);

-- Numbers ordered messages as they are stored: Insert stores a message of
-- an Outbox with OrderByKey in state 'blocked' with no key_seq, and for
-- each such row, in the statement's row order, this trigger takes the
-- next number of its key and makes it the key's head (pending) when the
-- key had no live message. It runs inside the publisher's INSERT, under
-- the write lock SQLite's one writer holds until the publisher's commit,
-- so key_seq order is commit order and a rollback takes the numbers back;
-- a row that ON CONFLICT DO NOTHING skipped (a duplicate DedupKey) is not
-- stored, so it is neither numbered nor counted. Unordered messages are
-- stored 'pending' and never match the WHEN clause.
CREATE TRIGGER outbox_seq_trg AFTER INSERT ON outbox
WHEN NEW.state = 'blocked' AND NEW.key_seq IS NULL
BEGIN
    INSERT INTO outbox_keys (message_key, last_seq, live) VALUES (NEW.message_key, 1, 1)
        ON CONFLICT (message_key) DO UPDATE SET last_seq = last_seq + 1, live = live + 1;
    UPDATE outbox SET (key_seq, state) = (
        SELECT ks.last_seq, CASE WHEN ks.live = 1 THEN 'pending' ELSE 'blocked' END
        FROM outbox_keys ks WHERE ks.message_key = NEW.message_key)
    WHERE rowid = NEW.rowid;
END;
