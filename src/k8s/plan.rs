//! Pure planning: from an `EurekaApp` and the pods of its namespace to the instances that should
//! be registered (or, with `registration: Adopt`, the claims on the pods' own registrations), and
//! the problems to report. No I/O, no clock (`now` comes in).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString};

use super::{
    crd::{
        EurekaAppSpec, HostNameMode, IpFamily, NotReadyMapping, OverrideStatus, PodField, Preset, Registration,
        STATUS_OVERRIDE_ANNOTATION, TerminatingMapping, Urls,
    },
    pods::{Labels, PodInfo},
};
use crate::registry::instance::keys;
use crate::registry::{
    Claim, ClaimKey, ClaimState, PodOverrides, PodOwner,
    instance::{CompactString, InstanceInfo, LeaseTerms, PortInfo, Status},
};

/// The default instance id: unique per pod (name and namespace) and port.
pub const DEFAULT_INSTANCE_ID: &str = "{pod.name}.{pod.namespace}:{appName}:{port}";

/// Spring Cloud Netflix's default instance id,
/// `${spring.cloud.client.hostname}:${spring.application.name}:${server.port}`.
pub const SPRING_INSTANCE_ID: &str = "{pod.hostname}:{appName}:{port}";

/// Facts from outside the EurekaApp.
pub struct Facts<'a> {
    pub cluster_id: &'a str,
    pub cluster_name: &'a str,
    pub cluster_domain: &'a str,
    /// `topology.kubernetes.io/zone` by node name.
    pub node_zones: &'a BTreeMap<String, String>,
    pub now: i64,
}

/// The EurekaApp being planned.
pub struct Target<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub spec: &'a EurekaAppSpec,
}

/// An instance that should be registered.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub owner: PodOwner,
    pub info: InstanceInfo,
    /// The overrides the pod's annotation and its EurekaApp ask for.
    pub overrides: PodOverrides,
}

/// Something wrong with an EurekaApp or one of its pods: what the `Degraded` and `Conflict`
/// conditions say and what Warning Events report (the reason is the Event's reason).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Problem {
    /// A spec error admission could not catch (an unknown selector operator, ...).
    InvalidSpec(String),
    /// The named port is not declared by any container of the pod.
    PortNotFound { pod: String, port: String },
    /// The pod has no address of the chosen family.
    NoAddress { pod: String, family: &'static str },
    /// The pod's status-override annotation is not a status.
    BadOverrideAnnotation { pod: String, value: String },
    /// An instance id is held by another EurekaApp or a natively registered client (the
    /// registry's message).
    InstanceIdConflict(String),
}

impl Problem {
    pub fn reason(&self) -> &'static str {
        match self {
            Problem::InvalidSpec(_) => "InvalidSpec",
            Problem::PortNotFound { .. } => "PortNotFound",
            Problem::NoAddress { .. } => "NoAddress",
            Problem::BadOverrideAnnotation { .. } => "BadOverrideAnnotation",
            Problem::InstanceIdConflict(_) => "InstanceIdConflict",
        }
    }

    pub fn message(&self) -> String {
        match self {
            Problem::InvalidSpec(m) | Problem::InstanceIdConflict(m) => m.clone(),
            Problem::PortNotFound { pod, port } => format!("pod {pod} declares no container port named {port:?}"),
            Problem::NoAddress { pod, family } => format!("pod {pod} has no {family} address"),
            Problem::BadOverrideAnnotation { pod, value } => {
                format!("pod {pod} has {STATUS_OVERRIDE_ANNOTATION}={value:?}, which is not a Eureka status")
            }
        }
    }
}

/// The plan for one EurekaApp.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Plan {
    /// The Eureka application name (upper case).
    pub app_name: String,
    pub desired: Vec<Desired>,
    /// Pods the selector matches (finished pods excluded).
    pub selected: usize,
    pub problems: Vec<Problem>,
    /// When a draining instance must go: reconcile again then.
    pub wake_at: Option<i64>,
    /// A spec error that admission could not catch. Nothing is planned; the instances the last
    /// valid spec produced are kept.
    pub invalid: Option<String>,
    /// Selected pods that could not be planned (a [`Problem`]): their current instances are kept
    /// as they are until the spec or the pod is fixed.
    pub held: Vec<String>,
    /// With `registration: Adopt`: what each selected pod with an address asks of its own
    /// client's registration (and `desired` is empty).
    pub claims: Vec<Claim>,
}

/// Whether `labels` match `selector` (`matchLabels` and `matchExpressions` ANDed).
pub fn selector_matches(selector: &LabelSelector, labels: &Labels) -> Result<bool, String> {
    for (k, v) in selector.match_labels.iter().flatten() {
        if labels.get(k) != Some(v.as_str()) {
            return Ok(false);
        }
    }
    for expr in selector.match_expressions.iter().flatten() {
        let value = labels.get(&expr.key);
        let values = expr.values.as_deref().unwrap_or(&[]);
        let listed = |v: &str| values.iter().any(|x| x == v);
        let ok = match expr.operator.as_str() {
            "In" => value.is_some_and(listed),
            "NotIn" => !value.is_some_and(listed),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => {
                return Err(format!(
                    "unknown selector operator {other:?} (use In, NotIn, Exists, DoesNotExist)"
                ));
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Checks what the schema cannot: known operators, and values where they belong.
pub fn validate_selector(selector: &LabelSelector) -> Result<(), String> {
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.as_ref().map_or(0, Vec::len);
        match e.operator.as_str() {
            "In" | "NotIn" if values == 0 => return Err(format!("{} {} needs values", e.key, e.operator)),
            "Exists" | "DoesNotExist" if values > 0 => {
                return Err(format!("{} {} takes no values", e.key, e.operator));
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => {
                return Err(format!(
                    "unknown selector operator {other:?} (use In, NotIn, Exists, DoesNotExist)"
                ));
            }
        }
    }
    Ok(())
}

/// A selector that is empty would select every pod; admission refuses it, this guards the rest.
fn selector_is_empty(selector: &LabelSelector) -> bool {
    selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && selector.match_expressions.as_ref().is_none_or(|e| e.is_empty())
}

/// The Eureka application name of an EurekaApp.
pub fn app_name(target: &Target<'_>) -> String {
    target
        .spec
        .app_name
        .clone()
        .unwrap_or_else(|| target.name.to_string())
        .to_ascii_uppercase()
}

fn override_status(s: OverrideStatus) -> Status {
    match s {
        OverrideStatus::Up => Status::Up,
        OverrideStatus::Down => Status::Down,
        OverrideStatus::OutOfService => Status::OutOfService,
    }
}

/// Resolves a port reference on a pod: a number as is, a name through its container ports.
fn resolve_port(port: &IntOrString, pod: &PodInfo) -> Result<i32, Problem> {
    match port {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(name) => pod
            .ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.port)
            .or_else(|| name.parse().ok())
            .ok_or_else(|| Problem::PortNotFound {
                pod: pod.name.to_string(),
                port: name.clone(),
            }),
    }
}

/// Resolves an optional port reference (`None` stays `None`).
fn resolve_optional(port: Option<&IntOrString>, pod: &PodInfo) -> Result<Option<i32>, Problem> {
    port.map(|p| resolve_port(p, pod)).transpose()
}

/// A metadata key that is safe as an XML element name (XStream writes keys as elements).
pub fn metadata_key(key: &str) -> String {
    let mut out: String = key
        .chars()
        .map(|c| match c {
            '/' => '.',
            c if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') => c,
            _ => '_',
        })
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        out.insert(0, '_');
    }
    out
}

fn expand(template: &str, vars: &[(&str, &str)]) -> String {
    let mut out = template.to_string();
    for (k, v) in vars {
        out = out.replace(&format!("{{{k}}}"), v);
    }
    out
}

/// The status a pod's state maps to, or `None` when it should not be registered.
fn pod_state(spec: &EurekaAppSpec, pod: &PodInfo, now: i64) -> (Option<Status>, Option<i64>) {
    if let Some(since) = pod.deleting_since {
        if spec.terminating == TerminatingMapping::Deregister {
            return (None, None);
        }
        let until = since + spec.drain_seconds * 1000;
        if now >= until {
            return (None, None);
        }
        let status = match spec.terminating {
            TerminatingMapping::Down => Status::Down,
            _ => Status::OutOfService,
        };
        return (Some(status), Some(until));
    }
    let gate = spec.readiness_gate.as_ref().map(|g| g.condition_type.as_str());
    if pod.ready_for(gate) {
        return (Some(Status::Up), None);
    }
    let status = match spec.not_ready {
        NotReadyMapping::Starting => Status::Starting,
        NotReadyMapping::Down => Status::Down,
        NotReadyMapping::OutOfService => Status::OutOfService,
        NotReadyMapping::Deregister => return (None, None),
    };
    (Some(status), None)
}

/// Plans one EurekaApp over the pods of its namespace.
pub fn plan<'p>(target: &Target<'_>, pods: impl IntoIterator<Item = &'p PodInfo>, ctx: &Facts<'_>) -> Plan {
    let spec = target.spec;
    let mut plan = Plan {
        app_name: app_name(target),
        ..Plan::default()
    };
    let selected = match select(spec, pods) {
        Ok(selected) => selected,
        Err(invalid) => {
            plan.invalid = Some(invalid);
            return plan;
        }
    };
    plan.selected = selected.len();
    let common = Common::of(target, &plan.app_name);
    if spec.registration == Registration::Adopt {
        if spec.not_ready == NotReadyMapping::Deregister {
            plan.invalid = Some(
                "notReady: Deregister cannot be used with registration: Adopt (the client would register again)".into(),
            );
            return plan;
        }
        for pod in selected {
            if let (_, Some(until)) = pod_state(spec, pod, ctx.now) {
                plan.wake_at = Some(plan.wake_at.map_or(until, |w| w.min(until)));
            }
            match claim(&common, pod, ctx, &mut plan.problems) {
                Ok(Some(claim)) => plan.claims.push(claim),
                Ok(None) => {}
                Err(problem) => {
                    plan.held.push(pod.name.to_string());
                    plan.problems.push(problem);
                }
            }
        }
        return plan;
    }
    for pod in selected {
        let (status, drain_until) = pod_state(spec, pod, ctx.now);
        if let Some(until) = drain_until {
            plan.wake_at = Some(plan.wake_at.map_or(until, |w| w.min(until)));
        }
        let Some(status) = status else { continue };
        match pod_instance(&common, pod, status, ctx, &mut plan.problems) {
            Ok(Some(desired)) => plan.desired.push(desired),
            // No address yet: a pod being scheduled; it registers once it has one.
            Ok(None) => {}
            Err(problem) => {
                plan.held.push(pod.name.to_string());
                plan.problems.push(problem);
            }
        }
    }
    plan
}

/// The selected pods (finished ones excluded), sorted by name; `Err` for a spec that admission
/// could not refuse (an empty selector, an unknown operator).
fn select<'p>(spec: &EurekaAppSpec, pods: impl IntoIterator<Item = &'p PodInfo>) -> Result<Vec<&'p PodInfo>, String> {
    if selector_is_empty(&spec.selector) {
        return Err("the selector is empty and would select every pod".into());
    }
    let selectors = std::iter::once(&spec.selector).chain(spec.status_overrides.iter().map(|o| &o.selector));
    for selector in selectors {
        validate_selector(selector).map_err(|e| format!("invalid selector: {e}"))?;
    }
    let mut selected = Vec::new();
    for pod in pods {
        if selector_matches(&spec.selector, &pod.labels).map_err(|e| format!("invalid selector: {e}"))?
            && !pod.finished()
        {
            selected.push(pod);
        }
    }
    selected.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(selected)
}

/// What every instance of one EurekaApp shares.
struct Common<'a> {
    target: &'a Target<'a>,
    app: &'a str,
    app_lower: String,
    vip: String,
    secure_vip: String,
    template: &'a str,
    urls: Urls,
    lease: Option<LeaseTerms>,
}

impl<'a> Common<'a> {
    fn of(target: &'a Target<'a>, app: &'a str) -> Common<'a> {
        let spec = target.spec;
        let app_lower = app.to_ascii_lowercase();
        let vip = spec.vip_address.clone().unwrap_or_else(|| app_lower.clone());
        Common {
            target,
            app,
            secure_vip: spec.secure_vip_address.clone().unwrap_or_else(|| vip.clone()),
            vip,
            app_lower,
            template: match spec.preset {
                Some(_) => SPRING_INSTANCE_ID,
                None => spec.instance_id.as_deref().unwrap_or(DEFAULT_INSTANCE_ID),
            },
            urls: spec.urls.clone().unwrap_or_default(),
            lease: spec.lease.map(|l| LeaseTerms {
                renewal_interval_secs: l.renewal_interval_seconds,
                duration_secs: l.duration_seconds,
            }),
        }
    }
}

/// The ports one pod's instance uses.
struct Ports {
    port: i32,
    /// The secure port and whether it is enabled.
    secure: Option<(i32, bool)>,
    management: Option<i32>,
}

fn ports(spec: &EurekaAppSpec, pod: &PodInfo) -> Result<Ports, Problem> {
    let port = match &spec.port {
        Some(p) => resolve_port(p, pod)?,
        None => pod
            .ports
            .iter()
            .find(|p| &*p.protocol == "TCP")
            .map(|p| p.port)
            .unwrap_or(8080),
    };
    let secure = match &spec.secure_port {
        Some(s) => Some((resolve_port(&s.port, pod)?, s.enabled)),
        None => None,
    };
    let management = resolve_optional(spec.management_port.as_ref(), pod)?;
    Ok(Ports {
        port,
        secure,
        management,
    })
}

/// The pod IP of the family the EurekaApp asks for. `Ok(None)` while the pod has no IP at all.
fn pod_ip(spec: &EurekaAppSpec, pod: &PodInfo) -> Result<Option<String>, Problem> {
    let (family, want_v6) = match spec.ip_family {
        IpFamily::IPv4 => ("IPv4", false),
        IpFamily::IPv6 => ("IPv6", true),
    };
    match pod.ips.iter().find(|ip| ip.contains(':') == want_v6) {
        Some(ip) => Ok(Some(ip.to_string())),
        None if pod.ips.is_empty() => Ok(None),
        None => Err(Problem::NoAddress {
            pod: pod.name.to_string(),
            family,
        }),
    }
}

/// The pod's host name as Spring Cloud finds it inside the pod (`InetAddress.getHostName()` of
/// its address, answered from the `/etc/hosts` the kubelet writes): `hostname.subdomain.ns.svc.
/// <domain>` when the pod has a subdomain, else its `hostname`, else its name.
pub fn pod_hostname(pod: &PodInfo, cluster_domain: &str) -> String {
    let host = pod.hostname.clone().unwrap_or_else(|| pod.name.to_string());
    match &pod.subdomain {
        Some(sub) => format!("{host}.{sub}.{}.svc.{cluster_domain}", pod.namespace),
        None => host,
    }
}

/// The instance's `hostName`.
fn host_name(spec: &EurekaAppSpec, pod: &PodInfo, ip: &str, ctx: &Facts<'_>) -> String {
    let mode = match spec.preset {
        Some(Preset::Spring) => HostNameMode::PodHostname,
        Some(Preset::SpringPreferIpAddress) => HostNameMode::PodIP,
        None => spec.host_name,
    };
    match mode {
        HostNameMode::PodHostname => pod_hostname(pod, ctx.cluster_domain),
        HostNameMode::PodIP => ip.to_string(),
        HostNameMode::PodName => pod.name.to_string(),
        HostNameMode::PodFQDN => match (&pod.hostname, &pod.subdomain) {
            (Some(h), Some(s)) => format!("{h}.{s}.{}.svc.{}", pod.namespace, ctx.cluster_domain),
            _ => format!(
                "{}.{}.pod.{}",
                ip.replace(['.', ':'], "-"),
                pod.namespace,
                ctx.cluster_domain
            ),
        },
        HostNameMode::NodeIP => pod.host_ip.as_deref().unwrap_or(ip).to_string(),
    }
}

/// One pod's instance: `Ok(None)` while it has no address yet, `Err` for a problem that keeps it
/// from being planned (its current instance, if any, is then kept as it is). Problems that do not
/// (a bad override annotation) are pushed to `problems`.
fn pod_instance(
    c: &Common<'_>,
    pod: &PodInfo,
    status: Status,
    ctx: &Facts<'_>,
    problems: &mut Vec<Problem>,
) -> Result<Option<Desired>, Problem> {
    let spec = c.target.spec;
    let Some(ip) = pod_ip(spec, pod)? else {
        return Ok(None);
    };
    let ports = ports(spec, pod)?;
    let host = host_name(spec, pod, &ip, ctx);
    let id = instance_id(c, pod, &ip, ports.port, ctx);
    let mut info = InstanceInfo::new(c.app, &host, &ip, ctx.now);
    info.instance_id = Some(id.into());
    info.status = status;
    info.port = PortInfo {
        port: ports.port,
        enabled: true,
    };
    info.secure_port = match ports.secure {
        Some((port, enabled)) => PortInfo { port, enabled },
        None => PortInfo {
            port: 443,
            enabled: false,
        },
    };
    if let Some(l) = c.lease {
        info.lease = l;
    }
    info.vip_address = Some(c.vip.as_str().into());
    info.secure_vip_address = Some(c.secure_vip.as_str().into());
    set_urls(&mut info, &c.urls, &host, &ports);
    set_metadata(&mut info.metadata, c.target, pod, &ip, ports.management, ctx);
    let overrides = overrides(spec, pod, problems);
    Ok(Some(Desired {
        owner: PodOwner {
            namespace: (*pod.namespace).into(),
            eureka_app: c.target.name.into(),
            pod: (*pod.name).into(),
        },
        info,
        overrides,
    }))
}

/// The instance id the template gives a pod.
fn instance_id(c: &Common<'_>, pod: &PodInfo, ip: &str, port: i32, ctx: &Facts<'_>) -> String {
    let port_s = port.to_string();
    let uid = pod.uid.to_string();
    let hostname = pod_hostname(pod, ctx.cluster_domain);
    expand(
        c.template,
        &[
            ("pod.name", &pod.name),
            ("pod.namespace", &pod.namespace),
            ("pod.uid", &uid),
            ("pod.ip", ip),
            ("pod.hostname", &hostname),
            ("node", pod.node_name.as_deref().unwrap_or("")),
            ("appName", &c.app_lower),
            ("port", &port_s),
            ("cluster", ctx.cluster_id),
            ("clusterName", ctx.cluster_name),
        ],
    )
}

/// What a selected pod of an adopting EurekaApp asks of its own client's registration: `Ok(None)`
/// while it has no address yet, `Err` for a problem that keeps it from being planned.
fn claim(
    c: &Common<'_>,
    pod: &PodInfo,
    ctx: &Facts<'_>,
    problems: &mut Vec<Problem>,
) -> Result<Option<Claim>, Problem> {
    let spec = c.target.spec;
    let Some(ip) = pod_ip(spec, pod)? else {
        return Ok(None);
    };
    let port = ports(spec, pod)?.port;
    let overrides = overrides(spec, pod, problems);
    let state = match pod_state(spec, pod, ctx.now).0 {
        Some(status) => ClaimState::Live {
            status,
            spec: overrides.annotation.unwrap_or(overrides.spec),
        },
        // Terminating past the drain (or `terminating: Deregister`); `notReady: Deregister` is
        // refused before this.
        None => ClaimState::Drained,
    };
    let match_id = spec.adoption.is_some_and(|a| a.match_instance_id);
    Ok(Some(Claim {
        owner: PodOwner {
            namespace: (*pod.namespace).into(),
            eureka_app: c.target.name.into(),
            pod: (*pod.name).into(),
        },
        key: ClaimKey {
            app: c.app.to_string(),
            ip: ip.clone(),
            port,
        },
        instance_id: match_id.then(|| instance_id(c, pod, &ip, port, ctx)),
        state,
        linger_ms: spec.drain_seconds.max(0).saturating_mul(1000),
    }))
}

/// Home, status and health URLs (status and health on the management port if there is one).
fn set_urls(info: &mut InstanceInfo, urls: &Urls, host: &str, ports: &Ports) {
    let url_host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let port = ports.port;
    let mgmt = ports.management.unwrap_or(port);
    let url = |scheme: &str, port: i32, p: &Option<String>, default: &str| -> Option<CompactString> {
        let path = p.as_deref().unwrap_or(default);
        Some(format!("{scheme}://{url_host}:{port}{path}").into())
    };
    info.home_page_url = url("http", port, &urls.home_page, "/");
    info.status_page_url = url("http", mgmt, &urls.status_page, "/actuator/info");
    info.health_check_url = url("http", mgmt, &urls.health_check, "/actuator/health");
    if let Some((sp, true)) = ports.secure {
        info.set_secure_health_check_url(url("https", sp, &urls.health_check, "/actuator/health"));
    }
}

/// Metadata: static, allow-listed labels and annotations, pod fields, zone, management port, and
/// the ownership keys last (nothing can overwrite them).
fn set_metadata(
    md: &mut crate::registry::instance::Metadata,
    target: &Target<'_>,
    pod: &PodInfo,
    ip: &str,
    management: Option<i32>,
    ctx: &Facts<'_>,
) {
    let spec = target.spec;
    if let Some(m) = &spec.metadata {
        for (k, v) in &m.static_ {
            md.insert(metadata_key(k), v.clone());
        }
        for k in &m.from_labels {
            if let Some(v) = pod.labels.get(k) {
                md.insert(metadata_key(k), v);
            }
        }
        for k in &m.from_annotations {
            if let Some(v) = pod.annotations.get(k) {
                md.insert(metadata_key(k), v);
            }
        }
        for f in &m.pod_fields {
            let (key, value) = match f {
                PodField::Namespace => ("k8s.namespace", Some(pod.namespace.to_string())),
                PodField::PodName => ("k8s.podName", Some(pod.name.to_string())),
                PodField::PodUID => ("k8s.podUid", Some(pod.uid.to_string())),
                PodField::PodIP => ("k8s.podIp", Some(ip.to_string())),
                PodField::NodeName => ("k8s.node", pod.node_name.as_deref().map(str::to_string)),
                PodField::ServiceAccount => ("k8s.serviceAccount", pod.service_account.as_deref().map(str::to_string)),
                PodField::Workload => ("k8s.workload", pod.workload.as_deref().map(str::to_string)),
            };
            if let Some(v) = value {
                md.insert(key, v);
            }
        }
    }
    let zone_spec = spec.zone.clone().unwrap_or(super::crd::ZoneSpec {
        from_node: true,
        value: None,
    });
    let node_zone = if zone_spec.from_node {
        pod.node_name.as_deref().and_then(|n| ctx.node_zones.get(n))
    } else {
        None
    };
    if let Some(zone) = node_zone.cloned().or(zone_spec.value) {
        md.insert("zone", zone);
    }
    if let Some(m) = management {
        md.insert("management.port", m.to_string());
    }
    md.insert(keys::OWNER, keys::OWNER_VALUE);
    md.insert(keys::CLUSTER, ctx.cluster_id);
    md.insert(keys::CLUSTER_NAME, ctx.cluster_name);
    md.insert(keys::NAMESPACE, pod.namespace.to_string());
    md.insert(keys::EUREKA_APP, target.name);
    md.insert(keys::POD, pod.name.to_string());
}

/// The overrides Kubernetes holds for a pod: its REST-set annotation; the EurekaApp's first
/// matching selector, else its app-wide one (the registry decides which applies).
fn overrides(spec: &EurekaAppSpec, pod: &PodInfo, problems: &mut Vec<Problem>) -> PodOverrides {
    let annotated = pod
        .annotations
        .get(STATUS_OVERRIDE_ANNOTATION)
        .and_then(|v| match Status::parse_exact(v) {
            Some(s) => Some(s),
            None => {
                problems.push(Problem::BadOverrideAnnotation {
                    pod: pod.name.to_string(),
                    value: v.to_string(),
                });
                None
            }
        });
    let by_selector = spec
        .status_overrides
        .iter()
        .find(|o| selector_matches(&o.selector, &pod.labels).unwrap_or(false))
        .map(|o| override_status(o.status));
    let app_wide = spec.status_override.as_ref().map(|o| override_status(o.status));
    PodOverrides {
        annotation: annotated,
        spec: by_selector.or(app_wide).unwrap_or(Status::Unknown),
    }
}

#[cfg(test)]
pub(crate) mod tests;
