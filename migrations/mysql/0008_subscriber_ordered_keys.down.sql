-- Fails while a stored copy's key is longer than before.
ALTER TABLE outbox_keys MODIFY message_key VARCHAR(255) NOT NULL
