//! Prints the EurekaApp CustomResourceDefinition as YAML:
//! `cargo run --bin crdgen > crds/eurekaapps.eureka-operator.dev.yaml`.

fn main() -> anyhow::Result<()> {
    print!("{}", eureka_operator::k8s::crd::crd_yaml()?);
    Ok(())
}
