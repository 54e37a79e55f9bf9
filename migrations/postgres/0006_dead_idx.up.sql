-- oncommit: serves the operators' listings of dead messages (outbox.List,
-- the CLI, the dashboard): dead rows in id order, whatever the number of
-- live and delivered rows. Partial, so only dead-lettering writes to it.
-- It scans the table once to build; on a large live table, build it first
-- without blocking writes (the same statement with CREATE INDEX
-- CONCURRENTLY, on its own): this file then creates nothing.
-- (Numbered 0006: 0005 is taken by ordered delivery.)
CREATE INDEX IF NOT EXISTS outbox_dead_idx ON outbox (id) WHERE state = 'dead';
