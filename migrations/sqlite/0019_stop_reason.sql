-- Why a batch being stopped for another goes back to the queue once it has
-- stopped (docs/api.md): 2 a preemption, 3 a loan reclaimed by its
-- owners; null while it is not stopping, or since before the column (a
-- preemption then).
alter table batches add column stop_reason integer;
