-- Boot times of provisioned pools (docs/rules.md#provisioned-capacity):
-- one row per completed set, from its decision to its allocation (unix
-- µs, and the boot in ms). A pool's boot time is the p90 of its last 64;
-- older rows are pruned as new ones come.
create table pool_boots (
    region text not null,
    zone text not null,
    pool text not null,
    completed_at bigint not null,
    boot_ms bigint not null
);
create index pool_boots_by_pool on pool_boots (region, zone, pool, completed_at);
