//! flexq's integration tests: one binary, real servers on port 0, real
//! SQLite files, real HTTP.

mod agents;
mod alternatives;
mod api;
mod architecture;
mod auth;
mod bad_input;
mod cli;
mod connections;
mod console;
mod cordon;
mod durability;
mod elastic;
mod fairshare;
mod full_disk;
mod gpus;
mod grpc;
mod hostile;
mod kubernetes;
mod loans;
mod metrics;
mod partition;
mod preemption;
mod prometheus;
mod proxy;
mod queues;
mod reload;
mod replicas;
mod requeue;
mod scheduler;
mod simulate;
mod spark;
mod support;
mod tls;
mod usage;
mod watch;
