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
pub mod mutants;
pub mod registry;
pub mod replication;
pub mod runtime;
pub mod state;
pub mod timers;
pub mod tls;

#[cfg(test)]
mod readme {
    use std::path::{Path, PathBuf};

    fn modules(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                modules(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }

    /// README's module map names every module of `src/` (test-only files aside), so it cannot
    /// fall behind the code.
    #[test]
    fn the_module_map_names_every_module() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let readme = include_str!("../README.md");
        let map = readme
            .split("### Module map")
            .nth(1)
            .and_then(|rest| rest.split("\n## ").next())
            .expect("README has a module map under Architecture");
        let mut files = Vec::new();
        modules(&root.join("src"), &mut files);
        let test_only = |p: &str| p.ends_with("/tests.rs") || p.contains("/tests/") || p.ends_with("/props.rs");
        for file in files {
            let rel = file.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if test_only(&rel) {
                continue;
            }
            assert!(map.contains(&format!("`{rel}`")), "README's module map lacks `{rel}`");
        }
    }
}
