-- oncommit: attempts_base is attempts when the message was last redriven (0
-- if never). Redrive keeps attempts, so (id, attempts) never repeats and a
-- stale relay's late outcome cannot match a claim made after the redrive;
-- the attempt a handler sees, and the one max attempts bounds, is
-- attempts - attempts_base. Added last, with a constant default: an instant
-- change on MySQL 8 and MariaDB 10.3+.
ALTER TABLE outbox ADD COLUMN attempts_base INT NOT NULL DEFAULT 0
