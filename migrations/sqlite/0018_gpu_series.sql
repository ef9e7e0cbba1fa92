-- A batch's GPU utilization over time, for its page's chart
-- (docs/rules.md#gpu-telemetry): JSON of at most 120 slots, whose width
-- doubles as the run grows longer. One row per batch, for its current
-- run: a requeue and a delete remove it.
create table gpu_series (
    batch_seq integer primary key,
    series text not null
);
