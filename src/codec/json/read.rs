//! Reading Eureka's JSON: instances field by field (ports, lease, metadata, data center) with
//! Java's defaults and leniency, the root wrappers, and whole documents (one instance, the
//! applications a peer lists).

use super::{seeds::*, *};

/// `{"$": 8080, "@enabled": "true"}`, starting from `default`.
pub(super) struct PortSeed(PortInfo);
object_seed!(
    PortSeed,
    PortInfo,
    "port must be an object like {\"$\": 8080, \"@enabled\": \"true\"}"
);

impl PortSeed {
    fn read<'de, A: MapAccess<'de>>(self, mut map: A) -> Result<Checked<PortInfo>, A::Error> {
        let mut p = self.0;
        while let Some(key) = map.next_key::<FieldName<'_>>()? {
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
pub(super) struct LeaseSeed;
object_seed!(LeaseSeed, LeaseTerms, "leaseInfo must be an object");

impl LeaseSeed {
    fn read<'de, A: MapAccess<'de>>(self, mut map: A) -> Result<Checked<LeaseTerms>, A::Error> {
        let mut terms = LeaseTerms {
            renewal_interval_secs: 0,
            duration_secs: 0,
        };
        while let Some(key) = map.next_key::<FieldName<'_>>()? {
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
pub(super) struct MetadataSeed(InstanceLimits);
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
pub(super) struct DataCenterSeed(InstanceLimits);
pub(super) type DataCenterRead = (Option<DataCenterInfo>, Option<LimitExceeded>);
object_seed!(DataCenterSeed, DataCenterRead, "dataCenterInfo must be an object");

impl DataCenterSeed {
    fn read<'de, A: MapAccess<'de>>(self, mut map: A) -> Result<Checked<DataCenterRead>, A::Error> {
        let mut class = None;
        let mut name = Scalar::Null;
        let mut metadata = None;
        while let Some(key) = map.next_key::<FieldName<'_>>()? {
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
        while let Some(key) = map.next_key::<FieldName<'_>>()? {
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
pub(super) fn set_scalar(i: &mut InstanceInfo, field: &str, v: Scalar) {
    match field {
        "instanceId" => i.instance_id = v.into_opt_string().map(Into::into),
        "hostName" => i.host_name = v.into_opt_string().unwrap_or_default().into(),
        "app" => i.app = v.into_opt_string().unwrap_or_default().to_ascii_uppercase().into(),
        "ipAddr" => i.ip_addr = v.into_opt_string().unwrap_or_default().into(),
        "sid" => i.set_sid(v.into_opt_string().unwrap_or_default()),
        "status" => i.status = v.as_str().and_then(Status::parse_exact).unwrap_or(Status::Unknown),
        "overriddenStatus" | "overriddenstatus" => {
            i.overridden_status = v.as_str().and_then(Status::parse_exact).unwrap_or(Status::Unknown)
        }
        "countryId" => i.country_id = v.as_i32(),
        "appGroupName" => i.set_app_group_name(v.into_opt_string().map(|s| s.to_ascii_uppercase().into())),
        "homePageUrl" => i.home_page_url = v.into_opt_string().map(Into::into),
        "statusPageUrl" => i.status_page_url = v.into_opt_string().map(Into::into),
        "healthCheckUrl" => i.health_check_url = v.into_opt_string().map(Into::into),
        "secureHealthCheckUrl" => i.set_secure_health_check_url(v.into_opt_string().map(Into::into)),
        "vipAddress" => i.vip_address = v.into_opt_string().map(Into::into),
        "secureVipAddress" => i.secure_vip_address = v.into_opt_string().map(Into::into),
        "lastUpdatedTimestamp" => i.last_updated_timestamp = v.as_i64(),
        "lastDirtyTimestamp" => i.last_dirty_timestamp = v.as_i64(),
        "actionType" => i.action_type = v.as_str().and_then(ActionType::parse_exact),
        "asgName" => i.set_asg_name(v.into_opt_string().map(Into::into)),
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
pub(crate) fn decode<S, T>(input: crate::codec::Input<'_>, seed: S) -> Result<T, DecodeError>
where
    S: for<'de> DeserializeSeed<'de, Value = T>,
{
    match input {
        crate::codec::Input::Bytes(b) => document(serde_json::Deserializer::from_slice(b), seed),
        crate::codec::Input::Stream(r) => document(
            serde_json::Deserializer::from_reader(std::io::BufReader::with_capacity(16 * 1024, r)),
            seed,
        ),
    }
}

/// `{"instance": {...}}`: the object under `instance` (the last one if repeated); other keys are
/// skipped, and a document without it names its first key, as Java does.
pub(super) struct RootSeed<S>(S);

pub(super) enum Rooted<T> {
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
    input: crate::codec::Input<'_>,
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
pub(super) struct OneOrMany<S>(S);

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
pub(super) struct PeerInstanceSeed(i64);

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
pub(super) struct Under<S>(&'static str, S);

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
        while let Some(key) = map.next_key::<FieldName<'_>>()? {
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
    match decode(crate::codec::Input::Bytes(body), seed)? {
        Rooted::Found(Ok(v)) => Ok(v),
        Rooted::Found(Err(e)) => Err(DecodeError::new(e)),
        Rooted::Missing(_) | Rooted::NotObject => Err(DecodeError::new("expected {\"applications\": ...}")),
    }
}
