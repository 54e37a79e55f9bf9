ALTER TABLE outbox DROP KEY outbox_claim_idx, ADD KEY outbox_claim_idx (claim_at, id)
