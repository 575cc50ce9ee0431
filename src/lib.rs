//! eureka-operator: a Netflix Eureka registry and a Kubernetes operator in one process.
//!
//! * [`registry`] is the pure Eureka state machine (no I/O, no clock, no tasks);
//! * [`codec`] reads and writes Eureka's JSON, XML and replication batches;
//! * [`state`] holds the registry behind one short lock, the response [`cache`] and the write listeners;
//! * [`api`] adapts HTTP to it; [`metrics`] exposes what it does;
//! * [`runtime`] builds the process from [`config`].
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod api;
pub mod cache;
pub mod codec;
pub mod config;
pub mod health;
pub mod k8s;
pub mod metrics;
pub mod registry;
pub mod replication;
pub mod runtime;
pub mod state;
pub mod timers;
pub mod tls;
