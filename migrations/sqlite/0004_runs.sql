-- What executor agents report about running work.

-- The per-batch Spark master, once the driver's agent started it.
alter table batches add column master_url text;
-- JSON: the run as agents reported it (driver node, RAPIDS Accelerator
-- status, exit code, output size).
alter table batches add column run_info text;

-- The driver's output, as the driver's agent uploads it: chunks at byte
-- offsets, contiguous from 0.
create table batch_output (
    batch_seq integer not null,
    byte_offset integer not null,
    data blob not null,
    primary key (batch_seq, byte_offset)
) without rowid;
