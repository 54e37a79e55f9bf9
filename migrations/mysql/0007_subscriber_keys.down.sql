-- Fails while a stored copy's key or dedup key is longer than before.
ALTER TABLE outbox MODIFY message_key VARCHAR(255), MODIFY dedup_key VARBINARY(512)
