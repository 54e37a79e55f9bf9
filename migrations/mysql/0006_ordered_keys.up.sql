-- oncommit: one row per key published ordered (Config.OrderByKey): the
-- last key_seq given, the key's messages not settled for good (live, a
-- halted head included), and the key_seq of a head dead under the Halt
-- policy (the key waits for a redrive or a skip). A publish takes its keys'
-- rows in key order and holds their locks to its commit, so publishers of
-- one key serialise and key_seq order is commit order. The key column has
-- the outbox's message_key type and collation.
CREATE TABLE outbox_keys (
    message_key VARCHAR(255) NOT NULL,
    last_seq    BIGINT       NOT NULL,
    live        BIGINT       NOT NULL,
    halted_seq  BIGINT,
    PRIMARY KEY (message_key)
) ENGINE = InnoDB DEFAULT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
