-- The durable event log the watch stream serves (GET ...:watch): one row
-- per state-history entry and per stored chunk of driver output, written
-- by triggers in the transaction that writes them. Writers are serialized
-- on SQLite, so ids grow in commit order: the id is the cursor.
create table events (
    id integer primary key autoincrement,
    batch_seq integer not null,
    batch_id text not null,
    project text not null,
    region text not null,
    -- 1: a state-history entry; 2: driver output stored; 3: the batch
    -- was deleted.
    kind integer not null,
    at integer not null
);
create index events_scope on events (project, region, id);
create index events_batch on events (batch_seq, id);

create trigger events_of_history after insert on state_history begin
    insert into events (batch_seq, batch_id, project, region, kind, at)
    select new.batch_seq, batch_id, project, region, 1, new.start_time from batches where seq = new.batch_seq;
end;

create trigger events_of_output after insert on batch_output begin
    insert into events (batch_seq, batch_id, project, region, kind, at)
    select new.batch_seq, batch_id, project, region, 2, cast((julianday('now') - 2440587.5) * 86400000000 as integer)
    from batches where seq = new.batch_seq;
end;

create trigger events_of_delete after delete on batches begin
    insert into events (batch_seq, batch_id, project, region, kind, at)
    values (old.seq, old.batch_id, old.project, old.region, 3, cast((julianday('now') - 2440587.5) * 86400000000 as integer));
end;
