-- oncommit: the message table, its claim index and its dedup index.
-- Usable as-is by golang-migrate with the default table name (goose needs
-- its annotations: docs/operations.md, Migrations); the Migrate helper of
-- dialect/postgres renames the table when configured.
CREATE TABLE outbox (
    id           uuid        PRIMARY KEY,
    topic        text        NOT NULL,
    message_key  text,
    payload      jsonb,
    headers      jsonb,
    dedup_key    text,
    state        text        NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'processing', 'delivered', 'dead')),
    attempts     integer     NOT NULL DEFAULT 0,
    available_at timestamptz NOT NULL DEFAULT now(),
    created_at   timestamptz NOT NULL DEFAULT now(),
    settled_at   timestamptz,
    last_error   text
);

-- Serves the claim: due rows in (available_at, id) order, live states only.
CREATE INDEX outbox_claim_idx ON outbox (available_at, id)
    WHERE state IN ('pending', 'processing');

-- Backs producer-side deduplication (INSERT ... ON CONFLICT DO NOTHING).
CREATE UNIQUE INDEX outbox_dedup_idx ON outbox (dedup_key)
    WHERE dedup_key IS NOT NULL;
