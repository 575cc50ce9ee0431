//! Writes the reference pages of the documentation from the code, as `crdgen` writes the CRD:
//!
//! * `cargo run --bin docgen -- eurekaapp|flags|metrics` prints one page;
//! * `cargo run --bin docgen -- --write [DIR]` writes all three into `DIR` (by default
//!   `docs/src/reference/`, where they are committed; CI writes them into `target/` and diffs).
//!
//! The unit tests `readme::the_reference_pages_are_current` and
//! `config::tests::the_flags_page_is_current` compare the committed pages with what this renders.

use std::path::PathBuf;

use clap::CommandFactory;

#[path = "docgen/pages.rs"]
mod pages;

fn page(name: &str) -> anyhow::Result<String> {
    Ok(match name {
        "eurekaapp" | "eurekaapp.md" => pages::eurekaapp(&eureka_operator::k8s::crd::crd()),
        "flags" | "flags.md" => pages::flags(&eureka_operator::config::Args::command()),
        "metrics" | "metrics.md" => {
            let metrics = eureka_operator::runtime::metrics_catalogue();
            pages::metrics(&metrics.encode(), &metrics.with_prometheus(|r| format!("{r:?}")))
        }
        other => anyhow::bail!("no page {other:?}: eurekaapp, flags or metrics (or --write [DIR])"),
    })
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["--write", rest @ ..] if rest.len() <= 1 => {
            let dir = PathBuf::from(rest.first().copied().unwrap_or("docs/src/reference"));
            std::fs::create_dir_all(&dir)?;
            for name in pages::PAGES {
                std::fs::write(dir.join(name), page(name)?)?;
            }
            eprintln!("wrote {} into {}", pages::PAGES.join(", "), dir.display());
        }
        [name] => print!("{}", page(name)?),
        _ => anyhow::bail!("usage: docgen eurekaapp|flags|metrics, or docgen --write [DIR]"),
    }
    Ok(())
}
