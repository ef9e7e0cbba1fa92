-- Batches, their operations and request ids. One row per batch: the
-- operation of a batch is 1:1 with it, so its id lives here too.
create table batches (
    -- Insertion order: list pages are keyset-paginated on it, so page
    -- tokens stay stable while new batches arrive.
    seq integer primary key autoincrement,
    project text not null,
    region text not null,
    batch_id text not null,
    uuid text not null unique,
    operation_id text not null unique,
    request_id text,
    -- Times are unix microseconds, UTC.
    create_time integer not null,
    state integer not null,
    state_message text not null,
    state_time integer not null,
    creator text not null,
    -- The user's Batch (output-only fields removed), proto3 JSON.
    spec text not null,
    -- The validated ClusterRequest, JSON.
    cluster text not null,
    -- Allocation deadline of a queue-mode batch.
    deadline integer,
    -- batch_id first: the group-commit writer looks ids up with
    -- `batch_id in (...)` across projects and regions.
    unique (batch_id, project, region)
);

create unique index batches_request_id on batches (request_id, project, region)
    where request_id is not null;
-- Lists: newest first within a project and region.
create index batches_list on batches (project, region, seq);
create index batches_by_state on batches (state, region);

-- Every state transition, in order.
create table state_history (
    batch_seq integer not null references batches (seq) on delete cascade,
    idx integer not null,
    state integer not null,
    message text not null,
    start_time integer not null,
    primary key (batch_seq, idx)
) without rowid;
