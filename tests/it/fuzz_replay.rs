//! The fuzzing corpus replayed on stable Rust: every committed input of every target (`fuzz/corpus/`,
//! seeded with real client payloads) goes through the same entry points as the cargo-fuzz targets,
//! with the same checks, so CI catches a regression on any input the fuzzers found interesting.

use std::path::Path;

#[path = "../../fuzz/src/entries.rs"]
mod entries;

type Entry = fn(&[u8]);

const TARGETS: [(&str, Entry); 5] = [
    ("json", entries::json),
    ("xml", entries::xml),
    ("batch", entries::batch),
    ("query_headers", entries::query_headers),
    ("body", entries::body),
];

#[test]
fn every_corpus_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (target, entry) in TARGETS {
        let dir = root.join(target);
        let mut inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("failed to read {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        inputs.sort();
        assert!(!inputs.is_empty(), "{} has no inputs", dir.display());
        for input in &inputs {
            let data = std::fs::read(input).unwrap();
            let outcome = std::panic::catch_unwind(|| entry(&data));
            assert!(outcome.is_ok(), "{target} fails on {}", input.display());
        }
        println!("[fuzz replay] {target}: {} inputs", inputs.len());
    }
}
