-- The durable event log the watch stream serves (GET ...:watch): one row
-- per state-history entry and per stored chunk of driver output, written
-- by triggers in the transaction that writes them. Replicas commit creates
-- in parallel, so ids are not in commit order: readers take only events
-- of transactions older than every running one (tx below the snapshot's
-- xmin) and page by (tx, id), which is in commit-visibility order.
create table events (
    id bigserial primary key,
    tx xid8 not null default pg_current_xact_id(),
    batch_seq bigint not null,
    batch_id text not null,
    project text not null,
    region text not null,
    -- 1: a state-history entry; 2: driver output stored; 3: the batch
    -- was deleted.
    kind integer not null,
    at bigint not null
);
create index events_order on events (tx, id);
create index events_scope on events (project, region, tx, id);
create index events_batch on events (batch_seq, tx, id);

create function flexq_event_of_history() returns trigger language plpgsql as $$
begin
    insert into events (batch_seq, batch_id, project, region, kind, at)
    select new.batch_seq, b.batch_id, b.project, b.region, 1, new.start_time from batches b where b.seq = new.batch_seq;
    return null;
end
$$;
create trigger events_of_history after insert on state_history
    for each row execute function flexq_event_of_history();

create function flexq_event_of_output() returns trigger language plpgsql as $$
begin
    insert into events (batch_seq, batch_id, project, region, kind, at)
    select new.batch_seq, b.batch_id, b.project, b.region, 2,
           (extract(epoch from clock_timestamp()) * 1000000)::bigint
    from batches b where b.seq = new.batch_seq;
    return null;
end
$$;
create trigger events_of_output after insert on batch_output
    for each row execute function flexq_event_of_output();

create function flexq_event_of_delete() returns trigger language plpgsql as $$
begin
    insert into events (batch_seq, batch_id, project, region, kind, at)
    values (old.seq, old.batch_id, old.project, old.region, 3, (extract(epoch from clock_timestamp()) * 1000000)::bigint);
    return null;
end
$$;
create trigger events_of_delete after delete on batches
    for each row execute function flexq_event_of_delete();
