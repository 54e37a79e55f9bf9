DROP INDEX IF EXISTS outbox_dead_idx;
