-- oncommit: ordered delivery per key (Config.OrderByKey).
-- key_seq is a message's place in its key's order, NULL for unordered
-- messages; state 'blocked' is an ordered message waiting behind its key's
-- head. The claim index's predicate, state IN ('pending', 'processing'),
-- never sees blocked rows, so claims stay bounded at any backlog.
ALTER TABLE outbox ADD COLUMN key_seq bigint;

-- The state check gains 'blocked': the old check (named by PostgreSQL
-- when 0001 created it) is found through its table and dropped.
-- +goose StatementBegin
DO $$
DECLARE c text;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
        WHERE conrelid = 'outbox'::regclass AND contype = 'c' AND pg_get_constraintdef(oid) LIKE '%state%'
    LOOP
        EXECUTE 'ALTER TABLE outbox DROP CONSTRAINT ' || quote_ident(c);
    END LOOP;
END
$$;
-- +goose StatementEnd
ALTER TABLE outbox ADD CONSTRAINT outbox_state_check
    CHECK (state IN ('pending', 'processing', 'delivered', 'dead', 'blocked')) NOT VALID;
ALTER TABLE outbox VALIDATE CONSTRAINT outbox_state_check;

-- Serves a claim's runs (the blocked messages after a head), promotion
-- (the next blocked message of a key), a key's head and its halted head
-- (redrive, skip). Delivered rows (KeepDelivered) are left out, so a hot
-- key's history does not lengthen the walk to its next message.
CREATE INDEX outbox_key_seq_idx ON outbox (message_key, key_seq)
    WHERE key_seq IS NOT NULL AND state IN ('pending', 'processing', 'blocked', 'dead');

-- One row per key published ordered: the last key_seq given, the key's
-- messages not settled for good (live), and the key_seq of a head dead
-- under the Halt policy (the key waits for a redrive or a skip).
CREATE TABLE outbox_keys (
    message_key text   PRIMARY KEY,
    last_seq    bigint NOT NULL,
    live        bigint NOT NULL,
    halted_seq  bigint
);
