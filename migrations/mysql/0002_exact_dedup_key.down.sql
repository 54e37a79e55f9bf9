-- Fails when two stored keys differ only by trailing spaces.
ALTER TABLE outbox MODIFY dedup_key VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
