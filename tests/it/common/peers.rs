//! Where the real test peers are: the environment, else the `.peers/env` file written by
//! `tests/peers/setup`. In CI (`EUREKA_PEERS_REQUIRED=1` or `CI` set) a missing peer fails the test;
//! elsewhere the test is skipped with a message saying how to get the peers.

use std::{collections::HashMap, path::PathBuf, sync::OnceLock};

fn env_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".peers/env")
}

/// `export KEY=VALUE` lines of `.peers/env`.
fn file_vars() -> &'static HashMap<String, String> {
    static VARS: OnceLock<HashMap<String, String>> = OnceLock::new();
    VARS.get_or_init(|| {
        let Ok(text) = std::fs::read_to_string(env_file()) else {
            return HashMap::new();
        };
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
            .collect()
    })
}

/// Whether missing peers must fail the run instead of skipping.
pub fn required() -> bool {
    std::env::var("EUREKA_PEERS_REQUIRED").is_ok_and(|v| v == "1")
        || std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false")
}

/// The value of a peer variable, if set and pointing at something that exists.
pub fn lookup(name: &str) -> Option<String> {
    let value = std::env::var(name).ok().or_else(|| file_vars().get(name).cloned())?;
    std::path::Path::new(&value).exists().then_some(value)
}

/// The peer variable `name`, or `None` after printing why the test is skipped. Panics in CI.
pub fn require(name: &str, test: &str) -> Option<String> {
    if let Some(v) = lookup(name) {
        return Some(v);
    }
    let msg = format!(
        "test peer `{name}` is missing (looked in the environment and {}); run `tests/peers/setup` to install every peer",
        env_file().display()
    );
    if required() {
        panic!("{msg}");
    }
    eprintln!("SKIPPED {test}: {msg}");
    None
}

/// `let v = require_peer!("NAME");` returns from the test (skip) when the peer is missing.
#[macro_export]
macro_rules! require_peer {
    ($name:expr) => {
        match $crate::common::peers::require($name, module_path!()) {
            Some(v) => v,
            None => return,
        }
    };
}
