-- Why a batch last went back to the queue (docs/api.md): 1 an
-- infrastructure failure, 2 a preemption; null while it never did.
-- Batches requeued before the column existed: a preempted one is taken
-- to have been requeued by its preemption, any other by the
-- infrastructure (the only two causes there are).
alter table batches add column requeue_reason bigint;
update batches set requeue_reason = case when preemptions > 0 then 2 else 1 end
 where attempt > 1;
