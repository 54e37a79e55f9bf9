DROP TABLE IF EXISTS outbox_keys;
DROP INDEX IF EXISTS outbox_key_seq_idx;
-- Blocked messages become plain pending ones: nothing is lost, the order is.
UPDATE outbox SET state = 'pending' WHERE state = 'blocked';
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_state_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_state_check
    CHECK (state IN ('pending', 'processing', 'delivered', 'dead'));
ALTER TABLE outbox DROP COLUMN IF EXISTS key_seq;
