CREATE INDEX IF NOT EXISTS outbox_claim_idx ON outbox (available_at, id)
    WHERE state IN ('pending', 'processing');
DROP INDEX IF EXISTS outbox_topic_claim_idx;
