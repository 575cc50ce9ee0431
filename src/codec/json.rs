//! JSON as the Java server writes and reads it (`EurekaJacksonCodec`): root wrappers, the
//! `{"$": 8080, "@enabled": "true"}` ports, the phantom `@class` markers, and the `@Auto` fields
//! written as strings in field-declaration order.
//!
//! Reading is typed and streaming: serde visitors pick the known fields out as the parser meets
//! them and skip every other value without building it, so decoding costs O(body) time and memory
//! proportional to what is kept (bounded by [`InstanceLimits`]), never a generic tree. Values are
//! read as leniently as Java's getters read them (numbers as strings and back, `null` as absent).
//! A value of the wrong shape is a decode error carried as a value, so the parser still checks the
//! rest of the document and syntax errors anywhere take precedence, as with a whole-document parse.
//!
//! The writer is this file; [`read`] reads documents and [`seeds`] holds the serde pieces the
//! replication batch's reader shares.

mod read;
mod seeds;

pub(crate) use read::{InstanceSeed, decode};
pub use read::{applications_from_slice, read_instance_document};
pub(crate) use seeds::{FieldName, NullOr, Scalar, ScalarSeed, scalar_visits};

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{DataCenter, DecodeError, DecodedInstance};
use crate::registry::{
    instance::{ActionType, DataCenterInfo, DataCenterName, InstanceInfo, LeaseTerms, Metadata, PortInfo, Status},
    limits::{InstanceLimits, LimitExceeded},
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
    let mut first = true;
    out.push(b'{');
    opt_field(out, &mut first, "instanceId", i.instance_id.as_deref());
    str_field(out, &mut first, "hostName", &i.host_name);
    str_field(out, &mut first, "app", &i.app);
    str_field(out, &mut first, "ipAddr", &i.ip_addr);
    if i.sid() != "na" && i.sid() != "unknown" {
        str_field(out, &mut first, "sid", i.sid());
    }
    str_field(out, &mut first, "status", i.status.as_str());
    str_field(out, &mut first, "overriddenStatus", i.overridden_status.as_str());
    port(out, &mut first, "port", i.port);
    port(out, &mut first, "securePort", i.secure_port);
    num_field(out, &mut first, "countryId", i64::from(i.country_id));

    key(out, &mut first, "dataCenterInfo");
    data_center_info(out, &i.data_center_info);
    key(out, &mut first, "leaseInfo");
    lease_info(out, &view.lease);

    key(out, &mut first, "metadata");
    metadata(out, &i.metadata);

    opt_field(out, &mut first, "appGroupName", i.app_group_name());
    opt_field(out, &mut first, "homePageUrl", i.home_page_url.as_deref());
    opt_field(out, &mut first, "statusPageUrl", i.status_page_url.as_deref());
    opt_field(out, &mut first, "healthCheckUrl", i.health_check_url.as_deref());
    opt_field(out, &mut first, "secureHealthCheckUrl", i.secure_health_check_url());
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
    opt_field(out, &mut first, "asgName", i.asg_name());
    out.push(b'}');
}

fn data_center_info(out: &mut Vec<u8>, dc: &DataCenterInfo) {
    out.push(b'{');
    let mut f = true;
    str_field(out, &mut f, "@class", dc.class());
    str_field(out, &mut f, "name", dc.name.as_str());
    if dc.name == DataCenterName::Amazon {
        key(out, &mut f, "metadata");
        metadata(out, &dc.metadata);
    }
    out.push(b'}');
}

fn lease_info(out: &mut Vec<u8>, l: &crate::registry::view::LeaseView) {
    out.push(b'{');
    let mut f = true;
    num_field(out, &mut f, "renewalIntervalInSecs", i64::from(l.renewal_interval_secs));
    num_field(out, &mut f, "durationInSecs", i64::from(l.duration_secs));
    num_field(out, &mut f, "registrationTimestamp", l.registration_ts);
    num_field(out, &mut f, "lastRenewalTimestamp", l.last_renewal_ts);
    num_field(out, &mut f, "evictionTimestamp", l.eviction_ts);
    num_field(out, &mut f, "serviceUpTimestamp", l.service_up_ts);
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
