//! XML as the Java server writes and reads it (XStream with Eureka's converters): `<applications>`,
//! `<application>`, `<instance>` documents without an XML declaration, `<port enabled="true">`,
//! the `class` markers, the lowercase `<overriddenstatus>`, and XStream's name coding of metadata
//! keys (`_` → `__`, `$` → `_-`).
//!
//! Reading goes through a small, bounded element tree: documents with a DTD are refused (so no
//! entity can be declared), only the predefined and numeric character references are resolved.

use quick_xml::events::Event;

use super::{DataCenter, DecodeError};
use crate::registry::{
    instance::{ActionType, DataCenterInfo, DataCenterName, InstanceInfo, LeaseTerms, Metadata, PortInfo, Status},
    view::{AppView, AppsView, InstanceView},
};

// === writing ===

fn escape_into(out: &mut Vec<u8>, s: &str) {
    for b in s.bytes() {
        match b {
            b'&' => out.extend_from_slice(b"&amp;"),
            b'<' => out.extend_from_slice(b"&lt;"),
            b'>' => out.extend_from_slice(b"&gt;"),
            b'"' => out.extend_from_slice(b"&quot;"),
            b'\'' => out.extend_from_slice(b"&apos;"),
            _ => out.push(b),
        }
    }
}

/// XStream's `XmlFriendlyNameCoder` with Eureka's defaults: `_` → `__`, `$` → `_-`.
pub fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '_' => out.push_str("__"),
            '$' => out.push_str("_-"),
            c => out.push(c),
        }
    }
    out
}

/// The inverse of [`encode_name`].
pub fn decode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '_' {
            match chars.peek() {
                Some('_') => {
                    chars.next();
                    out.push('_');
                }
                Some('-') => {
                    chars.next();
                    out.push('$');
                }
                _ => out.push('_'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn element(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(b'<');
    out.extend_from_slice(name.as_bytes());
    out.push(b'>');
    escape_into(out, value);
    out.extend_from_slice(b"</");
    out.extend_from_slice(name.as_bytes());
    out.push(b'>');
}

fn opt_element(out: &mut Vec<u8>, name: &str, value: Option<&str>) {
    if let Some(v) = value {
        element(out, name, v);
    }
}

fn port(out: &mut Vec<u8>, name: &str, p: PortInfo) {
    out.extend_from_slice(format!("<{name} enabled=\"{}\">{}</{name}>", p.enabled, p.port).as_bytes());
}

fn metadata(out: &mut Vec<u8>, m: &Metadata) {
    if m.is_empty() {
        out.extend_from_slice(b"<metadata class=\"java.util.Collections$EmptyMap\"/>");
        return;
    }
    out.extend_from_slice(b"<metadata>");
    for (k, v) in m.iter() {
        element(out, &encode_name(k), v);
    }
    out.extend_from_slice(b"</metadata>");
}

/// An `<instance>` element.
pub fn instance(out: &mut Vec<u8>, view: &InstanceView) {
    instance_as(out, view, "instance");
}

/// An instance under another element name (e.g. `instanceInfo` in the status document).
pub fn instance_as(out: &mut Vec<u8>, view: &InstanceView, tag: &str) {
    let i = &*view.info;
    let l = &view.lease;
    out.push(b'<');
    out.extend_from_slice(tag.as_bytes());
    out.push(b'>');
    opt_element(out, "instanceId", i.instance_id.as_deref());
    element(out, "hostName", &i.host_name);
    element(out, "app", &i.app);
    element(out, "ipAddr", &i.ip_addr);
    if i.sid != "na" && i.sid != "unknown" {
        element(out, "sid", &i.sid);
    }
    element(out, "status", i.status.as_str());
    element(out, "overriddenstatus", i.overridden_status.as_str());
    port(out, "port", i.port);
    port(out, "securePort", i.secure_port);
    element(out, "countryId", &i.country_id.to_string());
    out.extend_from_slice(b"<dataCenterInfo class=\"");
    out.extend_from_slice(i.data_center_info.class().as_bytes());
    out.extend_from_slice(b"\">");
    element(out, "name", i.data_center_info.name.as_str());
    if i.data_center_info.name == DataCenterName::Amazon {
        metadata(out, &i.data_center_info.metadata);
    }
    out.extend_from_slice(b"</dataCenterInfo><leaseInfo>");
    element(out, "renewalIntervalInSecs", &l.renewal_interval_secs.to_string());
    element(out, "durationInSecs", &l.duration_secs.to_string());
    element(out, "registrationTimestamp", &l.registration_ts.to_string());
    element(out, "lastRenewalTimestamp", &l.last_renewal_ts.to_string());
    element(out, "evictionTimestamp", &l.eviction_ts.to_string());
    element(out, "serviceUpTimestamp", &l.service_up_ts.to_string());
    out.extend_from_slice(b"</leaseInfo>");
    metadata(out, &i.metadata);
    opt_element(out, "appGroupName", i.app_group_name.as_deref());
    opt_element(out, "homePageUrl", i.home_page_url.as_deref());
    opt_element(out, "statusPageUrl", i.status_page_url.as_deref());
    opt_element(out, "healthCheckUrl", i.health_check_url.as_deref());
    opt_element(out, "secureHealthCheckUrl", i.secure_health_check_url.as_deref());
    opt_element(out, "vipAddress", i.vip_address.as_deref());
    opt_element(out, "secureVipAddress", i.secure_vip_address.as_deref());
    element(out, "isCoordinatingDiscoveryServer", "false");
    element(out, "lastUpdatedTimestamp", &i.last_updated_timestamp.to_string());
    element(out, "lastDirtyTimestamp", &i.last_dirty_timestamp.to_string());
    opt_element(out, "actionType", i.action_type.map(ActionType::as_str));
    opt_element(out, "asgName", i.asg_name.as_deref());
    out.extend_from_slice(b"</");
    out.extend_from_slice(tag.as_bytes());
    out.push(b'>');
}

fn application_into(out: &mut Vec<u8>, app: &AppView) {
    out.extend_from_slice(b"<application>");
    element(out, "name", &app.name);
    for i in &app.instances {
        instance(out, i);
    }
    out.extend_from_slice(b"</application>");
}

/// An `<applications>` document up to its first `<application>`.
pub fn applications_head(versions_delta: i64, apps_hashcode: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(112 + apps_hashcode.len());
    out.extend_from_slice(b"<applications>");
    element(&mut out, "versions__delta", &versions_delta.to_string());
    element(&mut out, "apps__hashcode", apps_hashcode);
    out
}

/// What closes an `<applications>` document.
pub const APPLICATIONS_TAIL: &[u8] = b"</applications>";

/// An `<applications>` document.
pub fn applications(view: &AppsView) -> Vec<u8> {
    super::encode_apps(view, super::Format::Xml)
}

/// An `<application>` document.
pub fn application(app: &AppView) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + app.instances.len() * 1400);
    application_into(&mut out, app);
    out
}

/// An `<instance>` document.
pub fn instance_document(view: &InstanceView) -> Vec<u8> {
    let mut out = Vec::with_capacity(1400);
    instance(&mut out, view);
    out
}

// === reading ===

/// Bounds on what a request document may contain.
const MAX_DEPTH: usize = 16;
const MAX_ELEMENTS: usize = 10_000;

/// A parsed element: name, attributes, text and children.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Element {
    pub name: String,
    pub attributes: Vec<(String, String)>,
    pub text: String,
    pub children: Vec<Element>,
}

impl Element {
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// Trimmed text.
    pub fn value(&self) -> &str {
        self.text.trim()
    }
}

fn resolve_entity(name: &str) -> Option<char> {
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        _ => return None,
    })
}

fn open(e: &quick_xml::events::BytesStart<'_>) -> Result<Element, DecodeError> {
    let name = e.name().0.to_string();
    let mut attributes = Vec::new();
    for a in e.attributes() {
        let a = a.map_err(|err| DecodeError::new(format!("invalid XML attribute: {err}")))?;
        let key = a.key.0.to_string();
        let value = a
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map_err(|err| DecodeError::new(format!("invalid XML attribute value: {err}")))?
            .into_owned();
        attributes.push((key, value));
    }
    Ok(Element {
        name,
        attributes,
        text: String::new(),
        children: Vec::new(),
    })
}

/// Parses a whole document into its root element.
pub fn parse(body: &str) -> Result<Element, DecodeError> {
    let mut reader = quick_xml::Reader::from_str(body);
    reader.config_mut().check_end_names = true;
    let mut stack: Vec<Element> = Vec::new();
    let mut root: Option<Element> = None;
    let mut count = 0usize;
    loop {
        let event = reader
            .read_event()
            .map_err(|e| DecodeError::new(format!("invalid XML: {e}")))?;
        match event {
            Event::DocType(_) => return Err(DecodeError::new("XML documents with a DTD are not accepted")),
            Event::Start(e) | Event::Empty(e) if root.is_some() => {
                let _ = e;
                return Err(DecodeError::new("invalid XML: content after the root element"));
            }
            Event::Start(e) => {
                count += 1;
                if stack.len() >= MAX_DEPTH || count > MAX_ELEMENTS {
                    return Err(DecodeError::new("XML document too deep or too large"));
                }
                stack.push(open(&e)?);
            }
            Event::Empty(e) => {
                count += 1;
                if count > MAX_ELEMENTS {
                    return Err(DecodeError::new("XML document too large"));
                }
                let el = open(&e)?;
                match stack.last_mut() {
                    Some(parent) => parent.children.push(el),
                    None => root = Some(el),
                }
            }
            Event::End(_) => {
                let el = stack
                    .pop()
                    .ok_or_else(|| DecodeError::new("invalid XML: unbalanced end tag"))?;
                match stack.last_mut() {
                    Some(parent) => parent.children.push(el),
                    None => root = Some(el),
                }
            }
            Event::Text(t) => {
                if let Some(el) = stack.last_mut() {
                    el.text.push_str(&t.xml10_content());
                } else if !t.xml10_content().trim().is_empty() {
                    return Err(DecodeError::new("invalid XML: text outside the root element"));
                }
            }
            Event::CData(t) => {
                if let Some(el) = stack.last_mut() {
                    el.text.push_str(&t.xml10_content());
                }
            }
            Event::GeneralRef(r) => {
                let c = if r.is_char_ref() {
                    r.resolve_char_ref()
                        .map_err(|e| DecodeError::new(format!("invalid character reference: {e}")))?
                } else {
                    resolve_entity(&r.xml10_content())
                };
                let c = c.ok_or_else(|| DecodeError::new(format!("undefined XML entity &{};", r.xml10_content())))?;
                if let Some(el) = stack.last_mut() {
                    el.text.push(c);
                }
            }
            Event::Decl(_) | Event::Comment(_) | Event::PI(_) => {}
            Event::Eof => break,
        }
    }
    if !stack.is_empty() {
        return Err(DecodeError::new("invalid XML: unclosed element"));
    }
    root.ok_or_else(|| DecodeError::new("empty XML document"))
}

fn int<T: std::str::FromStr>(el: &Element, what: &str) -> Result<T, DecodeError> {
    el.value()
        .parse::<T>()
        .map_err(|_| DecodeError::new(format!("{what} must be a number, got {:?}", el.value())))
}

fn metadata_of(el: &Element) -> Metadata {
    el.children
        .iter()
        .map(|c| (decode_name(&c.name), c.text.clone()))
        .collect()
}

/// What XStream makes of an `<instance>` element.
pub fn instance_from_element(el: &Element, now: i64) -> Result<(InstanceInfo, DataCenter), DecodeError> {
    if el.name != "instance" {
        return Err(DecodeError::new(format!(
            "expected an <instance> document, got <{}>",
            el.name
        )));
    }
    let mut i = InstanceInfo::new("", "", "", now);
    i.host_name.clear();
    let mut data_center = DataCenter::Missing;
    for c in &el.children {
        let v = || Some(c.text.clone());
        match c.name.as_str() {
            "hostName" => i.host_name = c.text.clone(),
            "instanceId" => i.instance_id = v(),
            "app" => i.app = c.text.to_ascii_uppercase(),
            "ipAddr" => i.ip_addr = c.text.clone(),
            "sid" => i.sid = c.text.clone(),
            "status" => i.status = Status::parse_lenient(&c.text),
            "overriddenstatus" | "overriddenStatus" => i.overridden_status = Status::parse_lenient(&c.text),
            "port" => {
                i.port = PortInfo {
                    port: int(c, "port")?,
                    enabled: c.attribute("enabled") != Some("false"),
                };
            }
            "securePort" => {
                i.secure_port = PortInfo {
                    port: int(c, "securePort")?,
                    enabled: c.attribute("enabled") == Some("true"),
                };
            }
            "countryId" => i.country_id = int(c, "countryId")?,
            "dataCenterInfo" => {
                let Some(name) = c.child("name").map(Element::value) else {
                    data_center = DataCenter::Unnamed;
                    continue;
                };
                let name = if name.eq_ignore_ascii_case("amazon") {
                    DataCenterName::Amazon
                } else {
                    DataCenterName::parse_exact(name)
                        .ok_or_else(|| DecodeError::new(format!("unknown dataCenterInfo name {name:?}")))?
                };
                let metadata = match c.child("metadata") {
                    Some(m) if name == DataCenterName::Amazon => metadata_of(m),
                    _ => Metadata::new(),
                };
                i.data_center_info = DataCenterInfo { name, metadata };
                data_center = DataCenter::Named;
            }
            "leaseInfo" => {
                let mut terms = LeaseTerms {
                    renewal_interval_secs: 0,
                    duration_secs: 0,
                };
                for f in &c.children {
                    match f.name.as_str() {
                        "renewalIntervalInSecs" => terms.renewal_interval_secs = int(f, "renewalIntervalInSecs")?,
                        "durationInSecs" => terms.duration_secs = int(f, "durationInSecs")?,
                        _ => {}
                    }
                }
                i.lease = terms;
            }
            "metadata" => i.metadata = metadata_of(c),
            // XStream's @Auto fields swallow parse errors and keep the default.
            "appGroupName" => i.app_group_name = Some(c.text.to_ascii_uppercase()),
            "homePageUrl" => i.home_page_url = v(),
            "statusPageUrl" => i.status_page_url = v(),
            "healthCheckUrl" => i.health_check_url = v(),
            "secureHealthCheckUrl" => i.secure_health_check_url = v(),
            "vipAddress" => i.vip_address = v(),
            "secureVipAddress" => i.secure_vip_address = v(),
            "lastUpdatedTimestamp" => {
                if let Ok(t) = c.value().parse() {
                    i.last_updated_timestamp = t;
                }
            }
            "lastDirtyTimestamp" => {
                if let Ok(t) = c.value().parse() {
                    i.last_dirty_timestamp = t;
                }
            }
            "actionType" => i.action_type = ActionType::parse_exact(c.value()),
            "asgName" => i.asg_name = v(),
            _ => {}
        }
    }
    Ok((i, data_center))
}
