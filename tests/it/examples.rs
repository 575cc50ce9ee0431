//! Every example is applied to the real apiserver (the migration values are rendered with the
//! chart first); the Spring configuration examples are checked for the keys Spring reads.

use std::path::{Path, PathBuf};

use crate::common::operator::{helm_template, namespace, pipe, prepared};
use serde_json::Value;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            files(&p, ext, out);
        } else if p.extension().is_some_and(|e| e == ext) {
            out.push(p);
        }
    }
    out.sort();
}

#[tokio::test]
async fn every_example_applies_to_a_real_apiserver() {
    let Some(cluster) = prepared() else { return };
    let client = cluster.admin().await;
    namespace(&client, "examples").await;
    let mut manifests = Vec::new();
    files(&examples(), "yaml", &mut manifests);
    // Helm values are not manifests: they are rendered below.
    manifests.retain(|p| p.file_name().is_some_and(|n| n != "values.yaml"));
    assert!(manifests.len() >= 4, "{manifests:?}");
    for path in &manifests {
        let out = cluster.kubectl_ok(&["apply", "-n", "examples", "-f", path.to_str().unwrap()]);
        assert!(
            out.contains("created") || out.contains("configured"),
            "{}: {out}",
            path.display()
        );
    }
    let eureka_apps = cluster.kubectl_ok(&["get", "ea", "-n", "examples", "-o", "name"]);
    for name in ["orders", "billing", "checkout", "inventory"] {
        assert!(
            eureka_apps.contains(&format!("eurekaapp.eureka-operator.dev/{name}")),
            "{eureka_apps}"
        );
    }

    // The migration values render and apply (server-side dry run).
    let values = examples().join("migration/values.yaml");
    let rendered = helm_template(
        cluster,
        &["-f", values.to_str().unwrap(), "--set", "crds.install=false"],
    )
    .replace("namespace: eureka-system", "namespace: examples");
    assert!(rendered.contains(
        "http://eureka-1.legacy.example.internal:8761/eureka/,http://eureka-2.legacy.example.internal:8761/eureka/"
    ));
    let mut dry = cluster.kubectl();
    dry.args(["apply", "--dry-run=server", "-f", "-"]);
    pipe(dry, &rendered);
}

#[test]
fn spring_configuration_examples_carry_the_keys_spring_reads() {
    let mut configs = Vec::new();
    files(&examples(), "yml", &mut configs);
    assert_eq!(configs.len(), 2, "{configs:?}");
    for path in configs {
        let v: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let zone = v["eureka"]["client"]["service-url"]["defaultZone"]
            .as_str()
            .unwrap_or("");
        assert!(
            zone.contains("eureka-operator") && zone.contains(":8761/eureka/"),
            "{}: {zone}",
            path.display()
        );
    }
}
