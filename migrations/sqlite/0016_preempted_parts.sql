-- A part given back because its batch was preempted: the GPU-time it held
-- is work lost, which the usage report counts to its project.
alter table allocations add column preempted integer not null default 0;
