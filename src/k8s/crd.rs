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
    doc = "An EurekaApp turns the Pods its selector picks into instances of one Eureka application: registered by the operator from each Pod's readiness, termination and metadata (registration: Operator), or registered by the Pods' own Eureka clients and adopted (registration: Adopt). Every replica of the operator serves them to Eureka clients and Java Eureka peers.",
    printcolumn = r#"{"name":"App","type":"string","jsonPath":".status.appName"}"#,
    printcolumn = r#"{"name":"Selected","type":"integer","jsonPath":".status.selectedPods"}"#,
    printcolumn = r#"{"name":"Up","type":"integer","jsonPath":".status.instances.up"}"#,
    printcolumn = r#"{"name":"Out-of-service","type":"integer","jsonPath":".status.instances.outOfService"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
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
    /// {cluster} (the cluster id), {clusterName} (its readable name: StatefulSet pod names repeat
    /// across clusters, so ids shared between clusters should carry it). Must name the pod, its host name, its uid or its IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.contains('{pod.name}') || self.contains('{pod.hostname}') || self.contains('{pod.uid}') || self.contains('{pod.ip}')").message("instanceId must contain {pod.name}, {pod.hostname}, {pod.uid} or {pod.ip} so that it is unique per pod"))]
    pub instance_id: Option<String>,

    /// What `hostName` holds (a `preset` decides it when set): `PodIP` the pod IP (the default;
    /// Spring's `prefer-ip-address`); `PodName` the pod's name; `PodFQDN` its DNS name
    /// (`hostname.subdomain.<namespace>.svc.<domain>` when it has a subdomain, else
    /// `a-b-c-d.<namespace>.pod.<domain>`); `NodeIP` the node's IP (hostNetwork pods);
    /// `PodHostname` the host name Spring Cloud finds in the pod (`spring.cloud.client.hostname`:
    /// its `hostname`, else its name, fully qualified when it has a `subdomain`).
    #[serde(default)]
    pub host_name: HostNameMode,

    /// Which pod IP becomes `ipAddr` on a dual-stack pod: `IPv4` (the default) or `IPv6`.
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

    /// What a selected pod that is not Ready maps to: the Eureka status `STARTING` (the default),
    /// `DOWN` or `OUT_OF_SERVICE`, or `Deregister` (no instance until it is Ready; not with
    /// `registration: Adopt`).
    #[serde(default)]
    pub not_ready: NotReadyMapping,

    /// What a terminating pod (with a deletionTimestamp) maps to until the drain
    /// (`drainSeconds`) ends: `OUT_OF_SERVICE` (the default) or `DOWN`, or `Deregister`
    /// (deregistered at once, without a drain).
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

    /// Keep this app's instances in this cluster: never export them over links to other
    /// clusters' operators (see `--remote-clusters-file` on their side).
    #[serde(default)]
    pub cluster_local: bool,

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
    /// Pod fields added as `k8s.<field>` entries: `Namespace`, `PodName`, `PodUID`, `PodIP`,
    /// `NodeName`, `ServiceAccount`, `Workload` (`Kind/name` of the controlling owner).
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
    /// `leaseInfo.renewalIntervalInSecs` published with the instances (default 30): how often a
    /// Eureka client would renew. Pod instances do not expire; Java peers that hold copies of
    /// them get heartbeats from the operator at about this pace.
    #[serde(default = "default_renewal")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 3600").message("renewalIntervalSeconds must be between 1 and 3600"))]
    pub renewal_interval_seconds: i32,
    /// `leaseInfo.durationInSecs` published with the instances (default 90): how long a peer
    /// keeps an instance after its last renewal. Longer than `renewalIntervalSeconds`.
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
    /// The status every instance of the app shows, whatever its pod's state: `UP`, `DOWN` or
    /// `OUT_OF_SERVICE` (e.g. for maintenance). A REST override on one instance beats it.
    pub status: OverrideStatus,
    /// Why, for people reading `kubectl describe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A status override for the pods a selector picks.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SelectorOverride {
    /// The pods (among those `selector` selects) the override applies to.
    #[x_kube(validation = Rule::new("(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)").message("selector must have matchLabels or matchExpressions"))]
    pub selector: LabelSelector,
    /// The status their instances show, whatever their pods' state: `UP`, `DOWN` or
    /// `OUT_OF_SERVICE` (e.g. a canary held out of traffic).
    pub status: OverrideStatus,
    /// Why, for people reading `kubectl describe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What the operator observed and did.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EurekaAppStatus {
    /// The `metadata.generation` of the spec this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (every selected pod is registered as its state says), `Degraded` (the spec or a
    /// pod cannot be fully applied; the last valid plan is kept) and `Conflict` (an instance id
    /// is held by another pod or a foreign client), one of each type; `reason` and `message` say
    /// why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
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
    /// When the leader last wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceCounts {
    /// Instances in the registry for the selected pods.
    pub registered: i64,
    /// Of which adopted (registered by the pods' own clients).
    #[serde(default)]
    pub adopted: i64,
    /// Of which `UP`: what clients route to.
    pub up: i64,
    /// Of which `DOWN`.
    pub down: i64,
    /// Of which `STARTING` (by default, pods that are not Ready yet).
    pub starting: i64,
    /// Of which `OUT_OF_SERVICE` (by default, terminating pods while they drain, and overrides).
    pub out_of_service: i64,
    /// Of which `UNKNOWN`.
    pub unknown: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// The CustomResourceDefinition, as the cluster gets it: the derived one with each description's
/// doc-comment line breaks joined (paragraph breaks kept), so that `kubectl explain` wraps the
/// text to its own width instead of breaking it where the source did.
pub fn crd() -> serde_json::Value {
    use kube::CustomResourceExt;
    fn join_lines(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                for (key, value) in map.iter_mut() {
                    match value {
                        serde_json::Value::String(text) if key == "description" => {
                            *text = text
                                .split("\n\n")
                                .map(|paragraph| paragraph.split('\n').map(str::trim).collect::<Vec<_>>().join(" "))
                                .collect::<Vec<_>>()
                                .join("\n\n");
                        }
                        other => join_lines(other),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(join_lines),
            _ => {}
        }
    }
    let mut crd = serde_json::to_value(EurekaApp::crd()).expect("a CRD serializes");
    join_lines(&mut crd);
    crd
}

/// The CRD as YAML, as committed under `crds/`.
pub fn crd_yaml() -> Result<String, serde_saphyr::ser::Error> {
    let mut out = String::from("# Generated by `cargo run --bin crdgen`; do not edit.\n");
    out.push_str(&serde_saphyr::to_string(&crd())?);
    Ok(out)
}

/// The same CRD as a chart template, installed when `crds.install` is set and kept on uninstall
/// when `crds.keep` is (Helm never upgrades CRDs in a chart's `crds/` directory, so the chart
/// carries it as a template).
pub fn crd_helm_template() -> Result<String, serde_saphyr::ser::Error> {
    let yaml = serde_saphyr::to_string(&crd())?;
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
