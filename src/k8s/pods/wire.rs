//! The slim wire types the pod watch deserializes: only the fields [`super::PodInfo`] projects,
//! with metadata read into an `ObjectMeta` that never builds managedFields; every other part of
//! the JSON is skipped without being allocated.

use super::*;

/// A Pod as the watch reads it: a kube `Resource` (kind `Pod`) with only what [`PodInfo`]
/// projects. Its metadata is an `ObjectMeta` (kube-runtime reads the resource version from it)
/// holding identity, labels, annotations, deletion and owners; managedFields are never built.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct WatchedPod {
    #[serde(default, deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<WatchedSpec>,
    #[serde(default)]
    pub status: Option<WatchedStatus>,
}

impl k8s_openapi::Resource for WatchedPod {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Pod";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "pods";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for WatchedPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The parts of `metadata` the watch and the projection read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SlimMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    deletion_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    owner_references: Option<Vec<OwnerReference>>,
}

pub(super) fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = SlimMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        labels: m.labels,
        annotations: m.annotations,
        deletion_timestamp: m.deletion_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        owner_references: m.owner_references,
        ..ObjectMeta::default()
    })
}

/// The parts of a Pod's `spec` the projection reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedSpec {
    pub containers: Option<Vec<WatchedContainer>>,
    pub readiness_gates: Option<Vec<WatchedGate>>,
    pub node_name: Option<String>,
    pub host_network: Option<bool>,
    pub hostname: Option<String>,
    pub subdomain: Option<String>,
    pub service_account_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct WatchedContainer {
    pub ports: Option<Vec<WatchedPort>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedPort {
    pub name: Option<String>,
    pub container_port: i32,
    pub protocol: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedGate {
    pub condition_type: String,
}

/// The parts of a Pod's `status` the projection reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedStatus {
    #[serde(rename = "podIPs")]
    pub pod_ips: Option<Vec<WatchedIp>>,
    #[serde(rename = "podIP")]
    pub pod_ip: Option<String>,
    #[serde(rename = "hostIP")]
    pub host_ip: Option<String>,
    pub conditions: Option<Vec<WatchedCondition>>,
    pub phase: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct WatchedIp {
    pub ip: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct WatchedCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, rename = "lastTransitionTime")]
    pub last_transition_time: Option<Time>,
}
