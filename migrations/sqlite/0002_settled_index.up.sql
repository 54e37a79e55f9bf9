-- Serves purge: terminal rows by the time they were settled.
CREATE INDEX outbox_settled_idx ON outbox (settled_at)
    WHERE state IN ('delivered', 'dead');
