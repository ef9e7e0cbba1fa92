-- Whether the lease holder held the leader lock (a session-level advisory
-- lock) on the session it last renewed through. While it does, a replica
-- that gets the lock knows that session ended (a crash ends it at once)
-- and may take the lease before it lapses (src/store/leader_lock.rs).
alter table leader_lease add column locked boolean not null default false;
