ALTER TABLE outbox DROP COLUMN IF EXISTS attempts_base;
