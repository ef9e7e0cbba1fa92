-- Where each part of a cluster was held and on which GPU type: the
-- allocation's region (a region rung's, not the batch's own) and the
-- GPUs' type (a rung's type, not the one the batch asked for), so usage
-- is charged to what was really held. Older rows take the batch's region;
-- their type stays null and is read from the batch's stored shape.
alter table allocations add column region text;
alter table allocations add column accelerator text;
update allocations set region = (select b.region from batches b where b.seq = allocations.batch_seq);
