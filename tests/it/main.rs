//! The integration tests, as one test binary (one link instead of one per file): black-box API
//! tests, real Eureka clients and servers, the operator against a real kube-apiserver, HA and
//! faults. Shared support lives in [`common`].

mod common;

mod adopt;
mod api;
mod chart;
mod chart_install;
mod client_generations;
mod clients;
mod controller;
mod dashboard;
mod differential;
mod examples;
mod faults;
mod fuzz_replay;
mod ha;
mod hardening_http;
mod hostile;
mod installed;
mod java_peering;
mod lifecycle;
mod links;
mod migration;
mod multicluster;
mod peers_eureka;
mod peers_kubernetes;
mod prometheus;
mod readiness_gate;
mod scale;
mod soak;
mod tls;
