-- oncommit: the claim index leads with the topic, so a claim reads only its
-- own topics' due rows, in (claim_at, id) order per topic, whatever backlog
-- other topics have. It keeps its name (the claim names it in FORCE INDEX).
ALTER TABLE outbox DROP KEY outbox_claim_idx, ADD KEY outbox_claim_idx (topic, claim_at, id)
