DROP INDEX IF EXISTS outbox_settled_idx;
