-- Provisioned capacity (docs/rules.md#provisioned-capacity). A set of new
-- nodes being created for one queued batch, all or nothing: `spec` is the
-- set as the core decided it (JSON: slots, shape, times, the batch's parts
-- on nodes that were there). `resumed_at` is when the resume program was
-- started (unix µs; null: not yet): it is never started twice for a set.
create table node_sets (
    seq integer primary key,
    region text not null,
    zone text not null,
    pool text not null,
    spec text not null,
    decided_at integer not null,
    resumed_at integer
);
-- Each slot of a set (state 0, seq its batch) and each node being
-- suspended (state 2): a node being suspended may not register.
create table node_slots (
    node_id text primary key,
    seq integer,
    state integer not null,
    region text not null,
    zone text not null,
    pool text not null
) without rowid;
create index node_slots_by_seq on node_slots (seq);
