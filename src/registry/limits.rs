//! What the registry refuses to hold: caps on the number of instances and applications, and on
//! the size of one instance (its metadata keys and the bytes of its text), so that no client can
//! grow the registry without bound. The decoders apply the per-instance caps while they read, so an
//! oversized registration is refused before it is held in memory; the registry applies every cap
//! again to each write it takes.
//!
//! Pod instances are never refused (Kubernetes bounds them, and refusing one would make the
//! registry disagree with the cluster), but they count toward the totals.

use super::instance::InstanceInfo;

/// Caps on one instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceLimits {
    /// Metadata keys of one instance.
    pub max_metadata_keys: usize,
    /// Bytes of text of one instance: every string field, metadata keys and values included.
    pub max_bytes: usize,
}

impl InstanceLimits {
    pub const DEFAULT_MAX_METADATA_KEYS: usize = 1_000;
    pub const DEFAULT_MAX_BYTES: usize = 16 * 1024;

    /// No caps (what this server reads from its own peers' answers; the registry still applies
    /// its caps when it takes the instances).
    pub const UNLIMITED: InstanceLimits = InstanceLimits {
        max_metadata_keys: usize::MAX,
        max_bytes: usize::MAX,
    };

    /// Whether `info` is within the caps.
    pub fn check(&self, info: &InstanceInfo) -> Result<(), LimitExceeded> {
        if info.metadata.contains_key("") {
            return Err(LimitExceeded::EmptyMetadataKey);
        }
        let keys = info.metadata.len();
        if keys > self.max_metadata_keys {
            return Err(LimitExceeded::MetadataKeys {
                limit: self.max_metadata_keys,
            });
        }
        if info.text_bytes() > self.max_bytes {
            return Err(LimitExceeded::InstanceBytes { limit: self.max_bytes });
        }
        Ok(())
    }
}

impl Default for InstanceLimits {
    fn default() -> Self {
        InstanceLimits {
            max_metadata_keys: Self::DEFAULT_MAX_METADATA_KEYS,
            max_bytes: Self::DEFAULT_MAX_BYTES,
        }
    }
}

/// Caps on the whole registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Instances in the whole registry.
    pub max_instances: usize,
    /// Applications in the whole registry.
    pub max_applications: usize,
    /// Instances of one application.
    pub max_instances_per_application: usize,
    /// Bytes of text of all instances together ([`InstanceInfo::text_bytes`] summed).
    pub max_registry_bytes: usize,
    /// The caps on each instance.
    pub instance: InstanceLimits,
}

impl Limits {
    pub const DEFAULT_MAX_INSTANCES: usize = 100_000;
    pub const DEFAULT_MAX_APPLICATIONS: usize = 10_000;
    pub const DEFAULT_MAX_INSTANCES_PER_APPLICATION: usize = 10_000;
    pub const DEFAULT_MAX_REGISTRY_BYTES: usize = 256 * 1024 * 1024;
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_instances: Self::DEFAULT_MAX_INSTANCES,
            max_applications: Self::DEFAULT_MAX_APPLICATIONS,
            max_instances_per_application: Self::DEFAULT_MAX_INSTANCES_PER_APPLICATION,
            max_registry_bytes: Self::DEFAULT_MAX_REGISTRY_BYTES,
            instance: InstanceLimits::default(),
        }
    }
}

/// A write the caps refuse. The message names the flag that sets the cap.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitExceeded {
    #[error("failed to store the instance: it has more than {limit} metadata keys (--max-metadata-keys-per-instance)")]
    MetadataKeys { limit: usize },
    #[error("failed to store the instance: its text is larger than {limit} bytes (--max-instance-bytes)")]
    InstanceBytes { limit: usize },
    #[error("failed to store the instance: a metadata key is empty")]
    EmptyMetadataKey,
    #[error("failed to register: the registry already holds its maximum of {limit} instances (--max-instances)")]
    Instances { limit: usize },
    #[error("failed to register: the registry already holds its maximum of {limit} applications (--max-applications)")]
    Applications { limit: usize },
    #[error(
        "failed to register: application {app} already has its maximum of {limit} instances (--max-instances-per-application)"
    )]
    InstancesPerApplication { app: String, limit: usize },
    #[error(
        "failed to register: the registry already holds its maximum of {limit} bytes of instances (--max-registry-bytes)"
    )]
    RegistryBytes { limit: usize },
}

impl LimitExceeded {
    /// A bounded label for metrics.
    /// Every [`LimitExceeded::kind`] (the `limit` label's values: each starts at 0).
    pub const KINDS: [&'static str; 7] = [
        "metadata_keys",
        "instance_bytes",
        "empty_metadata_key",
        "instances",
        "applications",
        "instances_per_application",
        "registry_bytes",
    ];

    pub fn kind(&self) -> &'static str {
        match self {
            LimitExceeded::MetadataKeys { .. } => "metadata_keys",
            LimitExceeded::InstanceBytes { .. } => "instance_bytes",
            LimitExceeded::EmptyMetadataKey => "empty_metadata_key",
            LimitExceeded::Instances { .. } => "instances",
            LimitExceeded::Applications { .. } => "applications",
            LimitExceeded::InstancesPerApplication { .. } => "instances_per_application",
            LimitExceeded::RegistryBytes { .. } => "registry_bytes",
        }
    }

    /// Whether the instance itself is at fault (a bad request), rather than the registry being full.
    pub fn is_instance_fault(&self) -> bool {
        matches!(
            self,
            LimitExceeded::MetadataKeys { .. } | LimitExceeded::InstanceBytes { .. } | LimitExceeded::EmptyMetadataKey
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{
        Command, PodOverrides, PodOwner, Registry, RegistryConfig, Reply, Writer, instance::Metadata,
    };

    /// `KINDS` lists every variant's label, in order, and nothing else.
    #[test]
    fn kinds_name_every_variant() {
        let all = [
            LimitExceeded::MetadataKeys { limit: 1 },
            LimitExceeded::InstanceBytes { limit: 1 },
            LimitExceeded::EmptyMetadataKey,
            LimitExceeded::Instances { limit: 1 },
            LimitExceeded::Applications { limit: 1 },
            LimitExceeded::InstancesPerApplication {
                app: "A".into(),
                limit: 1,
            },
            LimitExceeded::RegistryBytes { limit: 1 },
        ];
        let kinds: Vec<&str> = all.iter().map(LimitExceeded::kind).collect();
        assert_eq!(kinds, LimitExceeded::KINDS);
    }

    fn registry(limits: Limits) -> Registry {
        Registry::new(
            RegistryConfig {
                limits,
                ..RegistryConfig::default()
            },
            0,
        )
    }

    fn instance(app: &str, id: &str) -> InstanceInfo {
        let mut i = InstanceInfo::new(app, "10.0.0.1", "10.0.0.1", 0);
        i.instance_id = Some(id.to_string().into());
        i
    }

    fn register(r: &mut Registry, info: InstanceInfo) -> Reply {
        r.apply(
            Command::Register {
                info,
                writer: Writer::Client,
            },
            1,
        )
        .reply
    }

    #[test]
    fn registrations_past_the_caps_are_refused_and_replacements_are_not() {
        let mut r = registry(Limits {
            max_instances: 3,
            max_applications: 2,
            max_instances_per_application: 2,
            ..Limits::default()
        });
        assert_eq!(register(&mut r, instance("A", "a1")), Reply::Registered);
        assert_eq!(register(&mut r, instance("A", "a2")), Reply::Registered);
        assert_eq!(
            register(&mut r, instance("A", "a3")),
            Reply::OverLimit(LimitExceeded::InstancesPerApplication {
                app: "A".into(),
                limit: 2
            })
        );
        assert_eq!(register(&mut r, instance("B", "b1")), Reply::Registered);
        assert_eq!(
            register(&mut r, instance("C", "c1")),
            Reply::OverLimit(LimitExceeded::Instances { limit: 3 })
        );
        assert_eq!(
            register(&mut r, instance("A", "a1")),
            Reply::Registered,
            "a replacement"
        );
        let mut r = registry(Limits {
            max_applications: 1,
            ..Limits::default()
        });
        assert_eq!(register(&mut r, instance("A", "a1")), Reply::Registered);
        assert_eq!(
            register(&mut r, instance("B", "b1")),
            Reply::OverLimit(LimitExceeded::Applications { limit: 1 })
        );
        assert_eq!(r.stats(1).instances, 1);
    }

    #[test]
    fn the_text_the_registry_holds_is_capped_and_kept_as_instances_come_and_go() {
        let mut r = registry(Limits {
            max_registry_bytes: 1_000,
            ..Limits::default()
        });
        let sized = |id: &str, n: usize| {
            let mut i = instance("A", id);
            i.metadata.insert("pad", "x".repeat(n));
            i
        };
        assert_eq!(register(&mut r, sized("a1", 400)), Reply::Registered);
        assert_eq!(register(&mut r, sized("a2", 400)), Reply::Registered);
        assert_eq!(
            register(&mut r, sized("a3", 400)),
            Reply::OverLimit(LimitExceeded::RegistryBytes { limit: 1_000 })
        );
        // A replacement counts the difference; a cancel gives its bytes back.
        assert_eq!(register(&mut r, sized("a2", 100)), Reply::Registered);
        assert_eq!(register(&mut r, sized("a3", 300)), Reply::Registered);
        let cancel = Command::Cancel {
            app: "A".into(),
            id: "a1".into(),
            writer: Writer::Client,
        };
        assert_eq!(r.apply(cancel, 2).reply, Reply::Ok);
        assert_eq!(register(&mut r, sized("a4", 400)), Reply::Registered);
    }

    #[test]
    fn pods_are_never_refused_but_count() {
        let mut r = registry(Limits {
            max_instances: 1,
            ..Limits::default()
        });
        let owner = |pod: &str| PodOwner {
            namespace: "ns".into(),
            eureka_app: "a".into(),
            pod: pod.into(),
        };
        for pod in ["p1", "p2"] {
            let outcome = r.apply(
                Command::UpsertPod {
                    info: instance("A", pod),
                    owner: owner(pod),
                    overrides: PodOverrides::NONE,
                },
                1,
            );
            assert_eq!(outcome.reply, Reply::Registered);
        }
        assert_eq!(
            register(&mut r, instance("B", "b1")),
            Reply::OverLimit(LimitExceeded::Instances { limit: 1 })
        );
    }

    #[test]
    fn metadata_updates_are_capped_in_keys_and_bytes() {
        let mut r = registry(Limits {
            instance: InstanceLimits {
                max_metadata_keys: 3,
                max_bytes: 100,
            },
            ..Limits::default()
        });
        assert_eq!(register(&mut r, instance("A", "a1")), Reply::Registered);
        let update = |r: &mut Registry, pairs: &[(&str, &str)]| {
            r.apply(
                Command::UpdateMetadata {
                    app: "A".into(),
                    id: "a1".into(),
                    entries: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect::<Metadata>(),
                },
                2,
            )
            .reply
        };
        assert_eq!(update(&mut r, &[("k1", "v"), ("k2", "v"), ("k3", "v")]), Reply::Ok);
        assert_eq!(
            update(&mut r, &[("k4", "v")]),
            Reply::OverLimit(LimitExceeded::MetadataKeys { limit: 3 })
        );
        assert_eq!(update(&mut r, &[("k1", "replaced")]), Reply::Ok, "no new key");
        assert_eq!(
            update(&mut r, &[("k2", &"x".repeat(100))]),
            Reply::OverLimit(LimitExceeded::InstanceBytes { limit: 100 })
        );
        assert_eq!(
            update(&mut r, &[("", "x")]),
            Reply::OverLimit(LimitExceeded::EmptyMetadataKey)
        );
        let stored = r.instance("A", "a1", 3).unwrap();
        assert_eq!(stored.info.metadata.get("k1"), Some("replaced"));
        assert_eq!(stored.info.metadata.len(), 3);
        let mut big = instance("A", "a2");
        big.metadata = (0..4).map(|i| (format!("k{i}"), "v")).collect();
        assert_eq!(
            register(&mut r, big),
            Reply::OverLimit(LimitExceeded::MetadataKeys { limit: 3 })
        );
    }

    #[test]
    fn messages_name_the_flag() {
        let e = LimitExceeded::Instances { limit: 7 };
        assert!(e.to_string().starts_with("failed to register"));
        assert!(e.to_string().contains("--max-instances"));
        assert!(!e.is_instance_fault());
        assert!(LimitExceeded::EmptyMetadataKey.is_instance_fault());
    }
}
