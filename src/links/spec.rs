//! The remote clusters file (`--remote-clusters-file`): a YAML list of links, parsed and checked
//! as a whole, so that a bad edit is refused with a message and the links that run keep running.

use std::{collections::BTreeSet, path::PathBuf, time::Duration};

use serde::Deserialize;

use crate::registry::imports::{OnWithdraw, Visibility};

/// A problem with the file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read the remote clusters file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("failed to parse the remote clusters file: {0}")]
    Parse(String),
    #[error("failed to accept link {link:?}: {reason}")]
    Invalid { link: String, reason: String },
}

/// How a link's instances appear, as the file spells it.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
pub enum VisibilitySpec {
    #[default]
    Merged,
    Fallback,
    OnRequest,
}

/// What a partition withdraws, as the file spells it.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
pub enum OnWithdrawSpec {
    #[default]
    UnlessOnlySource,
    Always,
    Never,
}

/// Which applications a link imports.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AppsSpec {
    /// Only these (all when empty).
    #[serde(default)]
    pub include: Vec<String>,
    /// Never these.
    #[serde(default)]
    pub exclude: Vec<String>,
}

/// One link, as written in the file.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LinkSpec {
    /// The link's name (also the name clients ask for with `?regions=`).
    pub name: String,
    /// The other cluster's Eureka URLs (`.../eureka/`), tried in turn.
    pub urls: Vec<String>,
    /// A file holding the user name of read-only client credentials.
    #[serde(default)]
    pub username_file: Option<PathBuf>,
    /// A file holding their password.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// The CA that signs the other side's certificate (the system roots when absent).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub visibility: VisibilitySpec,
    #[serde(default = "defaults::poll_interval_ms")]
    pub poll_interval_ms: u64,
    #[serde(default = "defaults::stale_after_seconds")]
    pub stale_after_seconds: u64,
    #[serde(default = "defaults::withdraw_after_seconds")]
    pub withdraw_after_seconds: u64,
    #[serde(default)]
    pub on_withdraw: OnWithdrawSpec,
    #[serde(default = "defaults::max_instances")]
    pub max_instances: u64,
    #[serde(default)]
    pub apps: AppsSpec,
}

mod defaults {
    pub fn poll_interval_ms() -> u64 {
        1000
    }
    pub fn stale_after_seconds() -> u64 {
        30
    }
    pub fn withdraw_after_seconds() -> u64 {
        90
    }
    pub fn max_instances() -> u64 {
        20_000
    }
}

impl LinkSpec {
    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms)
    }

    pub fn stale_after(&self) -> Duration {
        Duration::from_secs(self.stale_after_seconds)
    }

    pub fn withdraw_after(&self) -> Duration {
        Duration::from_secs(self.withdraw_after_seconds)
    }

    pub fn visibility(&self) -> Visibility {
        match self.visibility {
            VisibilitySpec::Merged => Visibility::Merged,
            VisibilitySpec::Fallback => Visibility::Fallback,
            VisibilitySpec::OnRequest => Visibility::OnRequest,
        }
    }

    pub fn on_withdraw(&self) -> OnWithdraw {
        match self.on_withdraw {
            OnWithdrawSpec::UnlessOnlySource => OnWithdraw::UnlessOnlySource,
            OnWithdrawSpec::Always => OnWithdraw::Always,
            OnWithdrawSpec::Never => OnWithdraw::Never,
        }
    }

    /// The base URLs, each ending in `/`.
    pub fn bases(&self) -> Vec<String> {
        self.urls
            .iter()
            .map(|u| if u.ends_with('/') { u.clone() } else { format!("{u}/") })
            .collect()
    }

    fn check(&mut self) -> Result<(), String> {
        if !is_name(&self.name) {
            return Err("the name must be a DNS label: lower-case letters, digits and '-', at most 63".into());
        }
        if self.urls.is_empty() {
            return Err("`urls` is empty".into());
        }
        for u in &self.urls {
            if !(u.starts_with("http://") || u.starts_with("https://")) || u.contains(char::is_whitespace) {
                return Err(format!("{u:?} is not an http:// or https:// URL"));
            }
        }
        if self.username_file.is_some() != self.password_file.is_some() {
            return Err("`usernameFile` and `passwordFile` go together".into());
        }
        if self.poll_interval_ms == 0 {
            return Err("`pollIntervalMs` must be at least 1".into());
        }
        if self.stale_after_seconds == 0 || self.withdraw_after_seconds < self.stale_after_seconds {
            return Err("`staleAfterSeconds` must be at least 1 and `withdrawAfterSeconds` at least as long".into());
        }
        if self.max_instances == 0 {
            return Err("`maxInstances` must be at least 1".into());
        }
        for list in [&mut self.apps.include, &mut self.apps.exclude] {
            for app in list.iter_mut() {
                *app = app.to_ascii_uppercase();
            }
            list.sort();
            list.dedup();
        }
        Ok(())
    }
}

/// A DNS label: what Kubernetes names and the `?regions=` list accept.
fn is_name(s: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && edge(s.chars().next())
        && edge(s.chars().last())
}

/// Parses and checks a whole file. An empty file (or `[]`) means no links.
pub fn parse(yaml: &str) -> Result<Vec<LinkSpec>, Error> {
    if yaml.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut links: Vec<LinkSpec> = serde_yaml_ng::from_str(yaml).map_err(|e| Error::Parse(e.to_string()))?;
    let mut names = BTreeSet::new();
    for link in &mut links {
        link.check().map_err(|reason| Error::Invalid {
            link: link.name.clone(),
            reason,
        })?;
        if !names.insert(link.name.clone()) {
            return Err(Error::Invalid {
                link: link.name.clone(),
                reason: "two links have this name".into(),
            });
        }
    }
    Ok(links)
}

/// Reads and parses the file.
pub fn read(path: &std::path::Path) -> Result<Vec<LinkSpec>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses_with_its_defaults() {
        let links = parse(
            r#"
- name: us-east-1
  urls: [https://eureka.us-east-1.example/eureka]
  usernameFile: /etc/eureka-links/us-east-1/username
  passwordFile: /etc/eureka-links/us-east-1/password
  caFile: /etc/eureka-links/us-east-1/ca.crt
  visibility: Fallback
  onWithdraw: Never
  apps: {include: [orders], exclude: []}
- name: eu-west-1
  urls: [http://10.0.0.1:8761/eureka/, http://10.0.0.2:8761/eureka/]
"#,
        )
        .unwrap();
        assert_eq!(links.len(), 2);
        let east = &links[0];
        assert_eq!(
            east.bases(),
            vec!["https://eureka.us-east-1.example/eureka/".to_string()]
        );
        assert_eq!(east.visibility(), Visibility::Fallback);
        assert_eq!(east.on_withdraw(), OnWithdraw::Never);
        assert_eq!(east.apps.include, vec!["ORDERS".to_string()]);
        let west = &links[1];
        assert_eq!(
            (
                west.poll_interval_ms,
                west.stale_after_seconds,
                west.withdraw_after_seconds,
                west.max_instances
            ),
            (1000, 30, 90, 20_000)
        );
        assert_eq!(west.visibility(), Visibility::Merged);
        assert_eq!(west.on_withdraw(), OnWithdraw::UnlessOnlySource);
        assert!(parse("").unwrap().is_empty());
        assert!(parse("[]").unwrap().is_empty());
        let on_request = parse("- name: a\n  urls: [http://x/]\n  visibility: OnRequest\n").unwrap();
        assert_eq!(on_request[0].visibility(), Visibility::OnRequest);
    }

    #[test]
    fn a_bad_file_is_a_clear_error() {
        for (yaml, expected) in [
            ("- name: a\n  urls: []\n", "`urls` is empty"),
            ("- name: A_B\n  urls: [http://x/]\n", "DNS label"),
            ("- name: a\n  urls: [ftp://x/]\n", "not an http"),
            ("- name: a\n  urls: [http://x/]\n  usernameFile: /u\n", "go together"),
            (
                "- name: a\n  urls: [http://x/]\n  pollIntervalMs: 0\n",
                "pollIntervalMs",
            ),
            (
                "- name: a\n  urls: [http://x/]\n  staleAfterSeconds: 60\n  withdrawAfterSeconds: 30\n",
                "withdrawAfterSeconds",
            ),
            (
                "- name: a\n  urls: [http://x/]\n- name: a\n  urls: [http://y/]\n",
                "two links",
            ),
            (
                "- name: a\n  urls: [http://x/]\n  visibility: Sometimes\n",
                "unknown variant",
            ),
            ("- name: a\n  url: http://x/\n", "unknown field"),
            ("name: a", "invalid type"),
        ] {
            let e = parse(yaml).unwrap_err().to_string();
            assert!(e.contains(expected), "{yaml:?}: {e}");
            assert!(e.starts_with("failed to "), "{e}");
        }
    }
}
