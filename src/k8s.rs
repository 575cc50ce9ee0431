//! Everything that talks to Kubernetes lives under this module: the `EurekaApp` resource, the
//! Pod index fed by watches, the pure plan from (EurekaApp, pods) to instances, the reconciler
//! that applies plans to the registry, the leader-gated writers of statuses, Events and
//! annotations, and the Lease election.

pub mod controller;
pub mod crd;
pub mod index;
pub mod lease;
pub mod peers;
pub mod plan;
pub mod pods;
pub mod status;
