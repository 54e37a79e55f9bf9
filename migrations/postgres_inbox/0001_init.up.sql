-- oncommit: the inbox, the message ids each consumer has applied. A row is
-- written in the consumer's own transaction, beside its effect; the primary
-- key turns a redelivered id into a no-op (INSERT ... ON CONFLICT DO
-- NOTHING). received_at serves the purge of ids older than the retention.
CREATE TABLE inbox (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX inbox_received_idx ON inbox (received_at);
