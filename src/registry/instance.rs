//! The Eureka instance model (`InstanceInfo` and its parts), as registered by clients and peers.
//!
//! Values here are what a registrant sent, normalised the way the Java server normalises them
//! (upper-case app names, defaults for missing fields). Lease timestamps are not part of it: they
//! live in the registry's lease and are attached when an instance is read.

use std::fmt;

/// `InstanceInfo.InstanceStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    Up,
    Down,
    Starting,
    OutOfService,
    Unknown,
}

impl Status {
    pub const ALL: [Status; 5] = [
        Status::Up,
        Status::Down,
        Status::Starting,
        Status::OutOfService,
        Status::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Up => "UP",
            Status::Down => "DOWN",
            Status::Starting => "STARTING",
            Status::OutOfService => "OUT_OF_SERVICE",
            Status::Unknown => "UNKNOWN",
        }
    }

    /// Exact enum name, as Java's `InstanceStatus.valueOf` (case-sensitive).
    pub fn parse_exact(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Java's `InstanceStatus.toEnum`: case-insensitive, anything else is `UNKNOWN`.
    pub fn parse_lenient(s: &str) -> Status {
        Status::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s.trim()))
            .unwrap_or(Status::Unknown)
    }

    /// Index into per-status counters, ordered by name (`DOWN` < `OUT_OF_SERVICE` < `STARTING` <
    /// `UNKNOWN` < `UP`), which is the order of the reconcile hash code.
    pub fn name_rank(self) -> usize {
        match self {
            Status::Down => 0,
            Status::OutOfService => 1,
            Status::Starting => 2,
            Status::Unknown => 3,
            Status::Up => 4,
        }
    }

    pub const BY_NAME: [Status; 5] = [
        Status::Down,
        Status::OutOfService,
        Status::Starting,
        Status::Unknown,
        Status::Up,
    ];
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `InstanceInfo.ActionType`: how a delta entry changed the registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionType {
    Added,
    Modified,
    Deleted,
}

impl ActionType {
    pub fn as_str(self) -> &'static str {
        match self {
            ActionType::Added => "ADDED",
            ActionType::Modified => "MODIFIED",
            ActionType::Deleted => "DELETED",
        }
    }

    pub fn parse_exact(s: &str) -> Option<ActionType> {
        [ActionType::Added, ActionType::Modified, ActionType::Deleted]
            .into_iter()
            .find(|a| a.as_str() == s)
    }
}

/// `port` / `securePort`: a number and whether it is enabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    pub port: i32,
    pub enabled: bool,
}

/// `DataCenterInfo.Name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataCenterName {
    Netflix,
    Amazon,
    MyOwn,
}

impl DataCenterName {
    pub fn as_str(self) -> &'static str {
        match self {
            DataCenterName::Netflix => "Netflix",
            DataCenterName::Amazon => "Amazon",
            DataCenterName::MyOwn => "MyOwn",
        }
    }

    pub fn parse_exact(s: &str) -> Option<DataCenterName> {
        [DataCenterName::Netflix, DataCenterName::Amazon, DataCenterName::MyOwn]
            .into_iter()
            .find(|n| n.as_str() == s)
    }
}

/// The Java class marker written for non-Amazon data centers (a class that does not exist; readers
/// map it to `MyDataCenterInfo`).
pub const DEFAULT_DATA_CENTER_CLASS: &str = "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo";
pub const AMAZON_DATA_CENTER_CLASS: &str = "com.netflix.appinfo.AmazonInfo";

/// `dataCenterInfo`: `MyOwn`/`Netflix`, or `Amazon` with its metadata map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataCenterInfo {
    pub name: DataCenterName,
    /// Only for `Amazon`: `instance-id`, `availability-zone`, ...
    pub metadata: Metadata,
}

impl DataCenterInfo {
    pub fn my_own() -> DataCenterInfo {
        DataCenterInfo {
            name: DataCenterName::MyOwn,
            metadata: Metadata::default(),
        }
    }

    pub fn class(&self) -> &'static str {
        match self.name {
            DataCenterName::Amazon => AMAZON_DATA_CENTER_CLASS,
            _ => DEFAULT_DATA_CENTER_CLASS,
        }
    }
}

/// The lease terms a registrant asked for (`leaseInfo.renewalIntervalInSecs/durationInSecs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTerms {
    pub renewal_interval_secs: i32,
    pub duration_secs: i32,
}

impl LeaseTerms {
    pub const DEFAULT_RENEWAL_INTERVAL_SECS: i32 = 30;
    pub const DEFAULT_DURATION_SECS: i32 = 90;

    /// What Java's `LeaseInfo.Builder` makes of absent or non-positive values.
    pub fn normalised(self) -> LeaseTerms {
        LeaseTerms {
            renewal_interval_secs: if self.renewal_interval_secs <= 0 {
                Self::DEFAULT_RENEWAL_INTERVAL_SECS
            } else {
                self.renewal_interval_secs
            },
            duration_secs: if self.duration_secs <= 0 {
                Self::DEFAULT_DURATION_SECS
            } else {
                self.duration_secs
            },
        }
    }
}

impl Default for LeaseTerms {
    fn default() -> Self {
        LeaseTerms {
            renewal_interval_secs: Self::DEFAULT_RENEWAL_INTERVAL_SECS,
            duration_secs: Self::DEFAULT_DURATION_SECS,
        }
    }
}

/// An ordered string map with unique keys (instance metadata keeps the order it was sent in).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metadata(Vec<(String, String)>);

impl Metadata {
    pub fn new() -> Metadata {
        Metadata(Vec::new())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Sets `key`, replacing an existing value in place.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) {
        let key = key.into();
        let value = value.into();
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key, value)),
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<String> {
        let pos = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(pos).1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// Later values of a repeated key replace earlier ones in place; linear in the number of pairs
/// (a decoded registration may carry many keys).
impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Metadata {
    fn from_iter<T: IntoIterator<Item = (K, V)>>(iter: T) -> Self {
        let mut pairs: Vec<(String, String)> = Vec::new();
        let mut position: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        for (k, v) in iter {
            let (k, v) = (k.into(), v.into());
            match position.get(&k) {
                Some(&i) => pairs[i].1 = v,
                None => {
                    position.insert(k.clone(), pairs.len());
                    pairs.push((k, v));
                }
            }
        }
        Metadata(pairs)
    }
}

/// `InstanceInfo`: one registered instance, as the registrant described it.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceInfo {
    pub instance_id: Option<String>,
    pub host_name: String,
    /// Upper-case application name.
    pub app: String,
    pub ip_addr: String,
    pub sid: String,
    pub status: Status,
    pub overridden_status: Status,
    pub port: PortInfo,
    pub secure_port: PortInfo,
    pub country_id: i32,
    pub data_center_info: DataCenterInfo,
    pub lease: LeaseTerms,
    pub metadata: Metadata,
    pub app_group_name: Option<String>,
    pub home_page_url: Option<String>,
    pub status_page_url: Option<String>,
    pub health_check_url: Option<String>,
    pub secure_health_check_url: Option<String>,
    pub vip_address: Option<String>,
    pub secure_vip_address: Option<String>,
    pub last_updated_timestamp: i64,
    pub last_dirty_timestamp: i64,
    pub action_type: Option<ActionType>,
    pub asg_name: Option<String>,
}

impl InstanceInfo {
    /// An instance with Java's `InstanceInfo()` defaults and the given identity; `now` becomes its
    /// dirty and updated timestamps, as when Java decodes a registration without them.
    pub fn new(app: &str, host_name: &str, ip_addr: &str, now: i64) -> InstanceInfo {
        InstanceInfo {
            instance_id: None,
            host_name: host_name.to_string(),
            app: app.to_ascii_uppercase(),
            ip_addr: ip_addr.to_string(),
            sid: "na".to_string(),
            status: Status::Up,
            overridden_status: Status::Unknown,
            port: PortInfo {
                port: 7001,
                enabled: true,
            },
            secure_port: PortInfo {
                port: 7002,
                enabled: false,
            },
            country_id: 1,
            data_center_info: DataCenterInfo::my_own(),
            lease: LeaseTerms::default(),
            metadata: Metadata::new(),
            app_group_name: None,
            home_page_url: None,
            status_page_url: None,
            health_check_url: None,
            secure_health_check_url: None,
            vip_address: None,
            secure_vip_address: None,
            last_updated_timestamp: now,
            last_dirty_timestamp: now,
            action_type: None,
            asg_name: None,
        }
    }

    /// The registry key: `instanceId` if set, else the Amazon `instance-id`, else `hostName`
    /// (Java `InstanceInfo.getId`).
    pub fn id(&self) -> &str {
        if let Some(id) = self.instance_id.as_deref().filter(|s| !s.is_empty()) {
            return id;
        }
        if self.data_center_info.name == DataCenterName::Amazon
            && let Some(id) = self
                .data_center_info
                .metadata
                .get("instance-id")
                .filter(|s| !s.is_empty())
        {
            return id;
        }
        &self.host_name
    }

    /// Whether `vip` is one of this instance's comma-separated VIP addresses (exact match, as Java).
    pub fn has_vip(&self, vip: &str, secure: bool) -> bool {
        let list = if secure {
            &self.secure_vip_address
        } else {
            &self.vip_address
        };
        list.as_deref().is_some_and(|l| l.split(',').any(|v| v == vip))
    }

    /// Whether two registrations describe the same instance, ignoring the timestamps and the
    /// action type that the registry itself maintains.
    pub fn same_description(&self, other: &InstanceInfo) -> bool {
        let strip = |i: &InstanceInfo| InstanceInfo {
            last_updated_timestamp: 0,
            last_dirty_timestamp: 0,
            action_type: None,
            ..i.clone()
        };
        strip(self) == strip(other)
    }
}
