ALTER TABLE outbox DROP COLUMN attempts_base
