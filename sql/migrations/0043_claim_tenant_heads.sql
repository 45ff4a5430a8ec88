-- Fair claim: the due predicate of index_task_due_idx, per tenant, so the claim can take each tenant's
-- oldest due task (a loose index scan over tenants) before anyone's second: two tenants' bulk backlogs no
-- longer hold a third tenant's one task until they drain (issue #31, finding 8).
CREATE INDEX index_task_tenant_due_idx ON index_task (tenant_id, next_attempt_at)
    WHERE status IN ('PENDING', 'RETRY_WAIT') AND (task_type = 'INDEX' OR attempts > 0);
