//! The fuzzing entry points as a library for the cargo-fuzz targets; the same file is compiled
//! into the integration tests, which replay the committed corpus on stable Rust.

#[path = "entries.rs"]
pub mod entries;
