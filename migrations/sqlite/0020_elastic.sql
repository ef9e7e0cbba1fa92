-- Elastic batches (docs/rules.md#elastic-batches): a part granted beyond
-- the core gang, one executor at a time, is an extra (1); the core's parts
-- are 0. An extra's allocated_at is its grant.
alter table allocations add column extra integer not null default 0;
-- How many executors beyond its core Spark of the batch wants, as its
-- driver's agent last reported (null: never reported).
alter table batches add column extras_wanted integer;
