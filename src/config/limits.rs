//! The caps on what clients may send and the registry may hold (`registry::limits`), and where
//! request bodies are decoded: one flag each, with generous defaults.

use clap::Args as ClapArgs;

use crate::{
    api::negotiate::InputLimits,
    registry::limits::{InstanceLimits, Limits},
};

#[derive(Clone, Debug, ClapArgs)]
pub struct LimitArgs {
    /// Most instances the registry holds; a registration past it is refused with 403 (pods are never refused, but count).
    #[arg(long, env = "EUREKA_MAX_INSTANCES", default_value_t = Limits::DEFAULT_MAX_INSTANCES)]
    pub max_instances: usize,

    /// Most applications the registry holds; a registration of a new one past it is refused with 403.
    #[arg(long, env = "EUREKA_MAX_APPLICATIONS", default_value_t = Limits::DEFAULT_MAX_APPLICATIONS)]
    pub max_applications: usize,

    /// Most instances of one application; a registration past it is refused with 403.
    #[arg(
        long,
        env = "EUREKA_MAX_INSTANCES_PER_APPLICATION",
        default_value_t = Limits::DEFAULT_MAX_INSTANCES_PER_APPLICATION
    )]
    pub max_instances_per_application: usize,

    /// Most bytes of text the registry holds in all (every instance's strings); a registration past it is refused with 403.
    #[arg(long, env = "EUREKA_MAX_REGISTRY_BYTES", default_value_t = Limits::DEFAULT_MAX_REGISTRY_BYTES)]
    pub max_registry_bytes: usize,

    /// Most metadata keys of one instance; a registration or metadata update past it is refused with 400.
    #[arg(
        long,
        env = "EUREKA_MAX_METADATA_KEYS_PER_INSTANCE",
        default_value_t = InstanceLimits::DEFAULT_MAX_METADATA_KEYS
    )]
    pub max_metadata_keys_per_instance: usize,

    /// Most bytes of text of one instance (all its strings, metadata included); past it, 400.
    #[arg(long, env = "EUREKA_MAX_INSTANCE_BYTES", default_value_t = InstanceLimits::DEFAULT_MAX_BYTES)]
    pub max_instance_bytes: usize,

    /// Request bodies larger than this, and every gzip body, are decoded on a blocking thread.
    #[arg(
        long,
        env = "EUREKA_BLOCKING_DECODE_THRESHOLD_BYTES",
        default_value_t = InputLimits::DEFAULT_BLOCKING_THRESHOLD
    )]
    pub blocking_decode_threshold_bytes: usize,

    /// How many of those blocking decodes run at once (0: one less than the cores, at least one); others wait their turn.
    #[arg(long, env = "EUREKA_MAX_CONCURRENT_BODY_DECODES", default_value_t = 0)]
    pub max_concurrent_body_decodes: usize,
}

impl LimitArgs {
    pub fn instance_limits(&self) -> InstanceLimits {
        InstanceLimits {
            max_metadata_keys: self.max_metadata_keys_per_instance,
            max_bytes: self.max_instance_bytes,
        }
    }

    /// The caps the registry applies.
    pub fn registry_limits(&self) -> Limits {
        Limits {
            max_instances: self.max_instances,
            max_applications: self.max_applications,
            max_instances_per_application: self.max_instances_per_application,
            max_registry_bytes: self.max_registry_bytes,
            instance: self.instance_limits(),
        }
    }

    /// What the API applies while reading bodies.
    pub fn input_limits(&self) -> InputLimits {
        InputLimits {
            blocking_threshold: self.blocking_decode_threshold_bytes,
            max_concurrent_decodes: self.max_concurrent_body_decodes,
            instance: self.instance_limits(),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::config::Args;

    #[test]
    fn limits_map_onto_the_registry_and_the_api() {
        let args = Args::parse_from(["eureka-operator"]);
        assert_eq!(
            args.limits.registry_limits(),
            crate::registry::limits::Limits::default()
        );
        assert_eq!(
            args.limits.input_limits(),
            crate::api::negotiate::InputLimits::default()
        );
        let args = Args::parse_from([
            "eureka-operator",
            "--max-instances",
            "5",
            "--max-metadata-keys-per-instance",
            "2",
            "--max-instance-bytes",
            "100",
        ]);
        let limits = args.limits.registry_limits();
        assert_eq!(limits.max_instances, 5);
        assert_eq!(limits.instance.max_metadata_keys, 2);
        assert_eq!(args.limits.input_limits().instance.max_bytes, 100);
    }
}
