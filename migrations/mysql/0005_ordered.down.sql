-- Blocked messages must first become plain pending ones (nothing is lost,
-- the order is): run UPDATE outbox SET state = 'pending' WHERE state =
-- 'blocked' before this file, which is one statement, as each is. MySQL
-- refuses to drop the ENUM value while a row holds it (strict mode).
ALTER TABLE outbox
    DROP KEY outbox_key_seq_idx,
    DROP COLUMN key_seq,
    MODIFY state ENUM('pending', 'processing', 'delivered', 'dead') CHARACTER SET ascii NOT NULL DEFAULT 'pending'
