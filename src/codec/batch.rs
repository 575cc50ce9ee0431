//! The peer replication batch (`POST peerreplication/batch`): `{"replicationList": [...]}` in,
//! `{"responseList": [...]}` out, plain Jackson on the Java side (no root wrapper, no unknown
//! keys, nulls omitted).

use serde_json::Value;

use super::{DecodeError, json};
use crate::registry::{Action, Replication, Writer, instance::InstanceInfo, view::InstanceView};

/// One received `ReplicationInstance`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicationItem {
    pub action: Action,
    pub app_name: String,
    pub id: String,
    pub last_dirty_timestamp: Option<i64>,
    /// The status name as sent (Java parses it per action).
    pub status: Option<String>,
    pub overridden_status: Option<String>,
    pub instance: Option<InstanceInfo>,
    /// A `Cancel` that is the leader's eviction of an expired lease (`"eviction": true`, sent only
    /// between this operator's replicas): the receiver removes the instance only if its own lease
    /// has expired too.
    pub eviction: bool,
}

fn opt_str(obj: &serde_json::Map<String, Value>, key: &str) -> Option<String> {
    obj.get(key).and_then(|v| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    })
}

fn opt_i64(obj: &serde_json::Map<String, Value>, key: &str) -> Result<Option<i64>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_i64().map(Some).ok_or_else(|| format!("{key} is not a long")),
        Some(Value::String(s)) => s.parse().map(Some).map_err(|_| format!("{key} is not a long")),
        Some(_) => Err(format!("{key} is not a long")),
    }
}

fn item(v: &Value, now: i64) -> Result<ReplicationItem, String> {
    let obj = v.as_object().ok_or("a replication item must be an object")?;
    let action = obj
        .get("action")
        .and_then(Value::as_str)
        .ok_or("a replication item needs an action")?;
    let action = Action::parse(action).ok_or_else(|| format!("unknown replication action {action:?}"))?;
    let instance = match obj.get("instanceInfo") {
        None | Some(Value::Null) => None,
        Some(v) => Some(json::instance_from_value(v, now).map_err(|e| e.message)?.0),
    };
    Ok(ReplicationItem {
        action,
        app_name: opt_str(obj, "appName").unwrap_or_default().to_ascii_uppercase(),
        id: opt_str(obj, "id").unwrap_or_default(),
        last_dirty_timestamp: opt_i64(obj, "lastDirtyTimestamp")?,
        status: opt_str(obj, "status"),
        overridden_status: opt_str(obj, "overriddenStatus"),
        instance,
        eviction: obj.get("eviction").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// Decodes a batch. As with Java's Jackson reader, one malformed item (an unknown action, a
/// field of the wrong type) fails the whole document.
pub fn decode_list(body: &[u8], now: i64) -> Result<Vec<ReplicationItem>, DecodeError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| DecodeError::new(format!("invalid JSON: {e}")))?;
    let list = v
        .get("replicationList")
        .and_then(Value::as_array)
        .ok_or_else(|| DecodeError::new("expected {\"replicationList\": [...]}"))?;
    list.iter()
        .enumerate()
        .map(|(n, v)| item(v, now).map_err(|e| DecodeError::new(format!("replication item {n}: {e}"))))
        .collect()
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
        if r.action == Action::Cancel && r.writer == Writer::Expiry {
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

pub fn decode_response(body: &[u8], now: i64) -> Result<Vec<PeerResponse>, DecodeError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| DecodeError::new(format!("invalid JSON: {e}")))?;
    let list = v
        .get("responseList")
        .and_then(Value::as_array)
        .ok_or_else(|| DecodeError::new("expected {\"responseList\": [...]}"))?;
    list.iter()
        .map(|r| {
            let status_code = r
                .get("statusCode")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .ok_or_else(|| DecodeError::new("a response item needs a statusCode"))?;
            let entity = match r.get("responseEntity") {
                None | Some(Value::Null) => None,
                Some(v) => Some(json::instance_from_value(v, now)?.0),
            };
            Ok(PeerResponse { status_code, entity })
        })
        .collect()
}
