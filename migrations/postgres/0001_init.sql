-- The PostgreSQL schema: the tables of migrations/sqlite/0001..0005 in
-- one step, plus the leader lease of several replicas. Times are unix
-- microseconds (bigint), as on SQLite, so both backends run the same
-- statements; JSON documents are text.

create table batches (
    -- Insertion order: list pages are keyset-paginated on it. Creates of
    -- several replicas commit concurrently, so seqs are not quite in
    -- commit order: a create's announcement names its seq range.
    seq bigint generated always as identity primary key,
    project text not null,
    region text not null,
    batch_id text not null,
    uuid text not null unique,
    operation_id text not null unique,
    request_id text,
    create_time bigint not null,
    state bigint not null,
    state_message text not null,
    state_time bigint not null,
    creator text not null,
    -- The user's Batch (output-only fields removed), proto3 JSON.
    spec text not null,
    -- The validated ClusterRequest, JSON.
    cluster text not null,
    deadline bigint,
    -- 0 queued, 1 provisioned, 2 expired, 3 rejected, 4 released.
    provisioning bigint not null default 0,
    priority integer not null default 0,
    zone text,
    allocate_time bigint,
    master_url text,
    run_info text,
    unique (batch_id, project, region)
);

create unique index batches_request_id on batches (request_id, project, region)
    where request_id is not null;
create index batches_list on batches (project, region, seq);
create index batches_by_state on batches (state, region);
-- Queued batches, and the new ones of a create's announcement (a seq
-- range): every replica reads those at each create group.
create index batches_queued on batches (provisioning, state, seq);

create table state_history (
    batch_seq bigint not null references batches (seq) on delete cascade,
    idx bigint not null,
    state bigint not null,
    message text not null,
    start_time bigint not null,
    primary key (batch_seq, idx)
);

-- One row per part of a cluster on one node, never deleted: released_at
-- marks the end, so overcommit can be audited over time.
create table allocations (
    id bigint generated always as identity primary key,
    batch_seq bigint not null,
    node_id text not null,
    role text not null,
    gpus text not null,
    cores bigint not null,
    memory_mb bigint not null,
    local_ssd_gb bigint not null,
    allocated_at bigint not null,
    released_at bigint
);

create index allocations_active on allocations (batch_seq) where released_at is null;
create index allocations_by_batch on allocations (batch_seq);
create index allocations_node_active on allocations (node_id) where released_at is null;

create table quota_overrides (
    project text not null,
    region text not null,
    metric text not null,
    quota_limit bigint not null,
    updated_at bigint not null,
    primary key (project, region, metric)
);

create table nodes (
    node_id text primary key,
    region text not null,
    zone text not null,
    pool text not null,
    spec text not null,
    epoch bigint not null,
    state bigint not null,
    registered_at bigint not null
);

create table batch_output (
    batch_seq bigint not null,
    byte_offset bigint not null,
    data bytea not null,
    primary key (batch_seq, byte_offset)
);

-- Which replica runs the scheduler. The term is the fencing token: it
-- grows at every change of holder, and the scheduler's commits check it
-- under the write lock, so a replica that lost the lease cannot commit.
-- expires_at is on the database's clock (microseconds), not a replica's.
create table leader_lease (
    id integer primary key check (id = 1),
    holder text not null,
    term bigint not null,
    expires_at bigint not null
);
insert into leader_lease (id, holder, term, expires_at) values (1, '', 0, 0);

-- Every term: who led from when (for operators and the failover audit).
create table leader_terms (
    term bigint primary key,
    holder text not null,
    started_at bigint not null
);
