//! eureka-operator: a Netflix Eureka registry and a Kubernetes operator in one process.
//!
//! * [`registry`] is the pure Eureka state machine (no I/O, no clock, no tasks);
//! * [`codec`] reads and writes Eureka's JSON, XML and replication batches;
//! * [`state`] holds the registry behind one short lock, the response [`cache`] and the write listeners;
//! * [`api`] adapts HTTP to it; [`metrics`] exposes what it does;
//! * [`runtime`] builds the process from [`config`].
// One exception, in `memory`: the call to glibc's `malloc_trim`.
#![deny(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod api;
pub mod cache;
pub mod codec;
pub mod config;
pub mod health;
pub mod k8s;
pub mod leadership;
pub mod links;
pub mod memory;
pub mod metrics;
pub mod mutants;
pub mod registry;
pub mod replication;
pub mod runtime;
pub mod state;
pub mod supervisor;
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

    /// The layers, bottom up: a module may use its own layer and those below, never one above.
    /// README's module map shows the same table.
    pub(crate) const LAYERS: &[(&str, u8)] = &[
        ("registry", 1),
        ("mutants", 1),
        ("codec", 2),
        ("health", 3),
        ("tls", 3),
        ("supervisor", 3),
        ("memory", 3),
        ("leadership", 3),
        ("state", 4),
        ("cache", 4),
        ("metrics", 4),
        ("replication", 5),
        ("links", 5),
        ("timers", 5),
        ("api", 6),
        ("k8s", 7),
        ("config", 8),
        ("runtime", 9),
    ];

    /// The top-level modules a source file uses through `crate::` paths (a `use crate::{a, b}`
    /// group counts each), comment lines skipped.
    fn crate_uses(text: &str) -> Vec<String> {
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut out = Vec::new();
        let mut rest = code.as_str();
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // The top-level items of the group, up to its closing brace.
                let (mut depth, mut item) = (0, String::new());
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            out.push(std::mem::take(&mut item));
                            continue;
                        }
                        _ => {}
                    }
                    if depth == 0 {
                        item.push(c);
                    }
                }
                out.push(item);
            } else {
                out.push(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
            }
        }
        out.iter()
            .map(|i| i.trim().split("::").next().unwrap_or("").trim().to_string())
            .filter(|i| !i.is_empty() && i != "self")
            .collect()
    }

    fn layer(module: &str) -> Option<u8> {
        LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
    }

    /// No module uses one on a higher layer (see [`LAYERS`]).
    #[test]
    fn no_module_uses_one_above_it() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        modules(&root.join("src"), &mut files);
        let mut upward = Vec::new();
        for file in files {
            let rel = file
                .strip_prefix(root.join("src"))
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let top = rel.trim_end_matches(".rs").split('/').next().unwrap_or("").to_string();
            let Some(own) = layer(&top) else {
                // The crate root, the binaries: above every layer.
                assert!(
                    matches!(top.as_str(), "lib" | "main" | "bin"),
                    "{rel}: module `{top}` has no layer in LAYERS (and README's module map)"
                );
                continue;
            };
            let text = std::fs::read_to_string(&file).unwrap();
            for used in crate_uses(&text) {
                let Some(theirs) = layer(&used) else {
                    panic!("{rel} uses crate::{used}, which has no layer in LAYERS");
                };
                if theirs > own {
                    upward.push(format!("{rel} (layer {own}) uses crate::{used} (layer {theirs})"));
                }
            }
        }
        upward.sort();
        upward.dedup();
        assert!(upward.is_empty(), "imports up the layers:\n{}", upward.join("\n"));
    }

    #[test]
    fn crate_uses_reads_groups_and_paths() {
        let text = "use crate::{\n    api::{self, Api},\n    registry::Registry,\n};\n// crate::k8s in a comment\nlet x = crate::health::Health::new();\n";
        assert_eq!(crate_uses(text), vec!["api", "registry", "health"]);
    }

    /// The module map (`docs/src/design/modules.md`) names every module of `src/` (test-only
    /// files aside), so it cannot fall behind the code.
    #[test]
    fn the_module_map_names_every_module() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let page = include_str!("../docs/src/design/modules.md");
        let map = page
            .split("## Module map")
            .nth(1)
            .and_then(|rest| rest.split("\n## ").next())
            .expect("docs/src/design/modules.md has a `## Module map` section");
        let mut files = Vec::new();
        modules(&root.join("src"), &mut files);
        let test_only = |p: &str| p.ends_with("/tests.rs") || p.contains("/tests/") || p.ends_with("/props.rs");
        for file in files {
            let rel = file.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if test_only(&rel) {
                continue;
            }
            assert!(
                map.contains(&format!("`{rel}`")),
                "the module map (docs/src/design/modules.md) lacks `{rel}`"
            );
        }
        // Its layer column is LAYERS: a row whose first cell starts with a number begins a layer.
        let mut current = 0u8;
        for row in map.lines().filter(|l| l.starts_with("| ")) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            if let Some(n) = cells[1].split_whitespace().next().and_then(|n| n.parse().ok()) {
                current = n;
            }
            for (module, layer) in LAYERS {
                if cells[2].contains(&format!("`src/{module}.rs`")) {
                    assert_eq!(
                        current, *layer,
                        "the module map (docs/src/design/modules.md) puts `src/{module}.rs` on another layer"
                    );
                }
            }
        }
    }

    /// The renderers of the generated reference pages, shared with `docgen` (which alone uses
    /// `PAGES`).
    #[allow(dead_code)]
    mod pages {
        include!("bin/docgen/pages.rs");
    }

    /// Fails unless the committed page `docs/src/reference/{name}` is what the code renders now,
    /// naming the first line that differs and the command that regenerates it.
    fn assert_current(name: &str, rendered: &str, committed: &str) {
        if let Some((line, committed, rendered)) = pages::drift(rendered, committed) {
            panic!(
                "docs/src/reference/{name} is not what the code renders (first difference at line {line}):\n  \
                 committed: {committed:?}\n  rendered:  {rendered:?}\nrun `{}` and commit the result",
                pages::REGENERATE,
            );
        }
    }

    /// The reference pages (EurekaApp fields, flags, metrics) are what `docgen` renders from the
    /// code now, so a field, flag or metric cannot change without its documentation.
    #[test]
    fn the_reference_pages_are_current() {
        use clap::CommandFactory;
        let crd = crate::k8s::crd::crd();
        assert_current(
            "eurekaapp.md",
            &pages::eurekaapp(&crd),
            include_str!("../docs/src/reference/eurekaapp.md"),
        );
        assert_current(
            "flags.md",
            &pages::flags(&crate::config::Args::command()),
            include_str!("../docs/src/reference/flags.md"),
        );
        let (exposition, registry) = catalogue();
        assert_current(
            "metrics.md",
            &pages::metrics(&exposition, &registry),
            include_str!("../docs/src/reference/metrics.md"),
        );
    }

    /// The metrics catalogue in its two forms: the text exposition and the registry's `Debug`.
    fn catalogue() -> (String, String) {
        let metrics = crate::runtime::metrics_catalogue();
        (metrics.encode(), metrics.describe())
    }

    /// Every metric the code registers (`register("name", "help", ..)`) or describes in a
    /// collector (`encode_descriptor("name", "help", ..)`) is in the catalogue the metrics page
    /// is rendered from, with that help, and has a known kind: a subsystem whose metrics
    /// `runtime::metrics_catalogue` does not register fails here.
    #[test]
    fn the_metrics_catalogue_holds_every_registered_metric() {
        let (exposition, registry) = catalogue();
        let catalogue = pages::catalogue(&exposition, &registry);
        for (name, kind, _) in &catalogue {
            assert_ne!(
                kind, "unknown",
                "{name}: add its kind to FAMILY_KINDS in src/bin/docgen/pages.rs"
            );
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        modules(&root.join("src"), &mut files);
        let mut found = 0;
        for file in files {
            let rel = file.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if rel.starts_with("src/bin/") || rel.ends_with("/tests.rs") || rel.contains("/tests/") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let code: String = text
                .split("#[cfg(test)]\nmod tests")
                .next()
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            for (name, help) in described(&code) {
                found += 1;
                let listed = catalogue.iter().any(|(n, _, h)| {
                    (n == &name || n == &format!("eureka_{name}") || n.ends_with(&format!("_{name}")))
                        && (h == &help || h == &format!("{help}."))
                });
                assert!(
                    listed,
                    "{rel} registers the metric `{name}` ({help:?}), which runtime::metrics_catalogue lacks or describes otherwise"
                );
            }
        }
        assert!(
            found >= 20,
            "found only {found} metric registrations in src/: is `described` still reading them?"
        );
    }

    /// The (name, help) pairs of `register(` and `encode_descriptor(` calls whose first two
    /// arguments are string literals.
    fn described(code: &str) -> Vec<(String, String)> {
        fn literal(s: &str) -> Option<(&str, &str)> {
            let body = s.trim_start().strip_prefix('"')?;
            let end = body.find('"')?;
            Some((&body[..end], &body[end + 1..]))
        }
        let mut out = Vec::new();
        for call in ["register(", "encode_descriptor("] {
            for (i, _) in code.match_indices(call) {
                let args = &code[i + call.len()..];
                let Some((name, rest)) = literal(args) else { continue };
                let Some((help, _)) = rest.trim_start().strip_prefix(',').and_then(literal) else {
                    continue;
                };
                out.push((name.to_string(), help.to_string()));
            }
        }
        out
    }
}
