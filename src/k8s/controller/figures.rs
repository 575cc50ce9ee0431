//! Per-EurekaApp figures for `/metrics`: instances by Eureka status, the conditions, the selected
//! pods and (adopting apps) the pods awaiting their client's registration, as this replica's last
//! reconcile computed them. Every replica reconciles every EurekaApp, so every replica exports
//! them (queries take `max without (instance, pod)`); the series of an EurekaApp go with it. The
//! label names (`eurekaapp_namespace`, `eurekaapp`) do not collide with the `namespace` label a
//! ServiceMonitor's target carries.

use std::{collections::BTreeMap, sync::Arc};

use parking_lot::Mutex;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, gauge::ConstGauge},
};

use crate::k8s::{crd::EurekaAppStatus, index::AppKey};

/// What `/metrics` says of one EurekaApp.
#[derive(Clone, Debug, PartialEq)]
struct Figures {
    /// `(UP, n)`, `(DOWN, n)`, ... in Eureka's spelling.
    instances: [(&'static str, i64); 5],
    selected: i64,
    awaiting: i64,
    /// `(type, is True)`.
    conditions: Vec<(String, bool)>,
}

/// The figures of every EurekaApp this replica reconciled; a clone shares them.
#[derive(Clone, Debug, Default)]
pub struct AppFigures(Arc<Mutex<BTreeMap<AppKey, Figures>>>);

impl AppFigures {
    /// Records what a reconcile computed; `None` (the EurekaApp is being deleted) forgets it.
    pub fn set(&self, key: &AppKey, status: Option<&EurekaAppStatus>) {
        let Some(s) = status else {
            self.forget(key);
            return;
        };
        let i = &s.instances;
        let figures = Figures {
            instances: [
                ("UP", i.up),
                ("DOWN", i.down),
                ("STARTING", i.starting),
                ("OUT_OF_SERVICE", i.out_of_service),
                ("UNKNOWN", i.unknown),
            ],
            selected: s.selected_pods,
            awaiting: s.awaiting_registration,
            conditions: s
                .conditions
                .iter()
                .map(|c| (c.type_.clone(), c.status == "True"))
                .collect(),
        };
        self.0.lock().insert(key.clone(), figures);
    }

    /// The EurekaApp is gone: its series go.
    pub fn forget(&self, key: &AppKey) {
        self.0.lock().remove(key);
    }

    /// Keeps the EurekaApps that still exist (the periodic sweep, for a deletion a watch missed).
    pub fn retain(&self, exists: impl Fn(&AppKey) -> bool) {
        self.0.lock().retain(|k, _| exists(k));
    }
}

impl Collector for AppFigures {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let apps = self.0.lock().clone();
        {
            let mut metric = encoder.encode_descriptor(
                "eurekaapp_instances",
                "Registered instances of each EurekaApp by Eureka status (adopted ones with registration: Adopt)",
                None,
                MetricType::Gauge,
            )?;
            for (key, f) in &apps {
                for (status, n) in f.instances {
                    let labels = [
                        ("eurekaapp_namespace", key.namespace.as_str()),
                        ("eurekaapp", key.name.as_str()),
                        ("status", status),
                    ];
                    ConstGauge::new(n).encode(metric.encode_family(&labels.as_slice())?)?;
                }
            }
        }
        {
            let mut metric = encoder.encode_descriptor(
                "eurekaapp_condition",
                "Each EurekaApp condition (Ready, Degraded, Conflict): 1 on the series of its current status (true or false), 0 on the other",
                None,
                MetricType::Gauge,
            )?;
            for (key, f) in &apps {
                for (type_, holds) in &f.conditions {
                    for (status, value) in [("true", *holds), ("false", !*holds)] {
                        let labels = [
                            ("eurekaapp_namespace", key.namespace.as_str()),
                            ("eurekaapp", key.name.as_str()),
                            ("type", type_.as_str()),
                            ("status", status),
                        ];
                        ConstGauge::new(i64::from(value)).encode(metric.encode_family(&labels.as_slice())?)?;
                    }
                }
            }
        }
        for (name, help, pick) in [
            (
                "eurekaapp_selected_pods",
                "Pods each EurekaApp's selector matches",
                (|f: &Figures| f.selected) as fn(&Figures) -> i64,
            ),
            (
                "eurekaapp_awaiting_registration",
                "Selected pods of an adopting EurekaApp whose own client has not registered yet",
                |f: &Figures| f.awaiting,
            ),
        ] {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (key, f) in &apps {
                let labels = [
                    ("eurekaapp_namespace", key.namespace.as_str()),
                    ("eurekaapp", key.name.as_str()),
                ];
                ConstGauge::new(pick(f)).encode(metric.encode_family(&labels.as_slice())?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;
    use crate::k8s::crd::InstanceCounts;

    fn text(figures: &AppFigures) -> String {
        let mut registry = prometheus_client::registry::Registry::with_prefix("eureka");
        registry.register_collector(Box::new(figures.clone()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    fn condition(type_: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "R".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn an_apps_figures_come_and_go_with_it() {
        let figures = AppFigures::default();
        let key = AppKey {
            namespace: "shop".into(),
            name: "cart".into(),
        };
        let status = EurekaAppStatus {
            selected_pods: 4,
            awaiting_registration: 1,
            instances: InstanceCounts {
                registered: 3,
                up: 2,
                starting: 1,
                ..Default::default()
            },
            conditions: vec![condition("Ready", "False"), condition("Degraded", "True")],
            ..Default::default()
        };
        figures.set(&key, Some(&status));
        let t = text(&figures);
        for line in [
            r#"eureka_eurekaapp_instances{eurekaapp_namespace="shop",eurekaapp="cart",status="UP"} 2"#,
            r#"eureka_eurekaapp_instances{eurekaapp_namespace="shop",eurekaapp="cart",status="STARTING"} 1"#,
            r#"eureka_eurekaapp_instances{eurekaapp_namespace="shop",eurekaapp="cart",status="DOWN"} 0"#,
            r#"eureka_eurekaapp_condition{eurekaapp_namespace="shop",eurekaapp="cart",type="Degraded",status="true"} 1"#,
            r#"eureka_eurekaapp_condition{eurekaapp_namespace="shop",eurekaapp="cart",type="Degraded",status="false"} 0"#,
            r#"eureka_eurekaapp_condition{eurekaapp_namespace="shop",eurekaapp="cart",type="Ready",status="false"} 1"#,
            r#"eureka_eurekaapp_selected_pods{eurekaapp_namespace="shop",eurekaapp="cart"} 4"#,
            r#"eureka_eurekaapp_awaiting_registration{eurekaapp_namespace="shop",eurekaapp="cart"} 1"#,
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line}:\n{t}");
        }
        figures.set(&key, None);
        assert!(!text(&figures).contains("cart"), "a deleted EurekaApp leaves no series");
        figures.set(&key, Some(&status));
        figures.forget(&key);
        assert!(!text(&figures).contains("cart"));
    }
}
