//! The Eureka instance model (`InstanceInfo` and its parts), as registered by clients and peers.
//!
//! Values here are what a registrant sent, normalised the way the Java server normalises them
//! (upper-case app names, defaults for missing fields). Lease timestamps are not part of it: they
//! live in the registry's lease and are attached when an instance is read.
//!
//! Its strings are `CompactString`s: ids, addresses, VIPs and most metadata values are short
//! (at most 24 bytes) and are kept inside the struct, not in an allocation each, which is most of
//! what a stored pod instance used to cost beyond its struct.

use std::{fmt, hash::BuildHasher};

pub use compact_str::CompactString;

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
    /// The port number (`$` in JSON, the element text in XML).
    pub port: i32,
    /// `@enabled`: whether clients may use it (Java writes `"true"`/`"false"` as strings).
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
    /// How often the registrant promises to renew (`renewalIntervalInSecs`, 30 by default);
    /// self-preservation's expected renewals are computed from it.
    pub renewal_interval_secs: i32,
    /// How long without a renewal before the lease expires (`durationInSecs`, 90 by default).
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
///
/// Lookups and inserts are O(1): past a few entries, positions are indexed by a hash of the key
/// (SipHash with a per-map random key, so chosen keys cannot collide on purpose). The byte size of
/// keys and values is kept as entries change, so size caps cost nothing to check.
///
/// Memory: a key given as a `&'static str` (the operator's own keys) is not copied, values are
/// kept at their exact length, and [`Metadata::shrink_to_fit`] drops spare capacity once an
/// instance is stored.
#[derive(Clone, Default)]
pub struct Metadata {
    /// The entries in the order they were first inserted.
    pairs: Vec<(MetaKey, CompactString)>,
    /// Key hash → position in `pairs`; built once the map passes a few entries.
    index: Option<Box<Index>>,
    /// Total bytes of every key and value, for the per-instance size cap.
    bytes: usize,
}

/// A metadata key: borrowed when it is a constant, else owned.
pub type MetaKey = std::borrow::Cow<'static, str>;

/// Positions in `pairs` by key hash.
#[derive(Clone)]
struct Index {
    hasher: std::hash::RandomState,
    table: hashbrown::HashTable<usize>,
}

impl Index {
    fn build(pairs: &[(MetaKey, CompactString)]) -> Box<Index> {
        let hasher = std::hash::RandomState::new();
        let mut table = hashbrown::HashTable::with_capacity(pairs.len() * 2);
        for (i, (k, _)) in pairs.iter().enumerate() {
            table.insert_unique(hasher.hash_one(k.as_ref()), i, |&j| {
                hasher.hash_one(pairs[j].0.as_ref())
            });
        }
        Box::new(Index { hasher, table })
    }
}

impl Metadata {
    /// Up to this many entries a linear scan is as fast as hashing.
    const LINEAR: usize = 8;

    pub fn new() -> Metadata {
        Metadata::default()
    }

    fn position(&self, key: &str) -> Option<usize> {
        match &self.index {
            Some(index) => index
                .table
                .find(index.hasher.hash_one(key), |&i| self.pairs[i].0 == key)
                .copied(),
            None => self.pairs.iter().position(|(k, _)| k == key),
        }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.position(key).map(|i| &*self.pairs[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_some()
    }

    fn push(&mut self, key: MetaKey, value: CompactString) {
        self.bytes += key.len() + value.len();
        let i = self.pairs.len();
        self.pairs.push((key, value));
        let Metadata { pairs, index, .. } = self;
        match index {
            Some(index) => {
                let Index { hasher, table } = &mut **index;
                table.insert_unique(hasher.hash_one(pairs[i].0.as_ref()), i, |&j| {
                    hasher.hash_one(pairs[j].0.as_ref())
                });
            }
            None if pairs.len() > Self::LINEAR => *index = Some(Index::build(pairs)),
            None => {}
        }
    }

    /// Sets `key`, replacing an existing value in place (the last value wins).
    pub fn insert(&mut self, key: impl Into<MetaKey>, value: impl Into<CompactString>) {
        let key = key.into();
        let mut value = value.into();
        value.shrink_to_fit();
        match self.position(&key) {
            Some(i) => {
                let slot = &mut self.pairs[i].1;
                self.bytes = self.bytes - slot.len() + value.len();
                *slot = value;
            }
            None => self.push(key, value),
        }
    }

    /// Sets `key` unless it is already there (the first value wins); whether it was set.
    pub fn insert_first(&mut self, key: impl Into<MetaKey>, value: impl Into<CompactString>) -> bool {
        let key = key.into();
        if self.position(&key).is_some() {
            return false;
        }
        let mut value = value.into();
        value.shrink_to_fit();
        self.push(key, value);
        true
    }

    /// Removes `key`, keeping the order of the others (linear: removals are rare).
    pub fn remove(&mut self, key: &str) -> Option<String> {
        let pos = self.position(key)?;
        let (k, v) = self.pairs.remove(pos);
        self.bytes -= k.len() + v.len();
        self.index = (self.pairs.len() > Self::LINEAR).then(|| Index::build(&self.pairs));
        Some(v.into_string())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(k, v)| (k.as_ref(), &**v))
    }

    /// Sets every entry of `other` here (its values win), in its order.
    pub fn merge(&mut self, other: &Metadata) {
        for (k, v) in &other.pairs {
            self.insert(k.clone(), v.clone());
        }
    }

    /// Drops the spare capacity of the entries' list (called when an instance is stored).
    pub fn shrink_to_fit(&mut self) {
        self.pairs.shrink_to_fit();
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Bytes of all keys and values.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Equal when the same pairs are in the same order.
impl PartialEq for Metadata {
    fn eq(&self, other: &Self) -> bool {
        self.pairs == other.pairs
    }
}

impl Eq for Metadata {}

impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Later values of a repeated key replace earlier ones in place.
impl<K: Into<MetaKey>, V: Into<CompactString>> FromIterator<(K, V)> for Metadata {
    fn from_iter<T: IntoIterator<Item = (K, V)>>(iter: T) -> Self {
        let mut m = Metadata::new();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

/// `InstanceInfo`: one registered instance, as the registrant described it.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceInfo {
    /// `instanceId`: the key of the instance within its application; when absent, the host
    /// name is the key (Java's `getId()`).
    pub instance_id: Option<CompactString>,
    /// `hostName`: what clients connect to unless they prefer the IP address.
    pub host_name: CompactString,
    /// Upper-case application name.
    pub app: CompactString,
    /// `ipAddr`.
    pub ip_addr: CompactString,
    /// The status as the registry shows it, after the override rules.
    pub status: Status,
    /// The status an operator forced through `PUT .../status` (`UNKNOWN`: no override).
    pub overridden_status: Status,
    /// The plain port.
    pub port: PortInfo,
    /// The TLS port (disabled by default).
    pub secure_port: PortInfo,
    /// `countryId`, 1 by default; stored and echoed.
    pub country_id: i32,
    /// Where the instance runs (`MyOwn` or `Amazon` with its AWS metadata).
    pub data_center_info: DataCenterInfo,
    /// The lease terms it asked for.
    pub lease: LeaseTerms,
    /// Free-form key/value pairs (zone, management port, pod fields for pod instances).
    pub metadata: Metadata,
    /// `homePageUrl`.
    pub home_page_url: Option<CompactString>,
    /// `statusPageUrl` (the dashboard links it when it is http or https).
    pub status_page_url: Option<CompactString>,
    /// `healthCheckUrl`.
    pub health_check_url: Option<CompactString>,
    /// `vipAddress`: comma-separated VIPs that `GET vips/{vip}` finds it under.
    pub vip_address: Option<CompactString>,
    /// `secureVipAddress`: the same for `GET svips/{vip}`.
    pub secure_vip_address: Option<CompactString>,
    /// When the server last changed this record (ms); heartbeats do not move it.
    pub last_updated_timestamp: i64,
    /// When the registrant last changed it (ms): the version that decides which copy wins
    /// between a registration and a replica's heartbeat or a 409.
    pub last_dirty_timestamp: i64,
    /// `actionType`: how the instance last changed (ADDED, MODIFIED, DELETED), for deltas.
    pub action_type: Option<ActionType>,
    /// `sid`, `appGroupName`, `secureHealthCheckUrl` and `asgName`, when any is set: see
    /// [`Rare`] and the accessors.
    rare: Option<Box<Rare>>,
}

/// The fields few registrants set, kept apart so that an instance without them (nearly every
/// one: Spring's and the other clients send null, pod instances never set them) does not carry
/// their room: 8 bytes in place of 96.
///
/// Never stored empty: the setters drop it when its last field is cleared, so two instances
/// that show the same fields compare equal.
#[derive(Clone, Debug, Default, PartialEq)]
struct Rare {
    /// `sid` other than its default `na`.
    sid: Option<CompactString>,
    app_group_name: Option<CompactString>,
    secure_health_check_url: Option<CompactString>,
    asg_name: Option<CompactString>,
}

impl Rare {
    fn is_empty(&self) -> bool {
        self.sid.is_none()
            && self.app_group_name.is_none()
            && self.secure_health_check_url.is_none()
            && self.asg_name.is_none()
    }

    fn strings(&mut self) -> [&mut Option<CompactString>; 4] {
        [
            &mut self.sid,
            &mut self.app_group_name,
            &mut self.secure_health_check_url,
            &mut self.asg_name,
        ]
    }
}

impl InstanceInfo {
    /// Drops the spare capacity of every string and of the metadata (a `format!`ed URL or a
    /// decoded value may hold more than its length), once, when the instance is stored.
    pub fn shrink_to_fit(&mut self) {
        for s in [&mut self.host_name, &mut self.app, &mut self.ip_addr] {
            s.shrink_to_fit();
        }
        for s in [
            &mut self.instance_id,
            &mut self.home_page_url,
            &mut self.status_page_url,
            &mut self.health_check_url,
            &mut self.vip_address,
            &mut self.secure_vip_address,
        ]
        .into_iter()
        .flatten()
        {
            s.shrink_to_fit();
        }
        if let Some(rare) = &mut self.rare {
            for s in rare.strings().into_iter().flatten() {
                s.shrink_to_fit();
            }
        }
        self.metadata.shrink_to_fit();
        self.data_center_info.metadata.shrink_to_fit();
    }

    /// An instance with Java's `InstanceInfo()` defaults and the given identity; `now` becomes its
    /// dirty and updated timestamps, as when Java decodes a registration without them.
    pub fn new(app: &str, host_name: &str, ip_addr: &str, now: i64) -> InstanceInfo {
        InstanceInfo {
            instance_id: None,
            host_name: host_name.into(),
            app: app.to_ascii_uppercase().into(),
            ip_addr: ip_addr.into(),
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
            home_page_url: None,
            status_page_url: None,
            health_check_url: None,
            vip_address: None,
            secure_vip_address: None,
            last_updated_timestamp: now,
            last_dirty_timestamp: now,
            action_type: None,
            rare: None,
        }
    }

    /// `sid`: Netflix's legacy security id, `na` by default; stored and echoed.
    pub fn sid(&self) -> &str {
        self.rare.as_ref().and_then(|r| r.sid.as_deref()).unwrap_or("na")
    }

    pub fn set_sid(&mut self, sid: impl Into<CompactString>) {
        let sid = sid.into();
        self.set_rare(|r| r.sid = (sid != "na").then_some(sid));
    }

    /// `appGroupName`.
    pub fn app_group_name(&self) -> Option<&str> {
        self.rare.as_ref().and_then(|r| r.app_group_name.as_deref())
    }

    pub fn set_app_group_name(&mut self, name: Option<CompactString>) {
        self.set_rare(|r| r.app_group_name = name);
    }

    /// `secureHealthCheckUrl`.
    pub fn secure_health_check_url(&self) -> Option<&str> {
        self.rare.as_ref().and_then(|r| r.secure_health_check_url.as_deref())
    }

    pub fn set_secure_health_check_url(&mut self, url: Option<CompactString>) {
        self.set_rare(|r| r.secure_health_check_url = url);
    }

    /// `asgName`: the AWS auto-scaling group, stored and echoed.
    pub fn asg_name(&self) -> Option<&str> {
        self.rare.as_ref().and_then(|r| r.asg_name.as_deref())
    }

    pub fn set_asg_name(&mut self, name: Option<CompactString>) {
        self.set_rare(|r| r.asg_name = name);
    }

    /// Changes the rare fields, keeping [`Rare`] only while one of them is set.
    fn set_rare(&mut self, change: impl FnOnce(&mut Rare)) {
        let rare = self.rare.get_or_insert_default();
        change(rare);
        if rare.is_empty() {
            self.rare = None;
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

    /// Bytes of text this instance holds: every string field, metadata keys and values included
    /// (what `--max-instance-bytes` caps).
    pub fn text_bytes(&self) -> usize {
        let opt = |s: &Option<CompactString>| s.as_ref().map_or(0, CompactString::len);
        self.host_name.len()
            + self.app.len()
            + self.ip_addr.len()
            + self.sid().len()
            + self.metadata.bytes()
            + self.data_center_info.metadata.bytes()
            + opt(&self.instance_id)
            + self.app_group_name().map_or(0, str::len)
            + opt(&self.home_page_url)
            + opt(&self.status_page_url)
            + opt(&self.health_check_url)
            + self.secure_health_check_url().map_or(0, str::len)
            + opt(&self.vip_address)
            + opt(&self.secure_vip_address)
            + self.asg_name().map_or(0, str::len)
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

/// Metadata keys every pod instance carries, naming its owner.
pub mod keys {
    pub const CLUSTER: &str = "k8s.cluster";
    /// The cluster's name people read (`--cluster-name`); `CLUSTER` stays the identity.
    pub const CLUSTER_NAME: &str = "k8s.clusterName";
    pub const NAMESPACE: &str = "k8s.namespace";
    pub const EUREKA_APP: &str = "k8s.eurekaApp";
    pub const POD: &str = "k8s.pod";
    pub const OWNER: &str = "k8s.owner";
    /// The value of [`OWNER`].
    pub const OWNER_VALUE: &str = "eureka-operator";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rare_fields_read_back_and_leave_no_trace_once_cleared() {
        let plain = InstanceInfo::new("app", "h", "10.0.0.1", 0);
        let mut i = plain.clone();
        assert_eq!(i.sid(), "na");
        i.set_sid("x1");
        i.set_app_group_name(Some("GROUP".into()));
        i.set_secure_health_check_url(Some("https://h:443/health".into()));
        i.set_asg_name(Some("asg".into()));
        assert_eq!(
            (i.sid(), i.app_group_name(), i.secure_health_check_url(), i.asg_name()),
            ("x1", Some("GROUP"), Some("https://h:443/health"), Some("asg"))
        );
        assert_eq!(i.text_bytes(), plain.text_bytes() - 2 + 2 + 5 + 20 + 3);
        assert_ne!(i, plain);
        // `na` is the default: setting it stores nothing.
        i.set_sid("na");
        i.set_app_group_name(None);
        i.set_secure_health_check_url(None);
        assert_ne!(i, plain);
        i.set_asg_name(None);
        assert_eq!(
            i, plain,
            "an instance whose rare fields are all cleared equals one that never had them"
        );
        assert!(i.rare.is_none());
        // An empty `sid` is a value (JSON's null decodes to it), not the default.
        i.set_sid("");
        assert_eq!(i.sid(), "");
        assert_ne!(i, plain);
    }

    #[test]
    fn metadata_keeps_order_and_indexes_past_a_few_entries() {
        let mut m = Metadata::new();
        for i in 0..100 {
            m.insert(format!("k{i}"), i.to_string());
        }
        m.insert("k3", "three");
        assert_eq!(m.len(), 100);
        assert_eq!(m.get("k3"), Some("three"));
        assert_eq!(m.get("k99"), Some("99"));
        assert_eq!(m.get("nope"), None);
        assert_eq!(m.iter().nth(3), Some(("k3", "three")), "replaced in place");
        assert!(!m.insert_first("k5", "later"), "the first value wins");
        assert_eq!(m.get("k5"), Some("5"));
        assert!(m.insert_first("new", "x"));
        assert_eq!(m.remove("k0"), Some("0".into()));
        assert_eq!(m.get("k1"), Some("1"), "positions follow a removal");
        assert_eq!(m.get("new"), Some("x"));
        let bytes: usize = m.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert_eq!(m.bytes(), bytes);
        let small: Metadata = [("a", "1"), ("b", "2"), ("a", "3")].into_iter().collect();
        assert_eq!(small.iter().collect::<Vec<_>>(), [("a", "3"), ("b", "2")]);
        assert_eq!(small.bytes(), 4);
    }

    #[test]
    fn metadata_equality_is_ordered_and_ignores_the_index() {
        let a: Metadata = (0..20).map(|i| (format!("k{i}"), "v")).collect();
        let b: Metadata = (0..20).map(|i| (format!("k{i}"), "v")).collect();
        let reversed: Metadata = (0..20).rev().map(|i| (format!("k{i}"), "v")).collect();
        assert_eq!(a, b);
        assert_ne!(a, reversed);
        assert_eq!(a.clone(), a);
    }

    #[test]
    fn inserting_many_keys_into_a_large_map_is_fast() {
        // 5k inserts into 100k keys: linear scans would do 5e8 comparisons (seconds); this is
        // milliseconds even unoptimised.
        let mut m: Metadata = (0..100_000).map(|i| (format!("key-{i}"), "v")).collect();
        let started = std::time::Instant::now();
        for i in 0..5_000 {
            m.insert(format!("new-{i}"), "v");
        }
        assert_eq!(m.len(), 105_000);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn text_bytes_counts_every_string() {
        let mut i = InstanceInfo::new("ab", "host", "ip", 0);
        let base = i.text_bytes();
        assert_eq!(base, "AB".len() + "host".len() + "ip".len() + "na".len());
        i.metadata.insert("k", "vv");
        i.home_page_url = Some("12345".into());
        assert_eq!(i.text_bytes(), base + 3 + 5);
    }
}
