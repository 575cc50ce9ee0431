//! JSON as the Java server writes and reads it (`EurekaJacksonCodec`): root wrappers, the
//! `{"$": 8080, "@enabled": "true"}` ports, the phantom `@class` markers, and the `@Auto` fields
//! written as strings in field-declaration order.

use serde_json::{Map, Value};

use super::{DataCenter, DecodeError};
use crate::registry::{
    instance::{ActionType, DataCenterInfo, DataCenterName, InstanceInfo, LeaseTerms, Metadata, PortInfo, Status},
    view::{AppView, AppsView, InstanceView},
};

const EMPTY_MAP_CLASS: &str = "java.util.Collections$EmptyMap";

// === writing ===

fn string(out: &mut Vec<u8>, s: &str) {
    // serde_json escapes exactly what JSON requires; writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn key(out: &mut Vec<u8>, first: &mut bool, name: &str) {
    if !*first {
        out.push(b',');
    }
    *first = false;
    string(out, name);
    out.push(b':');
}

fn str_field(out: &mut Vec<u8>, first: &mut bool, name: &str, value: &str) {
    key(out, first, name);
    string(out, value);
}

fn opt_field(out: &mut Vec<u8>, first: &mut bool, name: &str, value: Option<&str>) {
    if let Some(v) = value {
        str_field(out, first, name, v);
    }
}

fn num_field(out: &mut Vec<u8>, first: &mut bool, name: &str, value: i64) {
    key(out, first, name);
    out.extend_from_slice(value.to_string().as_bytes());
}

fn port(out: &mut Vec<u8>, first: &mut bool, name: &str, p: PortInfo) {
    key(out, first, name);
    out.extend_from_slice(b"{\"$\":");
    out.extend_from_slice(p.port.to_string().as_bytes());
    out.extend_from_slice(if p.enabled {
        b",\"@enabled\":\"true\"}"
    } else {
        b",\"@enabled\":\"false\"}"
    });
}

fn metadata(out: &mut Vec<u8>, m: &Metadata) {
    out.push(b'{');
    if m.is_empty() {
        out.extend_from_slice(b"\"@class\":");
        string(out, EMPTY_MAP_CLASS);
    } else {
        let mut first = true;
        for (k, v) in m.iter() {
            str_field(out, &mut first, k, v);
        }
    }
    out.push(b'}');
}

/// The body of an instance object (without a root wrapper).
pub fn instance(out: &mut Vec<u8>, view: &InstanceView) {
    let i = &*view.info;
    let l = &view.lease;
    let mut first = true;
    out.push(b'{');
    opt_field(out, &mut first, "instanceId", i.instance_id.as_deref());
    str_field(out, &mut first, "hostName", &i.host_name);
    str_field(out, &mut first, "app", &i.app);
    str_field(out, &mut first, "ipAddr", &i.ip_addr);
    if i.sid != "na" && i.sid != "unknown" {
        str_field(out, &mut first, "sid", &i.sid);
    }
    str_field(out, &mut first, "status", i.status.as_str());
    str_field(out, &mut first, "overriddenStatus", i.overridden_status.as_str());
    port(out, &mut first, "port", i.port);
    port(out, &mut first, "securePort", i.secure_port);
    num_field(out, &mut first, "countryId", i64::from(i.country_id));

    key(out, &mut first, "dataCenterInfo");
    out.push(b'{');
    let mut f = true;
    str_field(out, &mut f, "@class", i.data_center_info.class());
    str_field(out, &mut f, "name", i.data_center_info.name.as_str());
    if i.data_center_info.name == DataCenterName::Amazon {
        key(out, &mut f, "metadata");
        metadata(out, &i.data_center_info.metadata);
    }
    out.push(b'}');

    key(out, &mut first, "leaseInfo");
    out.push(b'{');
    let mut f = true;
    num_field(out, &mut f, "renewalIntervalInSecs", i64::from(l.renewal_interval_secs));
    num_field(out, &mut f, "durationInSecs", i64::from(l.duration_secs));
    num_field(out, &mut f, "registrationTimestamp", l.registration_ts);
    num_field(out, &mut f, "lastRenewalTimestamp", l.last_renewal_ts);
    num_field(out, &mut f, "evictionTimestamp", l.eviction_ts);
    num_field(out, &mut f, "serviceUpTimestamp", l.service_up_ts);
    out.push(b'}');

    key(out, &mut first, "metadata");
    metadata(out, &i.metadata);

    opt_field(out, &mut first, "appGroupName", i.app_group_name.as_deref());
    opt_field(out, &mut first, "homePageUrl", i.home_page_url.as_deref());
    opt_field(out, &mut first, "statusPageUrl", i.status_page_url.as_deref());
    opt_field(out, &mut first, "healthCheckUrl", i.health_check_url.as_deref());
    opt_field(
        out,
        &mut first,
        "secureHealthCheckUrl",
        i.secure_health_check_url.as_deref(),
    );
    opt_field(out, &mut first, "vipAddress", i.vip_address.as_deref());
    opt_field(out, &mut first, "secureVipAddress", i.secure_vip_address.as_deref());
    // The server recomputes this on every read: true only for its own registration.
    str_field(out, &mut first, "isCoordinatingDiscoveryServer", "false");
    str_field(
        out,
        &mut first,
        "lastUpdatedTimestamp",
        &i.last_updated_timestamp.to_string(),
    );
    str_field(
        out,
        &mut first,
        "lastDirtyTimestamp",
        &i.last_dirty_timestamp.to_string(),
    );
    opt_field(out, &mut first, "actionType", i.action_type.map(ActionType::as_str));
    opt_field(out, &mut first, "asgName", i.asg_name.as_deref());
    out.push(b'}');
}

fn application_body(out: &mut Vec<u8>, app: &AppView) {
    out.extend_from_slice(b"{\"name\":");
    string(out, &app.name);
    out.extend_from_slice(b",\"instance\":[");
    for (n, i) in app.instances.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        instance(out, i);
    }
    out.extend_from_slice(b"]}");
}

/// One application's object inside an `applications` document.
pub fn application_fragment(app: &AppView) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + app.instances.len() * 1100);
    application_body(&mut out, app);
    out
}

/// `{"applications":{"versions__delta":"1","apps__hashcode":"UP_1_","application":[`: an
/// `applications` document up to its first application.
pub fn applications_head(versions_delta: i64, apps_hashcode: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(96 + apps_hashcode.len());
    out.extend_from_slice(b"{\"applications\":{\"versions__delta\":");
    string(&mut out, &versions_delta.to_string());
    out.extend_from_slice(b",\"apps__hashcode\":");
    string(&mut out, apps_hashcode);
    out.extend_from_slice(b",\"application\":[");
    out
}

/// What closes an `applications` document after its last application.
pub const APPLICATIONS_TAIL: &[u8] = b"]}}";

/// `{"applications":{"versions__delta":"1","apps__hashcode":"UP_1_","application":[...]}}`.
pub fn applications(view: &AppsView) -> Vec<u8> {
    super::encode_apps(view, super::Format::Json)
}

/// `{"application":{"name":"X","instance":[...]}}`.
pub fn application(app: &AppView) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + app.instances.len() * 1100);
    out.extend_from_slice(b"{\"application\":");
    application_body(&mut out, app);
    out.push(b'}');
    out
}

/// `{"instance":{...}}`.
pub fn instance_document(view: &InstanceView) -> Vec<u8> {
    let mut out = Vec::with_capacity(1200);
    out.extend_from_slice(b"{\"instance\":");
    instance(&mut out, view);
    out.push(b'}');
    out
}

// === reading ===

/// Java's `getValueAsLong`/`getValueAsInt`: numbers, numeric strings; anything else is 0.
fn as_i64(v: &Value) -> i64 {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)).unwrap_or(0),
        Value::String(s) => s.trim().parse::<i64>().unwrap_or(0),
        Value::Bool(b) => i64::from(*b),
        _ => 0,
    }
}

fn as_i32(v: &Value) -> i32 {
    as_i64(v).clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

/// Java's `getValueAsBoolean`: true, "true" (any case), or a non-zero number.
fn as_bool(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::String(s) => s.trim().eq_ignore_ascii_case("true"),
        Value::Number(n) => n.as_i64().is_some_and(|x| x != 0),
        _ => false,
    }
}

/// A scalar as text (metadata values: numbers become their text, `null` becomes "null").
fn as_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => Some("null".to_string()),
        _ => None,
    }
}

fn port_of(v: &Value, default: PortInfo) -> Result<PortInfo, DecodeError> {
    let obj = v
        .as_object()
        .ok_or_else(|| DecodeError::new("port must be an object like {\"$\": 8080, \"@enabled\": \"true\"}"))?;
    let mut p = default;
    if let Some(n) = obj.get("$").filter(|v| !v.is_null()) {
        p.port = as_i32(n);
    }
    if let Some(e) = obj.get("@enabled").filter(|v| !v.is_null()) {
        p.enabled = as_bool(e);
    }
    Ok(p)
}

fn metadata_of(v: &Value) -> Result<Metadata, DecodeError> {
    let obj = v
        .as_object()
        .ok_or_else(|| DecodeError::new("metadata must be an object"))?;
    obj.iter()
        .filter(|(k, _)| *k != "@class")
        .map(|(k, v)| {
            as_text(v)
                .map(|text| (k.clone(), text))
                .ok_or_else(|| DecodeError::new(format!("metadata value of {k} must be a string")))
        })
        .collect()
}

/// `None` when the object has no `name` (a validation error, not a decode error).
fn data_center_of(v: &Value) -> Result<Option<DataCenterInfo>, DecodeError> {
    let obj = v
        .as_object()
        .ok_or_else(|| DecodeError::new("dataCenterInfo must be an object"))?;
    let class = obj
        .get("@class")
        .and_then(Value::as_str)
        .ok_or_else(|| DecodeError::new("dataCenterInfo needs an @class"))?;
    let Some(name) = obj.get("name").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let name = name.as_str().unwrap_or("");
    let name = DataCenterName::parse_exact(name)
        .ok_or_else(|| DecodeError::new(format!("unknown dataCenterInfo name {name:?}")))?;
    let amazon_class = class == "com.netflix.appinfo.AmazonInfo";
    if amazon_class != (name == DataCenterName::Amazon) {
        return Err(DecodeError::new(format!(
            "dataCenterInfo @class {class} does not match name {}",
            name.as_str()
        )));
    }
    let metadata = match obj.get("metadata") {
        Some(m) if name == DataCenterName::Amazon && !m.is_null() => metadata_of(m)?,
        _ => Metadata::new(),
    };
    Ok(Some(DataCenterInfo { name, metadata }))
}

fn lease_of(v: &Value) -> Result<LeaseTerms, DecodeError> {
    let obj = v
        .as_object()
        .ok_or_else(|| DecodeError::new("leaseInfo must be an object"))?;
    let get = |k: &str| obj.get(k).filter(|v| !v.is_null()).map(as_i32).unwrap_or(0);
    Ok(LeaseTerms {
        renewal_interval_secs: get("renewalIntervalInSecs"),
        duration_secs: get("durationInSecs"),
    })
}

fn opt_string(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => as_text(other),
    }
}

/// An instance object (already unwrapped), with Java's defaults for what is missing and
/// `now` as the dirty/updated timestamps when absent, and whether it had a (named) `dataCenterInfo`.
pub fn instance_from_value(v: &Value, now: i64) -> Result<(InstanceInfo, DataCenter), DecodeError> {
    let obj: &Map<String, Value> = v
        .as_object()
        .ok_or_else(|| DecodeError::new("instance must be an object"))?;
    let mut i = InstanceInfo::new("", "", "", now);
    i.host_name.clear();
    let mut data_center = DataCenter::Missing;
    for (k, v) in obj {
        if v.is_null() {
            continue;
        }
        match k.as_str() {
            "instanceId" => i.instance_id = opt_string(v),
            "hostName" => i.host_name = opt_string(v).unwrap_or_default(),
            "app" => i.app = opt_string(v).unwrap_or_default().to_ascii_uppercase(),
            "ipAddr" => i.ip_addr = opt_string(v).unwrap_or_default(),
            "sid" => i.sid = opt_string(v).unwrap_or_default(),
            "status" => i.status = v.as_str().and_then(Status::parse_exact).unwrap_or(Status::Unknown),
            "overriddenStatus" | "overriddenstatus" => {
                i.overridden_status = v.as_str().and_then(Status::parse_exact).unwrap_or(Status::Unknown)
            }
            "port" => i.port = port_of(v, i.port)?,
            "securePort" => i.secure_port = port_of(v, i.secure_port)?,
            "countryId" => i.country_id = as_i32(v),
            "dataCenterInfo" => match data_center_of(v)? {
                Some(dc) => {
                    i.data_center_info = dc;
                    data_center = DataCenter::Named;
                }
                None => data_center = DataCenter::Unnamed,
            },
            "leaseInfo" => i.lease = lease_of(v)?,
            "metadata" => i.metadata = metadata_of(v)?,
            "appGroupName" => i.app_group_name = opt_string(v).map(|s| s.to_ascii_uppercase()),
            "homePageUrl" => i.home_page_url = opt_string(v),
            "statusPageUrl" => i.status_page_url = opt_string(v),
            "healthCheckUrl" => i.health_check_url = opt_string(v),
            "secureHealthCheckUrl" => i.secure_health_check_url = opt_string(v),
            "vipAddress" => i.vip_address = opt_string(v),
            "secureVipAddress" => i.secure_vip_address = opt_string(v),
            "lastUpdatedTimestamp" => i.last_updated_timestamp = as_i64(v),
            "lastDirtyTimestamp" => i.last_dirty_timestamp = as_i64(v),
            "actionType" => i.action_type = v.as_str().and_then(ActionType::parse_exact),
            "asgName" => i.asg_name = opt_string(v),
            // Unknown keys (and isCoordinatingDiscoveryServer, which the server recomputes) are ignored.
            _ => {}
        }
    }
    Ok((i, data_center))
}

/// A registration body: `{"instance": {...}}`.
pub fn instance_document_from_slice(body: &[u8], now: i64) -> Result<(InstanceInfo, DataCenter), DecodeError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| DecodeError::new(format!("invalid JSON: {e}")))?;
    let root = v
        .as_object()
        .ok_or_else(|| DecodeError::new("the body must be a JSON object"))?;
    let inner = root.get("instance").ok_or_else(|| {
        let first = root.keys().next().map(String::as_str).unwrap_or("");
        DecodeError::new(format!("Root name '{first}' does not match expected ('instance')"))
    })?;
    instance_from_value(inner, now)
}

fn one_or_many(v: &Value) -> Vec<&Value> {
    match v {
        Value::Array(a) => a.iter().collect(),
        Value::Null => Vec::new(),
        other => vec![other],
    }
}

/// The instances of an `{"applications": ...}` document (a peer's full registry); `application`
/// and `instance` may be arrays or single objects, as Java's readers allow.
pub fn applications_from_slice(body: &[u8], now: i64) -> Result<Vec<InstanceInfo>, DecodeError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| DecodeError::new(format!("invalid JSON: {e}")))?;
    let apps = v
        .get("applications")
        .ok_or_else(|| DecodeError::new("expected {\"applications\": ...}"))?;
    let mut out = Vec::new();
    for app in one_or_many(apps.get("application").unwrap_or(&Value::Null)) {
        for instance in one_or_many(app.get("instance").unwrap_or(&Value::Null)) {
            let (info, dc) = instance_from_value(instance, now)?;
            if dc == DataCenter::Named {
                out.push(info);
            }
        }
    }
    Ok(out)
}
