//! Writes the reference pages of the documentation from the code, as `crdgen` writes the CRD:
//!
//! * `cargo run --bin docgen -- eurekaapp|flags|metrics` prints one page;
//! * `cargo run --bin docgen -- --write [DIR]` writes all three into `DIR` (by default
//!   `docs/src/reference/`, where they are committed; CI writes them into `target/` and diffs),
//!   and the chart's Grafana dashboard (by default `charts/eureka-operator/files/`, with a `DIR`
//!   into `DIR/grafana-dashboard.json`);
//! * `cargo run --bin docgen -- dashboard` prints the dashboard, and `--dashboard-queries` every
//!   PromQL expression of its panels, one a line, `$job` and `$instance` left in place.
//!
//! The unit tests `readme::the_reference_pages_are_current` and
//! `config::tests::the_flags_page_is_current` compare the committed pages with what this renders,
//! `dashboard::tests::the_charts_dashboard_is_current` the committed dashboard.

use std::path::PathBuf;

use clap::CommandFactory;

#[path = "docgen/dashboard.rs"]
mod dashboard;
#[path = "docgen/pages.rs"]
mod pages;

fn page(name: &str) -> anyhow::Result<String> {
    Ok(match name {
        "eurekaapp" | "eurekaapp.md" => pages::eurekaapp(&eureka_operator::k8s::crd::crd()),
        "flags" | "flags.md" => pages::flags(&eureka_operator::config::Args::command()),
        "metrics" | "metrics.md" => {
            let metrics = eureka_operator::runtime::metrics_catalogue();
            pages::metrics(&metrics.encode(), &metrics.describe())
        }
        "dashboard" | "grafana-dashboard.json" => dashboard::render(),
        other => anyhow::bail!("no page {other:?}: eurekaapp, flags, metrics or dashboard (or --write [DIR])"),
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
            let board = match rest.first() {
                Some(dir) => PathBuf::from(dir).join(dashboard::FILE),
                None => PathBuf::from(dashboard::CHART_PATH),
            };
            if let Some(parent) = board.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&board, dashboard::render())?;
            eprintln!("wrote {}", board.display());
        }
        ["--dashboard-queries"] => {
            for query in dashboard::queries() {
                println!("{query}");
            }
        }
        [name] => print!("{}", page(name)?),
        _ => anyhow::bail!(
            "usage: docgen eurekaapp|flags|metrics|dashboard, docgen --write [DIR], or docgen --dashboard-queries"
        ),
    }
    Ok(())
}
