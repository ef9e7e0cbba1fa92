-- The scheduler's durable state: what each queued batch is waiting as,
-- the clusters allocated (kept after release, as the allocation history),
-- and admin quota overrides.

-- 0 queued, 1 provisioned (holds its cluster), 2 expired, 3 rejected
-- (default mode without room), 4 released.
alter table batches add column provisioning integer not null default 0;
alter table batches add column priority integer not null default 0;
alter table batches add column zone text;
alter table batches add column allocate_time integer;

create index batches_queued on batches (provisioning, state);

-- One row per part of a cluster on one node. Rows are never deleted:
-- released_at marks the end, so overcommit can be audited over time.
create table allocations (
    id integer primary key autoincrement,
    batch_seq integer not null,
    node_id text not null,
    role text not null,
    -- JSON array of GPU addresses.
    gpus text not null,
    cores integer not null,
    memory_mb integer not null,
    local_ssd_gb integer not null,
    allocated_at integer not null,
    released_at integer
);

create index allocations_active on allocations (batch_seq) where released_at is null;
create index allocations_by_batch on allocations (batch_seq);

create table quota_overrides (
    project text not null,
    region text not null,
    metric text not null,
    quota_limit integer not null,
    updated_at integer not null,
    primary key (project, region, metric)
) without rowid;
