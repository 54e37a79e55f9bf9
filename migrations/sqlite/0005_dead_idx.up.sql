-- oncommit: serves the operators' listings of dead messages (outbox.List,
-- the CLI, the dashboard): dead rows in id order, whatever the number of
-- live and delivered rows. Partial, so only dead-lettering writes to it.
-- (Numbered 0005: 0004 is ordered delivery, which recreates this index
-- when it runs after this file on an older database: its rebuild of the
-- table drops every index.)
CREATE INDEX IF NOT EXISTS outbox_dead_idx ON outbox (id) WHERE state = 'dead';
