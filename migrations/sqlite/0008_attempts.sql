-- Which attempt of the batch runs: 1, then one more each time an
-- infrastructure failure sent it back to the queue.
alter table batches add column attempt integer not null default 1;
