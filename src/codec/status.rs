//! The server status document (`GET /eureka/status`), Java's `StatusInfo`: general figures,
//! the replicas this server replicates to, and the server's own instance, in JSON and XML.

use super::{Format, json, xml};
use crate::registry::view::InstanceView;

/// What the status document reports, in the order Java writes it.
pub struct StatusInfo<'a> {
    /// `generalStats`: name and value pairs (CPUs, memory, uptime).
    pub general: &'a [(&'static str, String)],
    /// `applicationStats`: registered, available and unavailable replicas.
    pub application: &'a [(&'static str, String)],
    /// This server as an instance (`instanceInfo`).
    pub instance: &'a InstanceView,
}

/// Writes the status document in `format`.
pub fn encode(status: &StatusInfo<'_>, format: Format) -> Vec<u8> {
    match format {
        Format::Json => encode_json(status),
        Format::Xml => encode_xml(status),
    }
}

fn encode_json(status: &StatusInfo<'_>) -> Vec<u8> {
    let map = |pairs: &[(&str, String)]| -> serde_json::Value {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.clone())))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let mut out = b"{\"generalStats\":".to_vec();
    out.extend_from_slice(map(status.general).to_string().as_bytes());
    out.extend_from_slice(b",\"applicationStats\":");
    out.extend_from_slice(map(status.application).to_string().as_bytes());
    out.extend_from_slice(b",\"healthy\":true,\"instanceInfo\":");
    json::instance(&mut out, status.instance);
    out.push(b'}');
    out
}

fn encode_xml(status: &StatusInfo<'_>) -> Vec<u8> {
    let pairs = |out: &mut Vec<u8>, tag: &str, pairs: &[(&str, String)]| {
        out.extend_from_slice(format!("<{tag}>").as_bytes());
        for (k, v) in pairs {
            out.extend_from_slice(format!("<{k}>{}</{k}>", xml::escape(v)).as_bytes());
        }
        out.extend_from_slice(format!("</{tag}>").as_bytes());
    };
    let mut out = b"<com.netflix.eureka.util.StatusInfo>".to_vec();
    pairs(&mut out, "generalStats", status.general);
    pairs(&mut out, "applicationStats", status.application);
    xml::instance_as(&mut out, status.instance, "instanceInfo");
    out.extend_from_slice(b"</com.netflix.eureka.util.StatusInfo>");
    out
}
