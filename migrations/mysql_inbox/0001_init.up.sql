-- oncommit: the inbox, the message ids each consumer has applied (see the
-- PostgreSQL file), in one statement. VARBINARY compares every byte (the
-- utf8mb4_bin collations ignore trailing spaces); the lengths are
-- outbox.MaxInboxConsumerBytes and outbox.MaxInboxIDBytes. Times are UTC.
CREATE TABLE inbox (
    consumer    VARBINARY(128) NOT NULL,
    message_id  VARBINARY(255) NOT NULL,
    received_at DATETIME(6)    NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer, message_id),
    KEY inbox_received_idx (received_at)
) ENGINE = InnoDB
