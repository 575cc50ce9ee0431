//! The link protocol, both sides: what a puller asks for and how the answer is read.
//!
//! `GET {base}link/apps?since=V&epoch=E&include=A,B&exclude=C`, with the puller's cluster in
//! [`CLUSTER_HEADER`]. The answer is a Eureka JSON `applications` document of the source's export
//! (its own instances, no imports, no cluster-local applications, filtered by the lists), whose
//! `versions__delta` is the source's registry version and whose `apps__hashcode` is the hash code
//! of the whole filtered export. With a known `epoch` and `since` the document holds only the
//! applications changed since that version, each whole, and [`APPS_HEADER`] names them all
//! (those left without instances too); otherwise, or when the source's change log no longer
//! reaches back, everything, marked by [`FULL_HEADER`]. A poll when nothing changed is an empty
//! document. Hand-written rather than Netflix's remote-region fetch because that one resends
//! minutes of changes every poll and cannot leave out what the source itself imported.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

use crate::{codec, registry::instance::InstanceInfo};

/// The path under a Eureka base URL.
pub const PATH: &str = "link/apps";
/// The puller's cluster (refused when it is the source's own: a link to itself).
pub const CLUSTER_HEADER: &str = "x-eureka-link-cluster";
/// The source's epoch: versions are comparable only within one epoch (one process).
pub const EPOCH_HEADER: &str = "x-eureka-link-epoch";
/// `true` when the answer is the whole export.
pub const FULL_HEADER: &str = "x-eureka-link-full";
/// The applications a changes answer covers, comma-separated and percent-encoded.
pub const APPS_HEADER: &str = "x-eureka-link-apps";

/// What may stay unencoded in an application name in a header or query.
const NAME: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');

/// A comma-separated list of names, each percent-encoded.
pub fn encode_names<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names
        .into_iter()
        .map(|n| utf8_percent_encode(n, NAME).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The names of [`encode_names`], upper-cased as Eureka keys applications.
pub fn decode_names(list: &str) -> Vec<String> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| percent_decode_str(s).decode_utf8_lossy().to_ascii_uppercase())
        .collect()
}

/// What a puller asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// The epoch and version of the copy it holds (`None`: send everything).
    pub since: Option<(String, u64)>,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

impl Request {
    /// The query string (without `?`).
    pub fn query(&self) -> String {
        let mut parts = Vec::new();
        if let Some((epoch, version)) = &self.since {
            parts.push(format!("since={version}"));
            parts.push(format!("epoch={}", utf8_percent_encode(epoch, NAME)));
        }
        if !self.include.is_empty() {
            parts.push(format!(
                "include={}",
                encode_names(self.include.iter().map(String::as_str))
            ));
        }
        if !self.exclude.is_empty() {
            parts.push(format!(
                "exclude={}",
                encode_names(self.exclude.iter().map(String::as_str))
            ));
        }
        parts.join("&")
    }

    /// Reads a query string; unknown parameters are ignored, a bad `since` is an error.
    pub fn parse(query: Option<&str>) -> Result<Request, String> {
        let mut out = Request::default();
        let (mut since, mut epoch) = (None, None);
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "since" => {
                    since = Some(
                        v.parse::<u64>()
                            .map_err(|_| format!("`since` {v:?} is not a version"))?,
                    )
                }
                "epoch" => epoch = Some(percent_decode_str(v).decode_utf8_lossy().into_owned()),
                "include" => out.include = decode_names(v),
                "exclude" => out.exclude = decode_names(v),
                _ => {}
            }
        }
        out.since = epoch.zip(since);
        Ok(out)
    }

    /// Whether the request's lists let `app` through.
    pub fn wants(&self, app: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|a| a == app)) && !self.exclude.iter().any(|a| a == app)
    }
}

/// What a source answered.
#[derive(Clone, Debug, Default)]
pub struct Answer {
    pub epoch: String,
    pub version: u64,
    pub full: bool,
    /// The hash code of the whole filtered export.
    pub hashcode: String,
    /// The applications covered, each with its instances now (empty: none left).
    pub apps: Vec<(String, Vec<InstanceInfo>)>,
}

impl Answer {
    /// Reads an answer from its headers (epoch, full, apps) and body.
    pub fn decode(
        epoch: Option<&str>,
        full: Option<&str>,
        apps: Option<&str>,
        body: &[u8],
        now: i64,
    ) -> Result<Answer, String> {
        let epoch = epoch.ok_or("the answer has no epoch header")?.to_string();
        let full = full == Some("true");
        let head: Head = serde_json::from_slice(body).map_err(|e| format!("invalid JSON: {e}"))?;
        let version = head
            .applications
            .versions_delta
            .parse::<u64>()
            .map_err(|_| "the answer's versions__delta is not a version".to_string())?;
        let instances = codec::json::applications_from_slice(body, now).map_err(|e| e.to_string())?;
        let mut grouped: std::collections::BTreeMap<String, Vec<InstanceInfo>> = std::collections::BTreeMap::new();
        if !full {
            for app in decode_names(apps.unwrap_or("")) {
                grouped.entry(app).or_default();
            }
        }
        for info in instances {
            if !full && !grouped.contains_key(info.app.as_str()) {
                return Err(format!("the answer holds {} but does not name it", info.app));
            }
            grouped.entry(info.app.to_string()).or_default().push(info);
        }
        Ok(Answer {
            epoch,
            version,
            full,
            hashcode: head.applications.apps_hashcode,
            apps: grouped.into_iter().collect(),
        })
    }
}

/// The two header fields of an `applications` document (the rest is skipped).
#[derive(serde::Deserialize)]
struct Head {
    applications: HeadFields,
}

#[derive(serde::Deserialize)]
struct HeadFields {
    #[serde(rename = "versions__delta")]
    versions_delta: String,
    #[serde(rename = "apps__hashcode", default)]
    apps_hashcode: String,
}

/// The total number of instances a reconcile hash code counts (`UP_3_DOWN_1_` → 4).
pub fn hashcode_total(hash: &str) -> u64 {
    hash.split('_').filter_map(|part| part.parse::<u64>().ok()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_survives_its_query_string() {
        let r = Request {
            since: Some(("e-1".into(), 42)),
            include: vec!["ORDERS".into(), "A,B".into()],
            exclude: vec!["X Y".into()],
        };
        assert_eq!(Request::parse(Some(&r.query())).unwrap(), r);
        assert_eq!(Request::parse(None).unwrap(), Request::default());
        assert!(Request::parse(Some("since=x&epoch=e")).is_err());
        assert!(r.wants("ORDERS") && !r.wants("BILLING"));
        assert_eq!(hashcode_total("DOWN_1_OUT_OF_SERVICE_2_UP_10_"), 13);
        assert_eq!(hashcode_total(""), 0);
    }
}
