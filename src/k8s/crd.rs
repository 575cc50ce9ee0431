//! The `EurekaApp` custom resource (`eureka-operator.dev/v1alpha1`): which Pods become which
//! Eureka instances, and how: registered by the operator, or registered by the pods' own Eureka
//! clients and adopted (`registration: Adopt`). Field names echo Spring's `eureka.instance.*`
//! where one exists. What can be checked at admission is checked there (schema and CEL rules); the
//! rest is reported in conditions.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::{
    apis::meta::v1::{Condition, LabelSelector, Time},
    util::intstr::IntOrString,
};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The API group of every resource of this operator.
pub const GROUP: &str = "eureka-operator.dev";
/// The finalizer versions before 0.2 put on every EurekaApp. This version adds none (a deletion
/// deregisters through the watch) and removes this one where it finds it, so that no EurekaApp
/// or namespace can wait on an operator that was uninstalled.
pub const LEGACY_FINALIZER: &str = "eureka-operator.dev/deregister";
/// Pod annotation holding a status override set through the Eureka REST API.
pub const STATUS_OVERRIDE_ANNOTATION: &str = "eureka-operator.dev/status-override";

/// Turns Pods selected by `selector` into instances of one Eureka application.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "eureka-operator.dev",
    version = "v1alpha1",
    kind = "EurekaApp",
    namespaced,
    status = "EurekaAppStatus",
    shortname = "ea",
    category = "eureka",
    printcolumn = r#"{"name":"App","type":"string","jsonPath":".status.appName"}"#,
    printcolumn = r#"{"name":"Selected","type":"integer","jsonPath":".status.selectedPods"}"#,
    printcolumn = r#"{"name":"Up","type":"integer","jsonPath":".status.instances.up"}"#,
    printcolumn = r#"{"name":"Out-of-service","type":"integer","jsonPath":".status.instances.outOfService"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Registration","type":"string","jsonPath":".spec.registration","priority":1}"#,
    printcolumn = r#"{"name":"Adopted","type":"integer","jsonPath":".status.instances.adopted","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.registration) || self.registration != 'Adopt' || !has(self.notReady) || self.notReady != 'Deregister'").message("notReady: Deregister cannot be used with registration: Adopt (the client would register again at its next heartbeat); use STARTING, DOWN or OUT_OF_SERVICE"))]
#[x_kube(validation = Rule::new("!has(self.preset) || !has(self.instanceId)").message("preset sets instanceId: set one or the other"))]
pub struct EurekaAppSpec {
    /// Which Pods in this namespace are instances. Must select something.
    #[x_kube(validation = Rule::new("(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)").message("selector must have matchLabels or matchExpressions"))]
    pub selector: LabelSelector,

    /// The Eureka application name (upper-cased on the wire). Defaults to metadata.name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z0-9][A-Za-z0-9._-]*$') && size(self) <= 200").message("appName must be letters, digits, '.', '_' or '-' (at most 200)"))]
    pub app_name: Option<String>,

    /// `vipAddress`; defaults to the lower-case app name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip_address: Option<String>,

    /// `secureVipAddress`; defaults to the VIP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_vip_address: Option<String>,

    /// The instance's port: a container port name or a number. Defaults to the first TCP container port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "port_ref_schema")]
    pub port: Option<IntOrString>,

    /// The secure (TLS) port, off unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_port: Option<SecurePort>,

    /// Who registers the selected pods: the operator (`Operator`, the default), or the pods' own
    /// Eureka clients, whose registrations the operator recognizes by pod IP and port and adopts
    /// (`Adopt`): never evicted while the pod runs, not counted toward self-preservation, with
    /// the pod's readiness and termination deciding their status and their end.
    #[serde(default)]
    pub registration: Registration,

    /// How `registration: Adopt` recognizes a pod's registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adoption: Option<AdoptionSpec>,

    /// Spring Cloud's defaults for the instance id and host name, so that a service moving between
    /// its own client and the operator keeps its instance ids: `Spring` gives
    /// `{pod.hostname}:{appName}:{port}` and the pod's host name; `SpringPreferIpAddress` the same
    /// id and the pod IP (`eureka.instance.prefer-ip-address`). Sets `instanceId` and `hostName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<Preset>,

    /// The instance id template. Placeholders: {pod.name}, {pod.namespace}, {pod.uid}, {pod.ip},
    /// {pod.hostname} (the pod's host name as Spring sees it), {node}, {appName}, {port},
    /// {cluster}. Must name the pod, its host name, its uid or its IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.contains('{pod.name}') || self.contains('{pod.hostname}') || self.contains('{pod.uid}') || self.contains('{pod.ip}')").message("instanceId must contain {pod.name}, {pod.hostname}, {pod.uid} or {pod.ip} so that it is unique per pod"))]
    pub instance_id: Option<String>,

    /// What `hostName` holds (a `preset` decides it when set).
    #[serde(default)]
    pub host_name: HostNameMode,

    /// Which pod IP becomes `ipAddr`.
    #[serde(default)]
    pub ip_family: IpFamily,

    /// Home, status and health URLs, built from paths and the instance's host and port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urls: Option<Urls>,

    /// A separate port (name or number) for the status and health URLs, e.g. Spring's management port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "port_ref_schema")]
    pub management_port: Option<IntOrString>,

    /// Instance metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<MetadataSpec>,

    /// The `zone` metadata entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<ZoneSpec>,

    /// Lease timing published to clients (and used toward Java peers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseSpec>,

    /// What a selected pod that is not Ready maps to.
    #[serde(default)]
    pub not_ready: NotReadyMapping,

    /// What a terminating pod (with a deletionTimestamp) maps to until the drain ends.
    #[serde(default)]
    pub terminating: TerminatingMapping,

    /// Seconds a terminating pod stays registered (with its `terminating` status) before it is
    /// deregistered, so clients' caches learn it is out first.
    #[serde(default = "default_drain_seconds")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 3600").message("drainSeconds must be between 0 and 3600"))]
    pub drain_seconds: i64,

    /// A status override for every instance of the app (e.g. maintenance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_override: Option<StatusOverride>,

    /// Status overrides for the pods a selector picks (e.g. a canary); the first match wins and
    /// beats the app-wide override.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub status_overrides: Vec<SelectorOverride>,

    /// Deregister every instance of this app and stop managing it until unset.
    #[serde(default)]
    pub suspend: bool,

    /// Make rollouts wait for Eureka: pods that list the condition in their
    /// `spec.readinessGates` become Ready only once the leader has seen their instance UP in the
    /// registry of every ready replica (and `delaySeconds` more have passed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_gate: Option<ReadinessGate>,
}

/// The pod readiness gate this operator sets (see `readinessGate`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadinessGate {
    /// The pod condition type (what pods list in `spec.readinessGates[].conditionType`).
    #[serde(default = "default_gate_condition")]
    #[x_kube(validation = Rule::new("self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$')").message("conditionType must be a qualified name such as eureka-operator.dev/registered"))]
    pub condition_type: String,

    /// Seconds to wait, once every replica has the instance UP, before the condition turns True:
    /// Eureka clients' registry refresh interval (30 s by default in Spring), so that clients have
    /// seen the new instance before the rollout removes an old one.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 600").message("delaySeconds must be between 0 and 600"))]
    pub delay_seconds: i64,
}

/// The condition type of the readiness gate, unless the EurekaApp names another.
pub const READINESS_GATE: &str = "eureka-operator.dev/registered";

fn default_gate_condition() -> String {
    READINESS_GATE.to_string()
}

fn default_drain_seconds() -> i64 {
    30
}

/// A container port name or number (1-65535).
fn port_ref_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "x-kubernetes-validations": [{
            "rule": "type(self) == int ? (self >= 1 && self <= 65535) : (size(self) >= 1 && size(self) <= 15)",
            "message": "a port must be a number from 1 to 65535 or a container port name of 1 to 15 characters"
        }]
    })
}

#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecurePort {
    /// A container port name or number.
    #[schemars(schema_with = "port_ref_schema")]
    pub port: IntOrString,
    /// Whether the secure port is enabled (default true once set).
    #[serde(default = "yes")]
    pub enabled: bool,
}

fn yes() -> bool {
    true
}

#[derive(schemars::JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HostNameMode {
    /// The pod IP (Spring's `prefer-ip-address`).
    #[default]
    PodIP,
    /// The pod name.
    PodName,
    /// The pod's DNS name: `hostname.subdomain.ns.svc.<domain>` when set, else `a-b-c-d.ns.pod.<domain>`.
    PodFQDN,
    /// The node IP (for hostNetwork pods).
    NodeIP,
    /// The pod's host name as Spring Cloud finds it (`spring.cloud.client.hostname`): its
    /// `hostname` (else its name), fully qualified when it has a `subdomain`.
    PodHostname,
}

/// Who registers a selected pod's instance.
#[derive(schemars::JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Registration {
    /// The operator registers an instance per pod.
    #[default]
    Operator,
    /// The pod's own Eureka client registers; the operator adopts that registration.
    Adopt,
}

/// How a pod's own registration is recognized.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionSpec {
    /// Adopt only a registration whose instance id is the one `instanceId` (or `preset`) gives
    /// the pod; by default any registration of the app from the pod's IP and port is adopted.
    #[serde(default)]
    pub match_instance_id: bool,
}

/// Spring Cloud Netflix's defaults for instance ids and host names.
#[derive(schemars::JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// `{pod.hostname}:{appName}:{port}` and `hostName: PodHostname` (Spring's defaults).
    Spring,
    /// `{pod.hostname}:{appName}:{port}` and `hostName: PodIP`
    /// (`eureka.instance.prefer-ip-address: true`, which does not change the id).
    SpringPreferIpAddress,
}

#[derive(schemars::JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IpFamily {
    #[default]
    IPv4,
    IPv6,
}

#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Urls {
    /// Path of `homePageUrl` (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home_page: Option<String>,
    /// Path of `statusPageUrl` (default `/actuator/info`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_page: Option<String>,
    /// Path of `healthCheckUrl` (default `/actuator/health`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<String>,
}

#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MetadataSpec {
    /// Fixed entries.
    #[serde(default, rename = "static", skip_serializing_if = "BTreeMap::is_empty")]
    pub static_: BTreeMap<String, String>,
    /// Pod labels copied into metadata (an allow-list of keys).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_labels: Vec<String>,
    /// Pod annotations copied into metadata (an allow-list of keys).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_annotations: Vec<String>,
    /// Pod fields added as `k8s.<field>` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_fields: Vec<PodField>,
}

#[derive(schemars::JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PodField {
    Namespace,
    PodName,
    PodUID,
    PodIP,
    NodeName,
    ServiceAccount,
    Workload,
}

#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ZoneSpec {
    /// Take `zone` from the node's `topology.kubernetes.io/zone` label (default true).
    #[serde(default = "yes")]
    pub from_node: bool,
    /// A fixed zone, used when the node has none (or `fromNode` is false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(KubeSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.durationSeconds > self.renewalIntervalSeconds").message("durationSeconds must be longer than renewalIntervalSeconds"))]
pub struct LeaseSpec {
    #[serde(default = "default_renewal")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 3600").message("renewalIntervalSeconds must be between 1 and 3600"))]
    pub renewal_interval_seconds: i32,
    #[serde(default = "default_duration")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 86400").message("durationSeconds must be between 1 and 86400"))]
    pub duration_seconds: i32,
}

fn default_renewal() -> i32 {
    30
}

fn default_duration() -> i32 {
    90
}

#[derive(schemars::JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NotReadyMapping {
    #[default]
    #[serde(rename = "STARTING")]
    Starting,
    #[serde(rename = "DOWN")]
    Down,
    #[serde(rename = "OUT_OF_SERVICE")]
    OutOfService,
    /// Not registered while not ready.
    Deregister,
}

#[derive(schemars::JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TerminatingMapping {
    #[default]
    #[serde(rename = "OUT_OF_SERVICE")]
    OutOfService,
    #[serde(rename = "DOWN")]
    Down,
    /// Deregistered at once, without a drain.
    Deregister,
}

#[derive(schemars::JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverrideStatus {
    #[serde(rename = "UP")]
    Up,
    #[serde(rename = "DOWN")]
    Down,
    #[serde(rename = "OUT_OF_SERVICE")]
    OutOfService,
}

#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StatusOverride {
    pub status: OverrideStatus,
    /// Why, for people reading `kubectl describe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SelectorOverride {
    #[x_kube(validation = Rule::new("(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)").message("selector must have matchLabels or matchExpressions"))]
    pub selector: LabelSelector,
    pub status: OverrideStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What the operator observed and did.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EurekaAppStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `Degraded`, `Conflict`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The Eureka application name in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_name: Option<String>,
    /// Pods the selector matches.
    #[serde(default)]
    pub selected_pods: i64,
    /// Registered instances by Eureka status (with `registration: Adopt`, the adopted ones).
    #[serde(default)]
    pub instances: InstanceCounts,
    /// With `registration: Adopt`: selected pods whose client has not registered yet.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub awaiting_registration: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceCounts {
    pub registered: i64,
    /// Of which adopted (registered by the pods' own clients).
    #[serde(default)]
    pub adopted: i64,
    pub up: i64,
    pub down: i64,
    pub starting: i64,
    pub out_of_service: i64,
    pub unknown: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// The CRD as YAML, as committed under `crds/`.
pub fn crd_yaml() -> Result<String, serde_saphyr::ser::Error> {
    use kube::CustomResourceExt;
    let mut out = String::from("# Generated by `cargo run --bin crdgen`; do not edit.\n");
    out.push_str(&serde_saphyr::to_string(&EurekaApp::crd())?);
    Ok(out)
}

/// The same CRD as a chart template, installed when `crds.install` is set and kept on uninstall
/// when `crds.keep` is (Helm never upgrades CRDs in a chart's `crds/` directory, so the chart
/// carries it as a template).
pub fn crd_helm_template() -> Result<String, serde_saphyr::ser::Error> {
    use kube::CustomResourceExt;
    let yaml = serde_saphyr::to_string(&EurekaApp::crd())?;
    let mut out = String::from("# Generated by `cargo run --bin crdgen -- --helm`; do not edit.\n");
    out.push_str("{{- if .Values.crds.install }}\n");
    for line in yaml.lines() {
        out.push_str(line);
        out.push('\n');
        if line == "metadata:" {
            out.push_str("  annotations:\n");
            out.push_str("    {{- if .Values.crds.keep }}\n    helm.sh/resource-policy: keep\n    {{- end }}\n");
            out.push_str("  labels:\n    {{- include \"eureka-operator.labels\" . | nindent 4 }}\n");
        }
    }
    out.push_str("{{- end }}\n");
    Ok(out)
}
