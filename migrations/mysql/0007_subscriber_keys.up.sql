-- oncommit: a subscriber's copy of a message (Config.Subscribers) stores
-- its subscriber (at most 64 bytes) and U+001F before the message's key
-- (at most 255 bytes) and dedup key (at most 512 bytes): the columns widen
-- to hold both. Other rows are unchanged.
ALTER TABLE outbox MODIFY message_key VARCHAR(320), MODIFY dedup_key VARBINARY(577)
