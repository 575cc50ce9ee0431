//! Eureka's wire formats, without any HTTP: JSON as Java's `EurekaJacksonCodec` writes it, XML as
//! XStream writes it, the peer replication batch, and the validation Java applies to a
//! registration. Encoders take registry views; decoders return registry values.
//!
//! Decoders read a body in memory or stream it (an inflating gzip body is never held whole), in
//! time linear in its size and memory proportional to what they keep: unknown values are skipped
//! unread, and an instance's metadata stops being kept once it passes the per-instance caps.

pub mod batch;
pub mod json;
pub mod status;
pub mod xml;

use std::io::BufRead;

use crate::registry::{
    instance::InstanceInfo,
    limits::{InstanceLimits, LimitExceeded},
    view::{AppView, AppsView, InstanceView},
};

/// A body to decode: bytes in memory, or a stream read as it is decoded.
pub enum Input<'a> {
    Bytes(&'a [u8]),
    Stream(&'a mut dyn BufRead),
}

impl Input<'_> {
    /// The format of a body without a declared type: XML when it starts with `<` (after
    /// whitespace, which is consumed from a stream), JSON otherwise.
    pub fn sniff(&mut self) -> Format {
        let first = match self {
            Input::Bytes(b) => b.iter().find(|b| !b.is_ascii_whitespace()).copied(),
            Input::Stream(r) => loop {
                let Ok(buf) = r.fill_buf() else { break None };
                match buf.iter().position(|b| !b.is_ascii_whitespace()) {
                    Some(i) => {
                        let b = buf[i];
                        r.consume(i);
                        break Some(b);
                    }
                    None if buf.is_empty() => break None,
                    None => {
                        let n = buf.len();
                        r.consume(n);
                    }
                }
            },
        };
        if first == Some(b'<') { Format::Xml } else { Format::Json }
    }
}

/// What an instance object decodes to.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedInstance {
    pub info: InstanceInfo,
    /// Whether it had a (named) `dataCenterInfo`.
    pub data_center: DataCenter,
    /// A cap it exceeds: its metadata is then incomplete, and it must not be stored.
    pub over_limit: Option<LimitExceeded>,
}

/// A payload format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    Json,
    Xml,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Xml => "application/xml",
        }
    }
}

/// A request body that cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("failed to parse the request body: {message}")]
pub struct DecodeError {
    pub message: String,
}

impl DecodeError {
    pub fn new(message: impl Into<String>) -> DecodeError {
        DecodeError {
            message: message.into(),
        }
    }
}

pub fn encode_apps(view: &AppsView, format: Format) -> Vec<u8> {
    let fragments: Vec<Vec<u8>> = view.apps.iter().map(|a| encode_app_fragment(a, format)).collect();
    let refs: Vec<&[u8]> = fragments.iter().map(Vec::as_slice).collect();
    encode_apps_from_fragments(view.versions_delta, &view.apps_hashcode, &refs, format)
}

/// One application as it stands inside an `applications` document.
pub fn encode_app_fragment(app: &AppView, format: Format) -> Vec<u8> {
    match format {
        Format::Json => json::application_fragment(app),
        Format::Xml => xml::application(app),
    }
}

/// The start of an `applications` document, up to its first application.
pub fn apps_head(versions_delta: i64, apps_hashcode: &str, format: Format) -> Vec<u8> {
    match format {
        Format::Json => json::applications_head(versions_delta, apps_hashcode),
        Format::Xml => xml::applications_head(versions_delta, apps_hashcode),
    }
}

/// The end of an `applications` document, after its last application.
pub fn apps_tail(format: Format) -> &'static [u8] {
    match format {
        Format::Json => json::APPLICATIONS_TAIL,
        Format::Xml => xml::APPLICATIONS_TAIL,
    }
}

/// What stands between two applications of an `applications` document.
pub fn separator(format: Format) -> &'static [u8] {
    match format {
        Format::Json => b",",
        Format::Xml => b"",
    }
}

/// An `applications` document assembled from fragments made by [`encode_app_fragment`].
pub fn encode_apps_from_fragments(
    versions_delta: i64,
    apps_hashcode: &str,
    fragments: &[&[u8]],
    format: Format,
) -> Vec<u8> {
    let sep = separator(format);
    let mut out = apps_head(versions_delta, apps_hashcode, format);
    out.reserve(fragments.iter().map(|f| f.len() + sep.len()).sum::<usize>() + 16);
    for (n, f) in fragments.iter().enumerate() {
        if n > 0 {
            out.extend_from_slice(sep);
        }
        out.extend_from_slice(f);
    }
    out.extend_from_slice(apps_tail(format));
    out
}

pub fn encode_app(app: &AppView, format: Format) -> Vec<u8> {
    match format {
        Format::Json => json::application(app),
        Format::Xml => xml::application(app),
    }
}

pub fn encode_instance(instance: &InstanceView, format: Format) -> Vec<u8> {
    match format {
        Format::Json => json::instance_document(instance),
        Format::Xml => xml::instance_document(instance),
    }
}

/// Whether a registration carried a `dataCenterInfo`, and one with a `name`. Their absence is a
/// validation error, reported after the other checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataCenter {
    Missing,
    Unnamed,
    Named,
}

/// A decoded registration.
#[derive(Clone, Debug, PartialEq)]
pub struct Registration {
    pub info: InstanceInfo,
    pub data_center: DataCenter,
}

/// Why a registration body is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistrationError {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    OverLimit(#[from] LimitExceeded),
}

/// Decodes a `POST apps/{app}` body in `format` (sniffed from the body when `None`), within the
/// per-instance caps. `now` fills the timestamps a registrant left out.
pub fn decode_registration_from(
    mut input: Input<'_>,
    format: Option<Format>,
    now: i64,
    limits: InstanceLimits,
) -> Result<Registration, RegistrationError> {
    let format = format.unwrap_or_else(|| input.sniff());
    let decoded = match format {
        Format::Json => json::read_instance_document(input, now, limits)?,
        Format::Xml => xml::read_instance_document(input, now, limits)?,
    };
    if let Some(over) = decoded.over_limit {
        return Err(over.into());
    }
    let mut info = decoded.info;
    spring_instance_id(&mut info);
    Ok(Registration {
        info,
        data_center: decoded.data_center,
    })
}

/// Decodes a registration body in memory, without caps.
pub fn decode_registration(body: &[u8], format: Format, now: i64) -> Result<Registration, DecodeError> {
    match decode_registration_from(Input::Bytes(body), Some(format), now, InstanceLimits::UNLIMITED) {
        Ok(r) => Ok(r),
        Err(RegistrationError::Decode(e)) => Err(e),
        Err(RegistrationError::OverLimit(e)) => Err(DecodeError::new(e.to_string())),
    }
}

/// Spring Cloud's server codec: a registrant without `instanceId` but with `metadata.instanceId`
/// gets `hostName:metadata.instanceId` (unless that already starts with the host name).
fn spring_instance_id(info: &mut InstanceInfo) {
    if info.instance_id.as_deref().is_some_and(|s| !s.is_empty()) {
        return;
    }
    if let Some(meta_id) = info.metadata.get("instanceId") {
        let id = if meta_id.starts_with(info.host_name.as_str()) {
            meta_id.to_string()
        } else {
            format!("{}:{}", info.host_name, meta_id)
        };
        info.instance_id = Some(id.into());
    }
}

/// Java's `ApplicationResource.addInstance` checks, in its order; the error is the plain-text
/// message Java answers with status 400.
pub fn validate_registration(reg: &Registration, path_app: &str) -> Result<(), String> {
    let info = &reg.info;
    if info.id().trim().is_empty() {
        return Err("Missing instanceId".into());
    }
    if info.host_name.trim().is_empty() {
        return Err("Missing hostname".into());
    }
    if info.ip_addr.trim().is_empty() {
        return Err("Missing ip address".into());
    }
    if info.app.trim().is_empty() {
        return Err("Missing appName".into());
    }
    if info.app != path_app {
        return Err(format!("Mismatched appName, expecting {path_app} but was {}", info.app));
    }
    match reg.data_center {
        DataCenter::Missing => return Err("Missing dataCenterInfo".into()),
        DataCenter::Unnamed => return Err("Missing dataCenterInfo Name".into()),
        DataCenter::Named => {}
    }
    Ok(())
}

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
