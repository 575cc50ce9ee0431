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
    if i.sid != "na" && i.sid != "unknown" {
        str_field(out, &mut first, "sid", &i.sid);
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

/// A semantic decode failure, carried as a value (see the module docs).
type Checked<T> = Result<T, String>;

/// Any JSON value, reduced to what Java's lenient getters read; objects and arrays are skipped
/// without being built.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Scalar {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Compound,
}

impl Scalar {
    /// Java's `getValueAsLong`: numbers, numeric strings; anything else is 0.
    fn as_i64(&self) -> i64 {
        match self {
            Scalar::Int(i) => *i,
            Scalar::UInt(u) => i64::try_from(*u).unwrap_or(*u as f64 as i64),
            Scalar::Float(f) => *f as i64,
            Scalar::Str(s) => s.trim().parse::<i64>().unwrap_or(0),
            Scalar::Bool(b) => i64::from(*b),
            Scalar::Null | Scalar::Compound => 0,
        }
    }

    fn as_i32(&self) -> i32 {
        self.as_i64().clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
    }

    /// Java's `getValueAsBoolean`: true, "true" (any case), or a non-zero integer.
    fn as_bool(&self) -> bool {
        match self {
            Scalar::Bool(b) => *b,
            Scalar::Str(s) => s.trim().eq_ignore_ascii_case("true"),
            Scalar::Int(i) => *i != 0,
            Scalar::UInt(u) => i64::try_from(*u).is_ok_and(|i| i != 0),
            _ => false,
        }
    }

    /// A scalar as text (metadata values: numbers become their text, `null` becomes "null").
    fn into_text(self) -> Option<String> {
        match self {
            Scalar::Str(s) => Some(s),
            Scalar::Int(i) => Some(i.to_string()),
            Scalar::UInt(u) => Some(u.to_string()),
            Scalar::Float(f) => serde_json::Number::from_f64(f).map(|n| n.to_string()),
            Scalar::Bool(b) => Some(b.to_string()),
            Scalar::Null => Some("null".to_string()),
            Scalar::Compound => None,
        }
    }

    /// An optional text field: `null` is absent, objects and arrays read as absent.
    pub(crate) fn into_opt_string(self) -> Option<String> {
        match self {
            Scalar::Null => None,
            other => other.into_text(),
        }
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Scalar::Str(s) => Some(s),
            _ => None,
        }
    }

    fn is_null(&self) -> bool {
        *self == Scalar::Null
    }
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Implements the scalar visits of a visitor whose value for a scalar is `$scalar(self, scalar)`
/// (objects and arrays are the visitor's own business).
macro_rules! scalar_visits {
    ($scalar:expr) => {
        fn visit_bool<E: ::serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::Bool(v)))
        }
        fn visit_i64<E: ::serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::Int(v)))
        }
        fn visit_u64<E: ::serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::UInt(v)))
        }
        fn visit_f64<E: ::serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::Float(v)))
        }
        fn visit_str<E: ::serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::Str(v.to_string())))
        }
        fn visit_string<E: ::serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::Str(v)))
        }
        fn visit_unit<E: ::serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::Null))
        }
        fn visit_none<E: ::serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::Null))
        }
    };
}
pub(crate) use scalar_visits;

/// `null` (as `None`), or what the seed reads.
pub(crate) struct NullOr<S>(pub S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for NullOr<S> {
    type Value = Option<S::Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for NullOr<S> {
    type Value = Option<S::Value>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value or null")
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(d).map(Some)
    }
}

/// Reads any value as a [`Scalar`].
pub(crate) struct ScalarSeed;

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = Scalar;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Scalar, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ScalarSeed {
    type Value = Scalar;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    scalar_visits!(|_, s| s);
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Scalar, A::Error> {
        drain_map(map)?;
        Ok(Scalar::Compound)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Scalar, A::Error> {
        drain_seq(seq)?;
        Ok(Scalar::Compound)
    }
}

/// A field that must be an object: its visitor reads the object; `null` is `None`; any other
/// value is the error `what`.
macro_rules! object_seed {
    ($seed:ty, $value:ty, $what:expr) => {
        impl<'de> DeserializeSeed<'de> for $seed {
            type Value = Option<Checked<$value>>;
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(self)
            }
        }

        impl<'de> Visitor<'de> for $seed {
            type Value = Option<Checked<$value>>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str($what)
            }
            scalar_visits!(|_, s: Scalar| if s.is_null() {
                None
            } else {
                Some(Err($what.to_string()))
            });
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                drain_seq(seq)?;
                Ok(Some(Err($what.to_string())))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                self.read(map).map(Some)
            }
        }
    };
}

/// `{"$": 8080, "@enabled": "true"}`, starting from `default`.
struct PortSeed(PortInfo);
object_seed!(
    PortSeed,
    PortInfo,
    "port must be an object like {\"$\": 8080, \"@enabled\": \"true\"}"
);

impl PortSeed {
    fn read<'de, A: MapAccess<'de>>(self, mut map: A) -> Result<Checked<PortInfo>, A::Error> {
        let mut p = self.0;
        while let Some(key) = map.next_key::<Key<'_>>()? {
            match key.0 {
                "$" => {
                    let v = map.next_value_seed(ScalarSeed)?;
                    if !v.is_null() {
                        p.port = v.as_i32();
                    }
                }
                "@enabled" => {
                    let v = map.next_value_seed(ScalarSeed)?;
                    if !v.is_null() {
                        p.enabled = v.as_bool();
                    }
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Ok(p))
    }
}

/// `leaseInfo`: the terms a registrant asks for (absent ones are 0, normalised later).
struct LeaseSeed;
object_seed!(LeaseSeed, LeaseTerms, "leaseInfo must be an object");

impl LeaseSeed {
    fn read<'de, A: MapAccess<'de>>(self, mut map: A) -> Result<Checked<LeaseTerms>, A::Error> {
        let mut terms = LeaseTerms {
            renewal_interval_secs: 0,
            duration_secs: 0,
        };
        while let Some(key) = map.next_key::<Key<'_>>()? {
            match key.0 {
                "renewalIntervalInSecs" => terms.renewal_interval_secs = map.next_value_seed(ScalarSeed)?.as_i32(),
                "durationInSecs" => terms.duration_secs = map.next_value_seed(ScalarSeed)?.as_i32(),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Ok(terms))
    }
}

/// A metadata map, within the caps: past them, entries are skipped unread and the cap is reported.
struct MetadataSeed(InstanceLimits);
object_seed!(
    MetadataSeed,
    (Metadata, Option<LimitExceeded>),
    "metadata must be an object"
);

impl MetadataSeed {
    fn read<'de, A: MapAccess<'de>>(self, mut map: A) -> Result<Checked<(Metadata, Option<LimitExceeded>)>, A::Error> {
        let limits = self.0;
        let mut metadata = Metadata::new();
        let mut error: Option<String> = None;
        let mut over: Option<LimitExceeded> = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "@class" || error.is_some() || over.is_some() {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            match map.next_value_seed(ScalarSeed)?.into_text() {
                Some(text) => {
                    metadata.insert(key, text);
                    if metadata.len() > limits.max_metadata_keys {
                        over = Some(LimitExceeded::MetadataKeys {
                            limit: limits.max_metadata_keys,
                        });
                    } else if metadata.bytes() > limits.max_bytes {
                        over = Some(LimitExceeded::InstanceBytes {
                            limit: limits.max_bytes,
                        });
                    }
                    if over.is_some() {
                        metadata = Metadata::new();
                    }
                }
                None => error = Some(format!("metadata value of {key} must be a string")),
            }
        }
        Ok(match error {
            Some(e) => Err(e),
            None => Ok((metadata, over)),
        })
    }
}

/// `dataCenterInfo`: `None` inside when it has no `name` (a validation error, not a decode error).
struct DataCenterSeed(InstanceLimits);
type DataCenterRead = (Option<DataCenterInfo>, Option<LimitExceeded>);
object_seed!(DataCenterSeed, DataCenterRead, "dataCenterInfo must be an object");

impl DataCenterSeed {
    fn read<'de, A: MapAccess<'de>>(self, mut map: A) -> Result<Checked<DataCenterRead>, A::Error> {
        let mut class = None;
        let mut name = Scalar::Null;
        let mut metadata = None;
        while let Some(key) = map.next_key::<Key<'_>>()? {
            match key.0 {
                "@class" => class = map.next_value_seed(ScalarSeed)?.as_str().map(str::to_string),
                "name" => name = map.next_value_seed(ScalarSeed)?,
                "metadata" => metadata = map.next_value_seed(MetadataSeed(self.0))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let Some(class) = class else {
            return Ok(Err("dataCenterInfo needs an @class".into()));
        };
        if name.is_null() {
            return Ok(Ok((None, None)));
        }
        let name = name.as_str().unwrap_or("");
        let Some(name) = DataCenterName::parse_exact(name) else {
            return Ok(Err(format!("unknown dataCenterInfo name {name:?}")));
        };
        let amazon_class = class == "com.netflix.appinfo.AmazonInfo";
        if amazon_class != (name == DataCenterName::Amazon) {
            return Ok(Err(format!(
                "dataCenterInfo @class {class} does not match name {}",
                name.as_str()
            )));
        }
        let (metadata, over) = match metadata {
            Some(Err(e)) if name == DataCenterName::Amazon => return Ok(Err(e)),
            Some(Ok((m, over))) if name == DataCenterName::Amazon => (m, over),
            _ => (Metadata::new(), None),
        };
        Ok(Ok((Some(DataCenterInfo { name, metadata }), over)))
    }
}

/// A map key, borrowed when the parser can lend it.
pub(crate) struct Key<'a>(pub &'a str);

impl<'de: 'a, 'a> de::Deserialize<'de> for Key<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

/// Keys the reader cares about are all short ASCII; anything else (or a key the parser had to
/// unescape) reads as one that matches no field.
struct KeyVisitor;

const FIELDS: &[&str] = &[
    "$",
    "@enabled",
    "@class",
    "name",
    "metadata",
    "renewalIntervalInSecs",
    "durationInSecs",
    "instanceId",
    "hostName",
    "app",
    "ipAddr",
    "sid",
    "status",
    "overriddenStatus",
    "overriddenstatus",
    "port",
    "securePort",
    "countryId",
    "dataCenterInfo",
    "leaseInfo",
    "appGroupName",
    "homePageUrl",
    "statusPageUrl",
    "healthCheckUrl",
    "secureHealthCheckUrl",
    "vipAddress",
    "secureVipAddress",
    "lastUpdatedTimestamp",
    "lastDirtyTimestamp",
    "actionType",
    "asgName",
    "instance",
    "applications",
    "application",
    "replicationList",
    "responseList",
    "statusCode",
    "responseEntity",
    "action",
    "appName",
    "id",
    "instanceInfo",
    "eviction",
];

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
        Ok(Key(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
        Ok(Key(FIELDS.iter().find(|f| **f == v).copied().unwrap_or("")))
    }
}

/// An instance object (already unwrapped), with Java's defaults for what is missing and `now` as
/// the dirty/updated timestamps when absent. `null` values are as if absent.
pub(crate) struct InstanceSeed {
    pub now: i64,
    pub limits: InstanceLimits,
}

impl<'de> DeserializeSeed<'de> for InstanceSeed {
    type Value = Checked<DecodedInstance>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for InstanceSeed {
    type Value = Checked<DecodedInstance>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an instance object")
    }
    scalar_visits!(|_, _| Err("instance must be an object".to_string()));
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        drain_seq(seq)?;
        Ok(Err("instance must be an object".to_string()))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut i = InstanceInfo::new("", "", "", self.now);
        i.host_name.clear();
        let mut data_center = DataCenter::Missing;
        let mut over_limit = None;
        let mut error: Option<String> = None;
        while let Some(key) = map.next_key::<Key<'_>>()? {
            if error.is_some() {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let mut fail = |e: String| error = Some(e);
            match key.0 {
                "port" | "securePort" => {
                    let slot = if key.0 == "port" {
                        &mut i.port
                    } else {
                        &mut i.secure_port
                    };
                    match map.next_value_seed(PortSeed(*slot))? {
                        Some(Ok(p)) => *slot = p,
                        Some(Err(e)) => fail(e),
                        None => {}
                    }
                }
                "dataCenterInfo" => match map.next_value_seed(DataCenterSeed(self.limits))? {
                    Some(Ok((Some(dc), over))) => {
                        i.data_center_info = dc;
                        data_center = DataCenter::Named;
                        over_limit = over_limit.or(over);
                    }
                    Some(Ok((None, _))) => data_center = DataCenter::Unnamed,
                    Some(Err(e)) => fail(e),
                    None => {}
                },
                "leaseInfo" => match map.next_value_seed(LeaseSeed)? {
                    Some(Ok(terms)) => i.lease = terms,
                    Some(Err(e)) => fail(e),
                    None => {}
                },
                "metadata" => match map.next_value_seed(MetadataSeed(self.limits))? {
                    Some(Ok((m, over))) => {
                        i.metadata = m;
                        over_limit = over_limit.or(over);
                    }
                    Some(Err(e)) => fail(e),
                    None => {}
                },
                field => {
                    let v = map.next_value_seed(ScalarSeed)?;
                    if v.is_null() {
                        continue;
                    }
                    set_scalar(&mut i, field, v);
                }
            }
        }
        if let Some(e) = error {
            return Ok(Err(e));
        }
        if over_limit.is_none() {
            over_limit = self.limits.check(&i).err();
        }
        Ok(Ok(DecodedInstance {
            info: i,
            data_center,
            over_limit,
        }))
    }
}

/// Sets an instance's scalar field from its JSON key; other keys (and
/// `isCoordinatingDiscoveryServer`, which the server recomputes) are ignored.
fn set_scalar(i: &mut InstanceInfo, field: &str, v: Scalar) {
    match field {
        "instanceId" => i.instance_id = v.into_opt_string(),
        "hostName" => i.host_name = v.into_opt_string().unwrap_or_default(),
        "app" => i.app = v.into_opt_string().unwrap_or_default().to_ascii_uppercase(),
        "ipAddr" => i.ip_addr = v.into_opt_string().unwrap_or_default(),
        "sid" => i.sid = v.into_opt_string().unwrap_or_default(),
        "status" => i.status = v.as_str().and_then(Status::parse_exact).unwrap_or(Status::Unknown),
        "overriddenStatus" | "overriddenstatus" => {
            i.overridden_status = v.as_str().and_then(Status::parse_exact).unwrap_or(Status::Unknown)
        }
        "countryId" => i.country_id = v.as_i32(),
        "appGroupName" => i.app_group_name = v.into_opt_string().map(|s| s.to_ascii_uppercase()),
        "homePageUrl" => i.home_page_url = v.into_opt_string(),
        "statusPageUrl" => i.status_page_url = v.into_opt_string(),
        "healthCheckUrl" => i.health_check_url = v.into_opt_string(),
        "secureHealthCheckUrl" => i.secure_health_check_url = v.into_opt_string(),
        "vipAddress" => i.vip_address = v.into_opt_string(),
        "secureVipAddress" => i.secure_vip_address = v.into_opt_string(),
        "lastUpdatedTimestamp" => i.last_updated_timestamp = v.as_i64(),
        "lastDirtyTimestamp" => i.last_dirty_timestamp = v.as_i64(),
        "actionType" => i.action_type = v.as_str().and_then(ActionType::parse_exact),
        "asgName" => i.asg_name = v.into_opt_string(),
        _ => {}
    }
}

/// Maps a parser error: syntax errors say "invalid JSON".
pub(crate) fn syntax(e: serde_json::Error) -> DecodeError {
    DecodeError::new(format!("invalid JSON: {e}"))
}

/// Runs `seed` over a whole document (trailing characters are an error).
pub(crate) fn document<'de, R, S>(mut de: serde_json::Deserializer<R>, seed: S) -> Result<S::Value, DecodeError>
where
    R: serde_json::de::Read<'de>,
    S: DeserializeSeed<'de>,
{
    let v = seed.deserialize(&mut de).map_err(syntax)?;
    de.end().map_err(syntax)?;
    Ok(v)
}

/// Decodes a whole JSON document from `input` with `seed`.
pub(crate) fn decode<S, T>(input: super::Input<'_>, seed: S) -> Result<T, DecodeError>
where
    S: for<'de> DeserializeSeed<'de, Value = T>,
{
    match input {
        super::Input::Bytes(b) => document(serde_json::Deserializer::from_slice(b), seed),
        super::Input::Stream(r) => document(
            serde_json::Deserializer::from_reader(std::io::BufReader::with_capacity(16 * 1024, r)),
            seed,
        ),
    }
}

/// `{"instance": {...}}`: the object under `instance` (the last one if repeated); other keys are
/// skipped, and a document without it names its first key, as Java does.
struct RootSeed<S>(S);

enum Rooted<T> {
    Found(T),
    Missing(String),
    NotObject,
}

impl<'de, S: Clone + DeserializeSeed<'de>> DeserializeSeed<'de> for RootSeed<(&'static str, S)> {
    type Value = Rooted<S::Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, S: Clone + DeserializeSeed<'de>> Visitor<'de> for RootSeed<(&'static str, S)> {
    type Value = Rooted<S::Value>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }
    scalar_visits!(|_, _| Rooted::NotObject);
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        drain_seq(seq)?;
        Ok(Rooted::NotObject)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (name, seed) = self.0;
        let mut first: Option<String> = None;
        let mut found = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == name {
                found = Some(map.next_value_seed(seed.clone())?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
            if first.is_none() {
                first = Some(key);
            }
        }
        Ok(match found {
            Some(v) => Rooted::Found(v),
            None => Rooted::Missing(first.unwrap_or_default()),
        })
    }
}

impl Clone for InstanceSeed {
    fn clone(&self) -> Self {
        InstanceSeed {
            now: self.now,
            limits: self.limits,
        }
    }
}

/// A registration body: `{"instance": {...}}`.
pub fn read_instance_document(
    input: super::Input<'_>,
    now: i64,
    limits: InstanceLimits,
) -> Result<DecodedInstance, DecodeError> {
    let seed = RootSeed(("instance", InstanceSeed { now, limits }));
    match decode(input, seed)? {
        Rooted::Found(Ok(d)) => Ok(d),
        Rooted::Found(Err(e)) => Err(DecodeError::new(e)),
        Rooted::Missing(first) => Err(DecodeError::new(format!(
            "Root name '{first}' does not match expected ('instance')"
        ))),
        Rooted::NotObject => Err(DecodeError::new("the body must be a JSON object")),
    }
}

/// Reads a value that may be one item or an array of them (`null` is none) with the item seed,
/// which reads each item into a list; the lists are joined, and the first item error wins.
struct OneOrMany<S>(S);

impl<'de, S, T> DeserializeSeed<'de> for OneOrMany<S>
where
    S: Clone + DeserializeSeed<'de, Value = Checked<Vec<T>>>,
{
    type Value = Checked<Vec<T>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, S, T> Visitor<'de> for OneOrMany<S>
where
    S: Clone + DeserializeSeed<'de, Value = Checked<Vec<T>>>,
{
    type Value = Checked<Vec<T>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("one item or an array")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Ok(Vec::new()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        let mut error = None;
        while let Some(items) = seq.next_element_seed(self.0.clone())? {
            match items {
                Ok(items) if error.is_none() => out.extend(items),
                Err(e) if error.is_none() => error = Some(e),
                _ => {}
            }
        }
        Ok(error.map_or(Ok(out), Err))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.0.deserialize(de::value::MapAccessDeserializer::new(map))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        self.0.deserialize(de::value::BoolDeserializer::new(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        self.0.deserialize(de::value::I64Deserializer::new(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        self.0.deserialize(de::value::U64Deserializer::new(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        self.0.deserialize(de::value::F64Deserializer::new(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        self.0.deserialize(de::value::StrDeserializer::new(v))
    }
}

/// One instance of a peer's registry: kept only with a named `dataCenterInfo`.
#[derive(Clone)]
struct PeerInstanceSeed(i64);

impl<'de> DeserializeSeed<'de> for PeerInstanceSeed {
    type Value = Checked<Vec<InstanceInfo>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        let decoded = InstanceSeed {
            now: self.0,
            limits: InstanceLimits::UNLIMITED,
        }
        .deserialize(d)?;
        Ok(decoded.map(|d| {
            if d.data_center == DataCenter::Named {
                vec![d.info]
            } else {
                Vec::new()
            }
        }))
    }
}

/// Reads the object under `field` of an object (the last one if repeated) with the seed; any
/// other value, or an object without it, reads as empty.
#[derive(Clone)]
struct Under<S>(&'static str, S);

impl<'de, S, T> DeserializeSeed<'de> for Under<S>
where
    S: Clone + DeserializeSeed<'de, Value = Checked<Vec<T>>>,
{
    type Value = Checked<Vec<T>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, S, T> Visitor<'de> for Under<S>
where
    S: Clone + DeserializeSeed<'de, Value = Checked<Vec<T>>>,
{
    type Value = Checked<Vec<T>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }
    scalar_visits!(|_, _| Ok(Vec::new()));
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        drain_seq(seq)?;
        Ok(Ok(Vec::new()))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Ok(Vec::new());
        while let Some(key) = map.next_key::<Key<'_>>()? {
            if key.0 == self.0 {
                out = map.next_value_seed(OneOrMany(self.1.clone()))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(out)
    }
}

/// The instances of an `{"applications": ...}` document (a peer's full registry); `application`
/// and `instance` may be arrays or single objects, as Java's readers allow.
pub fn applications_from_slice(body: &[u8], now: i64) -> Result<Vec<InstanceInfo>, DecodeError> {
    let apps = Under("instance", PeerInstanceSeed(now));
    let seed = RootSeed(("applications", Under("application", apps)));
    match decode(super::Input::Bytes(body), seed)? {
        Rooted::Found(Ok(v)) => Ok(v),
        Rooted::Found(Err(e)) => Err(DecodeError::new(e)),
        Rooted::Missing(_) | Rooted::NotObject => Err(DecodeError::new("expected {\"applications\": ...}")),
    }
}
