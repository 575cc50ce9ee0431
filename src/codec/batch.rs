//! The peer replication batch (`POST peerreplication/batch`): `{"replicationList": [...]}` in,
//! `{"responseList": [...]}` out, plain Jackson on the Java side (no root wrapper, no unknown
//! keys, nulls omitted).

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{
    DecodeError, DecodedInstance, Input,
    json::{self, InstanceSeed, Scalar},
};
use crate::registry::{
    Replication, ReplicationAction, Writer,
    instance::InstanceInfo,
    limits::{InstanceLimits, LimitExceeded},
    view::InstanceView,
};

/// The header this operator's replicas send on every replication request, with the sender's
/// replica id; batches without it come from other Eureka servers (Java peers).
pub const REPLICA_HEADER: &str = "x-eureka-operator-replica";

/// One received `ReplicationInstance`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicationItem {
    pub action: ReplicationAction,
    pub app_name: String,
    pub id: String,
    pub last_dirty_timestamp: Option<i64>,
    /// The status name as sent (Java parses it per action).
    pub status: Option<String>,
    pub overridden_status: Option<String>,
    pub instance: Option<InstanceInfo>,
    /// The cap the item's instance exceeds; its instance is then dropped. One oversized item does
    /// not fail the batch.
    pub over_limit: Option<LimitExceeded>,
    /// A `Cancel` that is the leader's eviction of an expired lease (`"eviction": true`, sent only
    /// between this operator's replicas): the receiver removes the instance only if its own lease
    /// has expired too.
    pub eviction: bool,
}

/// `appName`, `id`, the statuses: strings, or numbers as their text.
fn opt_str(v: Scalar) -> Option<String> {
    match v {
        Scalar::Str(_) | Scalar::Int(_) | Scalar::UInt(_) | Scalar::Float(_) => v.into_opt_string(),
        _ => None,
    }
}

/// `lastDirtyTimestamp`: a long, or a string holding one.
fn opt_i64(v: Scalar, key: &str) -> Result<Option<i64>, String> {
    match v {
        Scalar::Null => Ok(None),
        Scalar::Int(i) => Ok(Some(i)),
        Scalar::UInt(u) => i64::try_from(u).map(Some).map_err(|_| format!("{key} is not a long")),
        Scalar::Str(s) => s.parse().map(Some).map_err(|_| format!("{key} is not a long")),
        _ => Err(format!("{key} is not a long")),
    }
}

/// What an item's fields read as, before they are checked.
#[derive(Default)]
struct ItemFields {
    action: Option<Scalar>,
    app_name: Option<Scalar>,
    id: Option<Scalar>,
    dirty: Option<Scalar>,
    status: Option<Scalar>,
    overridden: Option<Scalar>,
    eviction: Option<Scalar>,
    instance: Option<Result<DecodedInstance, String>>,
}

impl ItemFields {
    /// The item, with the checks in the order of Java's reader (and of our earlier one).
    fn check(self) -> Result<ReplicationItem, String> {
        let action = self.action.unwrap_or(Scalar::Null);
        let action = action.as_str().ok_or("a replication item needs an action")?;
        let action =
            ReplicationAction::parse(action).ok_or_else(|| format!("unknown replication action {action:?}"))?;
        let (instance, over_limit) = match self.instance.transpose()? {
            Some(d) if d.over_limit.is_some() => (None, d.over_limit),
            Some(d) => (Some(d.info), None),
            None => (None, None),
        };
        let text = |v: Option<Scalar>| v.and_then(opt_str);
        Ok(ReplicationItem {
            action,
            app_name: text(self.app_name).unwrap_or_default().to_ascii_uppercase(),
            id: text(self.id).unwrap_or_default(),
            last_dirty_timestamp: opt_i64(self.dirty.unwrap_or(Scalar::Null), "lastDirtyTimestamp")?,
            status: text(self.status),
            overridden_status: text(self.overridden),
            instance,
            over_limit,
            eviction: self.eviction == Some(Scalar::Bool(true)),
        })
    }
}

/// One item of a batch.
#[derive(Clone)]
struct ItemSeed {
    now: i64,
    limits: InstanceLimits,
}

const NOT_AN_OBJECT: &str = "a replication item must be an object";

impl<'de> DeserializeSeed<'de> for ItemSeed {
    type Value = Result<ReplicationItem, String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemSeed {
    type Value = Result<ReplicationItem, String>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a replication item")
    }
    json::scalar_visits!(|_, _| Err(NOT_AN_OBJECT.to_string()));
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Err(NOT_AN_OBJECT.into()))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut f = ItemFields::default();
        while let Some(key) = map.next_key::<json::FieldName<'_>>()? {
            let slot = match key.0 {
                "action" => &mut f.action,
                "appName" => &mut f.app_name,
                "id" => &mut f.id,
                "lastDirtyTimestamp" => &mut f.dirty,
                "status" => &mut f.status,
                "overriddenStatus" => &mut f.overridden,
                "eviction" => &mut f.eviction,
                "instanceInfo" => {
                    let seed = json::NullOr(InstanceSeed {
                        now: self.now,
                        limits: self.limits,
                    });
                    f.instance = map.next_value_seed(seed)?;
                    continue;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = Some(map.next_value_seed(json::ScalarSeed)?);
        }
        Ok(f.check())
    }
}

/// `{"<name>": [items]}`: the array under `name` read with `seed`, the first failing item's error
/// prefixed with its position; `None` when there is no such array.
struct ListSeed<S>(&'static str, S);

impl<'de, S, T> DeserializeSeed<'de> for ListSeed<S>
where
    S: Clone + DeserializeSeed<'de, Value = Result<T, String>>,
{
    type Value = Option<Result<Vec<T>, (usize, String)>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, S, T> Visitor<'de> for ListSeed<S>
where
    S: Clone + DeserializeSeed<'de, Value = Result<T, String>>,
{
    type Value = Option<Result<Vec<T>, (usize, String)>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }
    json::scalar_visits!(|_, _| None);
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = None;
        while let Some(key) = map.next_key::<json::FieldName<'_>>()? {
            if key.0 == self.0 {
                out = map.next_value_seed(Items(self.1.clone()))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(out)
    }
}

/// The array itself: `None` when the value is not an array.
struct Items<S>(S);

impl<'de, S, T> DeserializeSeed<'de> for Items<S>
where
    S: Clone + DeserializeSeed<'de, Value = Result<T, String>>,
{
    type Value = Option<Result<Vec<T>, (usize, String)>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, S, T> Visitor<'de> for Items<S>
where
    S: Clone + DeserializeSeed<'de, Value = Result<T, String>>,
{
    type Value = Option<Result<Vec<T>, (usize, String)>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array")
    }
    json::scalar_visits!(|_, _| None);
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        let mut error = None;
        let mut n = 0;
        loop {
            if error.is_some() {
                // The document must still parse; the rest is not decoded.
                if seq.next_element::<IgnoredAny>()?.is_none() {
                    break;
                }
                continue;
            }
            match seq.next_element_seed(self.0.clone())? {
                None => break,
                Some(Ok(item)) => out.push(item),
                Some(Err(e)) => error = Some((n, e)),
            }
            n += 1;
        }
        Ok(Some(error.map_or(Ok(out), Err)))
    }
}

/// Decodes a batch. As with Java's Jackson reader, one malformed item (an unknown action, a
/// field of the wrong type) fails the whole document; an item whose instance exceeds the caps
/// only loses its instance (see [`ReplicationItem::over_limit`]).
pub fn decode_list_from(
    input: Input<'_>,
    now: i64,
    limits: InstanceLimits,
) -> Result<Vec<ReplicationItem>, DecodeError> {
    match json::decode(input, ListSeed("replicationList", ItemSeed { now, limits }))? {
        Some(Ok(items)) => Ok(items),
        Some(Err((n, e))) => Err(DecodeError::new(format!("replication item {n}: {e}"))),
        None => Err(DecodeError::new("expected {\"replicationList\": [...]}")),
    }
}

/// [`decode_list_from`] for a body in memory, without caps.
pub fn decode_list(body: &[u8], now: i64) -> Result<Vec<ReplicationItem>, DecodeError> {
    decode_list_from(Input::Bytes(body), now, InstanceLimits::UNLIMITED)
}

/// One slot of a batch response.
#[derive(Clone, Debug, PartialEq)]
pub struct ItemResponse {
    pub status_code: u16,
    pub entity: Option<InstanceView>,
}

pub fn encode_response(items: &[ItemResponse]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + items.len() * 24);
    out.extend_from_slice(b"{\"responseList\":[");
    for (n, r) in items.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(format!("{{\"statusCode\":{}", r.status_code).as_bytes());
        if let Some(entity) = &r.entity {
            out.extend_from_slice(b",\"responseEntity\":");
            json::instance(&mut out, entity);
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    out
}

/// Encodes what this server sends to a peer.
pub fn encode_list(items: &[&Replication]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + items.len() * 200);
    out.extend_from_slice(b"{\"replicationList\":[");
    for (n, r) in items.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"appName\":");
        let _ = serde_json::to_writer(&mut out, &r.app);
        out.extend_from_slice(b",\"id\":");
        let _ = serde_json::to_writer(&mut out, &r.id);
        if let Some(t) = r.last_dirty_timestamp {
            out.extend_from_slice(format!(",\"lastDirtyTimestamp\":{t}").as_bytes());
        }
        if let Some(s) = r.overridden_status {
            out.extend_from_slice(format!(",\"overriddenStatus\":\"{}\"", s.as_str()).as_bytes());
        }
        if let Some(s) = r.status {
            out.extend_from_slice(format!(",\"status\":\"{}\"", s.as_str()).as_bytes());
        }
        if let Some(i) = &r.instance {
            out.extend_from_slice(b",\"instanceInfo\":");
            json::instance(&mut out, i);
        }
        if r.action == ReplicationAction::Cancel && r.writer == Writer::Expiry {
            // Only ever sent to our own replicas (evictions are not replicated to Java peers).
            out.extend_from_slice(b",\"eviction\":true");
        }
        out.extend_from_slice(format!(",\"action\":\"{}\"}}", r.action.as_str()).as_bytes());
    }
    out.extend_from_slice(b"]}");
    out
}

/// A peer's answer to one of our items.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerResponse {
    pub status_code: u16,
    pub entity: Option<InstanceInfo>,
}

/// One item of a peer's answer.
#[derive(Clone)]
struct ResponseSeed(i64);

impl<'de> DeserializeSeed<'de> for ResponseSeed {
    type Value = Result<PeerResponse, String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

const NO_STATUS_CODE: &str = "a response item needs a statusCode";

impl<'de> Visitor<'de> for ResponseSeed {
    type Value = Result<PeerResponse, String>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a response item")
    }
    json::scalar_visits!(|_, _| Err(NO_STATUS_CODE.to_string()));
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Err(NO_STATUS_CODE.into()))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut status_code = None;
        let mut entity = None;
        while let Some(key) = map.next_key::<json::FieldName<'_>>()? {
            match key.0 {
                "statusCode" => {
                    status_code = match map.next_value_seed(json::ScalarSeed)? {
                        Scalar::Int(i) => u64::try_from(i).ok(),
                        Scalar::UInt(u) => Some(u),
                        _ => None,
                    }
                }
                "responseEntity" => {
                    let seed = json::NullOr(InstanceSeed {
                        now: self.0,
                        limits: InstanceLimits::UNLIMITED,
                    });
                    entity = map.next_value_seed(seed)?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let Some(status_code) = status_code.and_then(|c| u16::try_from(c).ok()) else {
            return Ok(Err(NO_STATUS_CODE.into()));
        };
        Ok(match entity.transpose() {
            Ok(entity) => Ok(PeerResponse {
                status_code,
                entity: entity.map(|d| d.info),
            }),
            Err(e) => Err(e),
        })
    }
}

pub fn decode_response(body: &[u8], now: i64) -> Result<Vec<PeerResponse>, DecodeError> {
    match json::decode(Input::Bytes(body), ListSeed("responseList", ResponseSeed(now)))? {
        Some(Ok(items)) => Ok(items),
        Some(Err((_, e))) => Err(DecodeError::new(e)),
        None => Err(DecodeError::new("expected {\"responseList\": [...]}")),
    }
}
