-- A row a replica writes while its last write found the disk full, to see
-- space come back without waiting for a client's write (Store::probe_write).
create table store_probe (
    id integer primary key,
    written text not null
);
