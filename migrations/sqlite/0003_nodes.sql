-- Nodes registered by executor agents. The epoch is the fencing token: it
-- changes at every registration and when the lease is lost, so a report
-- carrying an older epoch comes from an agent that no longer holds the node.
create table nodes (
    node_id text primary key,
    region text not null,
    zone text not null,
    pool text not null,
    -- NodeSpec JSON: GPU addresses, cores, memory, local SSD.
    spec text not null,
    epoch integer not null,
    -- 0 active, 1 lost.
    state integer not null,
    registered_at integer not null
) without rowid;
