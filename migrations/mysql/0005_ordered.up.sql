-- oncommit: ordered delivery per key (Config.OrderByKey), in one statement
-- (each file is one). key_seq is a message's place in its key's order, NULL
-- for unordered messages; state 'blocked' is an ordered message waiting
-- behind its key's head. claim_at is NULL for blocked rows (it is set only
-- for pending and processing ones), so the claim index never sees them and
-- claims stay bounded at any backlog. The key index serves a claim's runs
-- (a key's blocked messages after its head), promotion (a key's first
-- blocked message), redrive and skip; it leaves state out, so claims and
-- settles, which change state, never move its entries (MySQL and MariaDB
-- have no partial index: every row with a key is in it). Delivered rows
-- kept by KeepDelivered lose their key_seq, so a hot key's history never
-- lengthens the walk to its next message. The ENUM gains a value at its
-- end (a change of metadata only). Then apply 0006, the table of keys.
ALTER TABLE outbox
    ADD COLUMN key_seq BIGINT,
    MODIFY state ENUM('pending', 'processing', 'delivered', 'dead', 'blocked') CHARACTER SET ascii NOT NULL DEFAULT 'pending',
    ADD KEY outbox_key_seq_idx (message_key, key_seq)
