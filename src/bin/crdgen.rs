//! Prints the EurekaApp CustomResourceDefinition as YAML:
//! `cargo run --bin crdgen > crds/eurekaapps.eureka-operator.dev.yaml`, and with `--helm` the
//! chart's template: `cargo run --bin crdgen -- --helm > charts/eureka-operator/templates/crds.yaml`.

fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--helm") {
        print!("{}", eureka_operator::k8s::crd::crd_helm_template()?);
    } else {
        print!("{}", eureka_operator::k8s::crd::crd_yaml()?);
    }
    Ok(())
}
