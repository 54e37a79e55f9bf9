-- oncommit: the keys table of ordered delivery holds the copies' keys too
-- (0007): its key column keeps the outbox's message_key type.
ALTER TABLE outbox_keys MODIFY message_key VARCHAR(320) NOT NULL
