-- Preemption (docs/rules.md#preemption). preempted_by: while a victim's
-- cluster stops, the seq of the batch it gives way to (null otherwise);
-- stop_grace_s: how long its processes have to stop before they are
-- killed; preemptions: how many times it was preempted (at the region's
-- max_preemptions it is never a victim again).
alter table batches add column preempted_by bigint;
alter table batches add column stop_grace_s bigint;
alter table batches add column preemptions bigint not null default 0;
