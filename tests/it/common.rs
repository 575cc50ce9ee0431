//! Test support shared by the integration tests: real peers (Kubernetes control plane, Java Eureka
//! server and client, Python and Node clients, the other client generations), processes that never outlive the tests, and waits.
#![allow(dead_code, unused_macros, unused_imports)]

pub mod browser;
pub mod clients;
pub mod cluster;
pub mod eureka;
pub mod mesh;
pub mod operator;
pub mod peers;
pub mod process;
pub mod proxy;
pub mod real_nodes;
pub mod rng;
