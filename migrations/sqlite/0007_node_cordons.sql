-- Nodes an admin cordoned (drain = 1: and waits for their running parts):
-- they take no new allocation.
create table node_cordons (
    node_id text primary key,
    cordoned_at integer not null,
    cordoned_by text not null,
    drain integer not null
) without rowid;
