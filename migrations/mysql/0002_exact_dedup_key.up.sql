-- oncommit: dedup keys compare byte for byte. utf8mb4_bin is a PAD SPACE
-- collation on MySQL and MariaDB ('k' = 'k '), so the UNIQUE index of 0001
-- took a key for a duplicate of the same key without its trailing spaces.
-- VARBINARY compares every byte, on both servers; the keys are at most 512
-- bytes (outbox.MaxDedupKeyBytes). The index is rebuilt with the column.
ALTER TABLE outbox MODIFY dedup_key VARBINARY(512)
