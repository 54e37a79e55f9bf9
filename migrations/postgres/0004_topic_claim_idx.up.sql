-- oncommit: the claim index leads with the topic. A claim reads only the
-- due rows of its relay's topics, one index range per topic in
-- (available_at, id) order, never the rows of other topics ahead of them.
-- It replaces outbox_claim_idx (available_at, id), so every publish and
-- claim still writes one claim index entry. On a large live table, build
-- it first without blocking writes (postgres.TopicIndexSQL: CREATE INDEX
-- CONCURRENTLY IF NOT EXISTS of this very index); this file then only
-- drops the old index.
CREATE INDEX IF NOT EXISTS outbox_topic_claim_idx ON outbox (topic, available_at, id)
    WHERE state IN ('pending', 'processing');

-- The old index, found through its table (in the table's schema, whatever
-- the search_path). goose runs the block as one statement.
-- +goose StatementBegin
DO $$
DECLARE old regclass;
BEGIN
    SELECT i.indexrelid::regclass INTO old FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE i.indrelid = 'outbox'::regclass AND c.relname = 'outbox_claim_idx';
    IF old IS NOT NULL THEN
        EXECUTE 'DROP INDEX ' || old::text;
    END IF;
END
$$;
-- +goose StatementEnd
