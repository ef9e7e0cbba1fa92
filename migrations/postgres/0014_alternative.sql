-- The placement alternative ("rung") a batch's cluster was allocated on:
-- null for its own placement (and for batches allocated before rungs
-- existed), 1 and up for the rungs its stored cluster request lists. Set
-- with the allocation, cleared when a failure of the infrastructure
-- requeues the batch.
alter table batches add column alternative integer;
