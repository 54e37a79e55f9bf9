-- oncommit: the inbox, the message ids each consumer has applied (see the
-- PostgreSQL file). Times are integer milliseconds since the Unix epoch.
CREATE TABLE inbox (
    consumer    TEXT    NOT NULL,
    message_id  TEXT    NOT NULL,
    received_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;

CREATE INDEX inbox_received_idx ON inbox (received_at);
