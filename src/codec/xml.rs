//! XML as the Java server writes and reads it (XStream with Eureka's converters): `<applications>`,
//! `<application>`, `<instance>` documents without an XML declaration, `<port enabled="true">`,
//! the `class` markers, the lowercase `<overriddenstatus>`, and XStream's name coding of metadata
//! keys (`_` → `__`, `$` → `_-`, any other character an XML name cannot hold → `_.` and its four
//! hex digits).
//!
//! Every document written is well-formed whatever is stored. Metadata keys are name-coded as the
//! Java server codes them (`a b` → `a_.0020b`, `x><evil/` → `x_.003e_.003cevil_.002f`, `1a` →
//! `_.0031a`, an emoji → its surrogate pair `_.d83d_.de00`), except that ours also codes `:`
//! (`_.003a`), which Java writes as is and namespace-aware readers (Python's ElementTree, so
//! py-eureka-client) refuse as an unbound prefix; XStream decodes both. Characters XML 1.0 cannot
//! carry become U+FFFD (Java writes `&#x1;`, which no XML 1.0 parser accepts), and a carriage
//! return is written as `&#xd;`, as Java does, so it survives. An empty key cannot be named (Java
//! writes `<>`), so it is never stored (see `registry::limits`) and never written.
//!
//! Reading is a streaming pull over the document: known elements are read as they come, unknown
//! ones are skipped without being kept, so memory stays proportional to what is kept. Documents
//! with a DTD are refused (so no entity can be declared), only the predefined and numeric
//! character references are resolved, and nesting is bounded.

use std::io::BufRead;

use quick_xml::events::{BytesStart, Event};

use super::{DataCenter, DecodeError, Input};
use crate::registry::{
    instance::{ActionType, DataCenterInfo, DataCenterName, InstanceInfo, LeaseTerms, Metadata, PortInfo, Status},
    limits::{InstanceLimits, LimitExceeded},
    view::{AppView, AppsView, InstanceView},
};

// === writing ===

/// Whether XML 1.0 can carry `c` at all (its `Char` production).
pub(crate) fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
}

fn escape_into(out: &mut Vec<u8>, s: &str) {
    let special = |c: char| matches!(c, '&' | '<' | '>' | '"' | '\'' | '\r') || !is_xml_char(c);
    let mut rest = s;
    while let Some(i) = rest.find(special) {
        out.extend_from_slice(&rest.as_bytes()[..i]);
        let c = rest[i..].chars().next().unwrap_or('\u{FFFD}');
        match c {
            '&' => out.extend_from_slice(b"&amp;"),
            '<' => out.extend_from_slice(b"&lt;"),
            '>' => out.extend_from_slice(b"&gt;"),
            '"' => out.extend_from_slice(b"&quot;"),
            '\'' => out.extend_from_slice(b"&apos;"),
            '\r' => out.extend_from_slice(b"&#xd;"),
            _ => out.extend_from_slice("\u{FFFD}".as_bytes()),
        }
        rest = &rest[i + c.len_utf8()..];
    }
    out.extend_from_slice(rest.as_bytes());
}

/// `s` as XML text or attribute value, for other modules that write XML.
pub fn escape(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    escape_into(&mut out, s);
    String::from_utf8(out).unwrap_or_default()
}

/// XML 1.0's `NameStartChar` as XStream's coder applies it to Java's UTF-16 code units (so a
/// character outside the Basic Multilingual Plane is coded, as its surrogate pair), without `:`,
/// which namespace-aware readers take for a prefix separator.
fn is_name_start(c: char) -> bool {
    matches!(c,
        'A'..='Z' | 'a'..='z' | '_' | '\u{C0}'..='\u{D6}' | '\u{D8}'..='\u{F6}' | '\u{F8}'..='\u{2FF}'
        | '\u{370}'..='\u{37D}' | '\u{37F}'..='\u{1FFF}' | '\u{200C}'..='\u{200D}' | '\u{2070}'..='\u{218F}'
        | '\u{2C00}'..='\u{2FEF}' | '\u{3001}'..='\u{D7FF}' | '\u{F900}'..='\u{FDCF}' | '\u{FDF0}'..='\u{FFFD}')
}

fn is_name_char(c: char) -> bool {
    is_name_start(c) || matches!(c, '-' | '.' | '0'..='9' | '\u{B7}' | '\u{300}'..='\u{36F}' | '\u{203F}'..='\u{2040}')
}

/// XStream's `XmlFriendlyNameCoder` with Eureka's settings: `_` → `__`, `$` → `_-`, and every
/// character a name cannot hold at its place → `_.` and its UTF-16 code unit(s) in four hex
/// digits, which XStream's decoder turns back into the key. Well-formed for any non-empty key.
pub fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, c) in name.chars().enumerate() {
        match c {
            '_' => out.push_str("__"),
            '$' => out.push_str("_-"),
            c if (i == 0 && is_name_start(c)) || (i > 0 && is_name_char(c)) => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("_.{unit:04x}"));
                }
            }
        }
    }
    out
}

/// The inverse of [`encode_name`] (and of XStream's coder).
pub fn decode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut units: Vec<u16> = Vec::new();
    let flush = |units: &mut Vec<u16>, out: &mut String| {
        out.extend(char::decode_utf16(units.drain(..)).map(|r| r.unwrap_or('\u{FFFD}')));
    };
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        let hex = rest.strip_prefix("_.").and_then(|r| r.get(..4));
        if let Some(unit) = hex
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|h| u16::from_str_radix(h, 16).ok())
        {
            units.push(unit);
            rest = &rest[6..];
            continue;
        }
        flush(&mut units, &mut out);
        if let Some(r) = rest.strip_prefix("_-") {
            out.push('$');
            rest = r;
        } else if let Some(r) = rest.strip_prefix("__") {
            out.push('_');
            rest = r;
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    flush(&mut units, &mut out);
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
    for (k, v) in m.iter().filter(|(k, _)| !k.is_empty()) {
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
    if i.sid() != "na" && i.sid() != "unknown" {
        element(out, "sid", i.sid());
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
    opt_element(out, "appGroupName", i.app_group_name());
    opt_element(out, "homePageUrl", i.home_page_url.as_deref());
    opt_element(out, "statusPageUrl", i.status_page_url.as_deref());
    opt_element(out, "healthCheckUrl", i.health_check_url.as_deref());
    opt_element(out, "secureHealthCheckUrl", i.secure_health_check_url());
    opt_element(out, "vipAddress", i.vip_address.as_deref());
    opt_element(out, "secureVipAddress", i.secure_vip_address.as_deref());
    element(out, "isCoordinatingDiscoveryServer", "false");
    element(out, "lastUpdatedTimestamp", &i.last_updated_timestamp.to_string());
    element(out, "lastDirtyTimestamp", &i.last_dirty_timestamp.to_string());
    opt_element(out, "actionType", i.action_type.map(ActionType::as_str));
    opt_element(out, "asgName", i.asg_name());
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

/// Elements nested deeper than this are refused.
const MAX_DEPTH: usize = 16;

/// What the pull returns: elements opening and closing (an empty element is both), and the end.
/// Text is handed to the caller that asks for it, and dropped otherwise.
enum Node {
    Open { name: String, enabled: Option<String> },
    Close,
}

fn unclosed() -> DecodeError {
    DecodeError::new("invalid XML: unclosed element")
}

/// A streaming pull over one document.
struct Pull<R: BufRead> {
    reader: quick_xml::Reader<R>,
    buf: Vec<u8>,
    /// Elements open now.
    depth: usize,
    /// Whether the root element has closed.
    done: bool,
}

/// The character a reference (`&#65;`, `&#x41;` or one of XML's five entities) stands for.
fn reference(r: &quick_xml::events::BytesRef<'_>) -> Result<char, DecodeError> {
    let c = if r.is_char_ref() {
        r.resolve_char_ref()
            .map_err(|e| DecodeError::new(format!("invalid character reference: {e}")))?
    } else {
        resolve_entity(&r.xml10_content())
    };
    c.ok_or_else(|| DecodeError::new(format!("undefined XML entity &{};", r.xml10_content())))
}

/// An element's name, and its `enabled` attribute (the only one read); every attribute is checked.
fn open(e: &BytesStart<'_>) -> Result<Node, DecodeError> {
    let mut enabled = None;
    for a in e.attributes() {
        let a = a.map_err(|err| DecodeError::new(format!("invalid XML attribute: {err}")))?;
        let value = a
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map_err(|err| DecodeError::new(format!("invalid XML attribute value: {err}")))?;
        if a.key.0 == "enabled" && enabled.is_none() {
            enabled = Some(value.into_owned());
        }
    }
    Ok(Node::Open {
        name: e.name().0.to_string(),
        enabled,
    })
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

impl<R: BufRead> Pull<R> {
    fn new(input: R) -> Pull<R> {
        let mut reader = quick_xml::Reader::from_reader(input);
        let config = reader.config_mut();
        config.check_end_names = true;
        config.expand_empty_elements = true;
        Pull {
            reader,
            buf: Vec::new(),
            depth: 0,
            done: false,
        }
    }

    /// The next element boundary; character data on the way is appended to `text`, if given.
    /// `None` at the end of the document.
    fn next(&mut self, mut text: Option<&mut String>) -> Result<Option<Node>, DecodeError> {
        loop {
            self.buf.clear();
            let event = self
                .reader
                .read_event_into(&mut self.buf)
                .map_err(|e| DecodeError::new(format!("invalid XML: {e}")))?;
            match event {
                Event::DocType(_) => return Err(DecodeError::new("XML documents with a DTD are not accepted")),
                Event::Start(e) | Event::Empty(e) => {
                    if self.done {
                        return Err(DecodeError::new("invalid XML: content after the root element"));
                    }
                    if self.depth >= MAX_DEPTH {
                        return Err(DecodeError::new("XML document too deep"));
                    }
                    self.depth += 1;
                    return open(&e).map(Some);
                }
                Event::End(_) => {
                    self.depth = self
                        .depth
                        .checked_sub(1)
                        .ok_or_else(|| DecodeError::new("invalid XML: unbalanced end tag"))?;
                    self.done = self.depth == 0;
                    return Ok(Some(Node::Close));
                }
                Event::Text(t) => {
                    let content = t.xml10_content();
                    if self.depth == 0 {
                        if !content.trim().is_empty() {
                            return Err(DecodeError::new("invalid XML: text outside the root element"));
                        }
                    } else if let Some(out) = text.as_mut() {
                        out.push_str(&content);
                    }
                }
                Event::CData(t) => {
                    if self.depth > 0
                        && let Some(out) = text.as_mut()
                    {
                        out.push_str(&t.xml10_content());
                    }
                }
                Event::GeneralRef(r) => {
                    let c = reference(&r)?;
                    if self.depth > 0
                        && let Some(out) = text.as_mut()
                    {
                        out.push(c);
                    }
                }
                Event::Decl(_) | Event::Comment(_) | Event::PI(_) => {}
                Event::Eof if self.depth > 0 => return Err(unclosed()),
                Event::Eof => return Ok(None),
            }
        }
    }

    /// The next child of the element open now: `None` when it closes.
    fn child(&mut self) -> Result<Option<(String, Option<String>)>, DecodeError> {
        match self.next(None)? {
            Some(Node::Open { name, enabled }) => Ok(Some((name, enabled))),
            Some(Node::Close) => Ok(None),
            None => Err(unclosed()),
        }
    }

    /// Skips the rest of the element open now, keeping nothing.
    fn skip(&mut self) -> Result<(), DecodeError> {
        let level = self.depth;
        while self.depth >= level {
            if self.next(None)?.is_none() {
                return Err(unclosed());
            }
        }
        Ok(())
    }

    /// The text of the element open now (its children's text excluded), up to its end.
    fn text(&mut self) -> Result<String, DecodeError> {
        let mut out = String::new();
        let level = self.depth;
        while self.depth >= level {
            let own = (self.depth == level).then_some(&mut out);
            if self.next(own)?.is_none() {
                return Err(unclosed());
            }
        }
        Ok(out)
    }

    /// The root element's name.
    fn root(&mut self) -> Result<String, DecodeError> {
        match self.next(None)? {
            Some(Node::Open { name, .. }) => Ok(name),
            Some(Node::Close) => Err(DecodeError::new("invalid XML: unbalanced end tag")),
            None => Err(DecodeError::new("empty XML document")),
        }
    }

    /// Checks that nothing but comments and whitespace follows the root element.
    fn finish(&mut self) -> Result<(), DecodeError> {
        match self.next(None)? {
            None => Ok(()),
            Some(_) => Err(DecodeError::new("invalid XML: content after the root element")),
        }
    }
}

fn int<T: std::str::FromStr>(text: &str, what: &str) -> Result<T, DecodeError> {
    let v = text.trim();
    v.parse::<T>()
        .map_err(|_| DecodeError::new(format!("{what} must be a number, got {v:?}")))
}

/// A `<metadata>` element's entries (names decoded; a repeated key keeps its place and takes the
/// last value), within the caps: past them, entries are skipped and the cap is reported.
fn read_metadata<R: BufRead>(
    p: &mut Pull<R>,
    limits: InstanceLimits,
) -> Result<(Metadata, Option<LimitExceeded>), DecodeError> {
    let mut m = Metadata::new();
    let mut over = None;
    while let Some((name, _)) = p.child()? {
        if over.is_some() {
            p.skip()?;
            continue;
        }
        let value = p.text()?;
        m.insert(decode_name(&name), value);
        if m.len() > limits.max_metadata_keys {
            over = Some(LimitExceeded::MetadataKeys {
                limit: limits.max_metadata_keys,
            });
        } else if m.bytes() > limits.max_bytes {
            over = Some(LimitExceeded::InstanceBytes {
                limit: limits.max_bytes,
            });
        }
        if over.is_some() {
            m = Metadata::new();
        }
    }
    Ok((m, over))
}

/// `<dataCenterInfo>`: `None` without a `<name>` (a validation error, not a decode error).
fn data_center<R: BufRead>(
    p: &mut Pull<R>,
    limits: InstanceLimits,
) -> Result<Option<(DataCenterInfo, Option<LimitExceeded>)>, DecodeError> {
    let mut name = None;
    let mut meta = None;
    while let Some((child, _)) = p.child()? {
        match child.as_str() {
            "name" if name.is_none() => name = Some(p.text()?),
            "metadata" if meta.is_none() => meta = Some(read_metadata(p, limits)?),
            _ => p.skip()?,
        }
    }
    let Some(name) = name else { return Ok(None) };
    let name = name.trim();
    let name = if name.eq_ignore_ascii_case("amazon") {
        DataCenterName::Amazon
    } else {
        DataCenterName::parse_exact(name)
            .ok_or_else(|| DecodeError::new(format!("unknown dataCenterInfo name {name:?}")))?
    };
    let (metadata, over) = match meta {
        Some(m) if name == DataCenterName::Amazon => m,
        _ => (Metadata::new(), None),
    };
    Ok(Some((DataCenterInfo { name, metadata }, over)))
}

fn lease<R: BufRead>(p: &mut Pull<R>) -> Result<LeaseTerms, DecodeError> {
    let mut terms = LeaseTerms {
        renewal_interval_secs: 0,
        duration_secs: 0,
    };
    while let Some((child, _)) = p.child()? {
        match child.as_str() {
            "renewalIntervalInSecs" => terms.renewal_interval_secs = int(&p.text()?, "renewalIntervalInSecs")?,
            "durationInSecs" => terms.duration_secs = int(&p.text()?, "durationInSecs")?,
            _ => p.skip()?,
        }
    }
    Ok(terms)
}

/// What XStream makes of an `<instance>` document.
fn read_instance<R: BufRead>(
    mut p: Pull<R>,
    now: i64,
    limits: InstanceLimits,
) -> Result<super::DecodedInstance, DecodeError> {
    let root = p.root()?;
    if root != "instance" {
        return Err(DecodeError::new(format!(
            "expected an <instance> document, got <{root}>"
        )));
    }
    let mut i = InstanceInfo::new("", "", "", now);
    i.host_name.clear();
    let mut data_center_seen = DataCenter::Missing;
    let mut over_limit = None;
    while let Some((child, enabled)) = p.child()? {
        match child.as_str() {
            "port" => {
                i.port = PortInfo {
                    port: int(&p.text()?, "port")?,
                    enabled: enabled.as_deref() != Some("false"),
                };
            }
            "securePort" => {
                i.secure_port = PortInfo {
                    port: int(&p.text()?, "securePort")?,
                    enabled: enabled.as_deref() == Some("true"),
                };
            }
            "dataCenterInfo" => match data_center(&mut p, limits)? {
                Some((dc, over)) => {
                    i.data_center_info = dc;
                    data_center_seen = DataCenter::Named;
                    over_limit = over_limit.or(over);
                }
                None => data_center_seen = DataCenter::Unnamed,
            },
            "leaseInfo" => i.lease = lease(&mut p)?,
            "metadata" => {
                let (m, over) = read_metadata(&mut p, limits)?;
                i.metadata = m;
                over_limit = over_limit.or(over);
            }
            field => {
                if !set_text(&mut i, field, &mut p)? {
                    p.skip()?;
                }
            }
        }
    }
    p.finish()?;
    if over_limit.is_none() {
        over_limit = limits.check(&i).err();
    }
    Ok(super::DecodedInstance {
        info: i,
        data_center: data_center_seen,
        over_limit,
    })
}

/// Sets an instance's text field from its element, read from `p`; false (nothing read) for an
/// element that is not one.
fn set_text<R: BufRead>(i: &mut InstanceInfo, field: &str, p: &mut Pull<R>) -> Result<bool, DecodeError> {
    match field {
        "hostName" => i.host_name = p.text()?.into(),
        "instanceId" => i.instance_id = Some(p.text()?.into()),
        "app" => i.app = p.text()?.to_ascii_uppercase().into(),
        "ipAddr" => i.ip_addr = p.text()?.into(),
        "sid" => i.set_sid(p.text()?),
        "status" => i.status = Status::parse_lenient(&p.text()?),
        "overriddenstatus" | "overriddenStatus" => i.overridden_status = Status::parse_lenient(&p.text()?),
        "countryId" => i.country_id = int(&p.text()?, "countryId")?,
        // XStream's @Auto fields swallow parse errors and keep the default.
        "appGroupName" => i.set_app_group_name(Some(p.text()?.to_ascii_uppercase().into())),
        "homePageUrl" => i.home_page_url = Some(p.text()?.into()),
        "statusPageUrl" => i.status_page_url = Some(p.text()?.into()),
        "healthCheckUrl" => i.health_check_url = Some(p.text()?.into()),
        "secureHealthCheckUrl" => i.set_secure_health_check_url(Some(p.text()?.into())),
        "vipAddress" => i.vip_address = Some(p.text()?.into()),
        "secureVipAddress" => i.secure_vip_address = Some(p.text()?.into()),
        "lastUpdatedTimestamp" => {
            if let Ok(t) = p.text()?.trim().parse() {
                i.last_updated_timestamp = t;
            }
        }
        "lastDirtyTimestamp" => {
            if let Ok(t) = p.text()?.trim().parse() {
                i.last_dirty_timestamp = t;
            }
        }
        "actionType" => i.action_type = ActionType::parse_exact(p.text()?.trim()),
        "asgName" => i.set_asg_name(Some(p.text()?.into())),
        _ => return Ok(false),
    }
    Ok(true)
}

/// A registration body: an `<instance>` document.
pub fn read_instance_document(
    input: Input<'_>,
    now: i64,
    limits: InstanceLimits,
) -> Result<super::DecodedInstance, DecodeError> {
    match input {
        Input::Bytes(b) => read_instance(Pull::new(b), now, limits),
        Input::Stream(r) => read_instance(Pull::new(r), now, limits),
    }
}
