-- Queues an admin held: nothing in them is allocated until resumed.
-- project '' holds every project's queue of the region.
create table queue_holds (
    region text not null,
    project text not null,
    held_at integer not null,
    held_by text not null,
    primary key (region, project)
) without rowid;
