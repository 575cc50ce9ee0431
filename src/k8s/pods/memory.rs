//! The memory tricks of pod projections: one shared copy of each repeated string ([`Interner`],
//! pruned as churn doubles it), uids stored as 16 bytes, and labels as one key-sorted allocation.

use super::*;

/// Text that pod projections share (see [`Interner`]).
pub type Text = Arc<str>;

/// The interner never prunes below this many strings.
pub(super) const PRUNE_FLOOR: usize = 4096;

/// One shared copy of each string the pod projections repeat. Strings no projection holds any
/// more are dropped when the set has doubled since the last pruning, so churn (new
/// `pod-template-hash` values at every rollout) costs amortized constant time and no leak.
#[derive(Debug, Default)]
pub struct Interner {
    set: HashSet<Text>,
    prune_at: usize,
}

impl Interner {
    /// The shared copy of `s`.
    pub fn text(&mut self, s: &str) -> Text {
        if let Some(t) = self.set.get(s) {
            return t.clone();
        }
        if self.set.len() >= self.prune_at.max(PRUNE_FLOOR) {
            self.prune();
        }
        let t: Text = Arc::from(s);
        self.set.insert(t.clone());
        t
    }

    /// Drops the strings only the interner holds.
    pub fn prune(&mut self) {
        self.set.retain(|t| Arc::strong_count(t) > 1);
        self.prune_at = self.set.len().saturating_mul(2);
    }

    /// How many strings it holds.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// A pod's `metadata.uid`: a UUID in its canonical lowercase form is kept as its 16 bytes (the
/// apiserver makes every uid so); anything else is kept as sent. Shown as sent either way.
#[derive(Clone, PartialEq, Eq)]
pub enum Uid {
    Uuid([u8; 16]),
    Other(Box<str>),
}

impl Uid {
    /// Hyphens sit after these many hex digits: 8-4-4-4-12.
    const GROUPS: [usize; 5] = [8, 4, 4, 4, 12];

    fn parse_uuid(s: &str) -> Option<[u8; 16]> {
        let mut out = [0u8; 16];
        let mut digits = 0;
        let mut groups = s.split('-');
        for len in Self::GROUPS {
            let group = groups.next()?;
            if group.len() != len {
                return None;
            }
            for c in group.bytes() {
                let nibble = match c {
                    b'0'..=b'9' => c - b'0',
                    b'a'..=b'f' => c - b'a' + 10,
                    _ => return None,
                };
                out[digits / 2] |= nibble << (if digits % 2 == 0 { 4 } else { 0 });
                digits += 1;
            }
        }
        groups.next().is_none().then_some(out)
    }
}

impl Default for Uid {
    fn default() -> Self {
        Uid::Other(Box::default())
    }
}

impl From<&str> for Uid {
    fn from(s: &str) -> Uid {
        match Uid::parse_uuid(s) {
            Some(bytes) => Uid::Uuid(bytes),
            None => Uid::Other(s.into()),
        }
    }
}

impl std::fmt::Display for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Uid::Other(s) => f.write_str(s),
            Uid::Uuid(bytes) => {
                let mut digits = bytes.iter().flat_map(|b| [b >> 4, b & 0xf]);
                for (i, len) in Uid::GROUPS.into_iter().enumerate() {
                    if i > 0 {
                        f.write_str("-")?;
                    }
                    for d in digits.by_ref().take(len) {
                        write!(f, "{d:x}")?;
                    }
                }
                Ok(())
            }
        }
    }
}

impl std::fmt::Debug for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

/// A pod's labels (or the annotations kept): pairs sorted by key, in one allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(Box<[(Text, Text)]>);

impl Labels {
    /// Shared copies of `pairs`, which are sorted by key with no key twice (a `BTreeMap`'s).
    pub(super) fn interned<'a>(
        pairs: impl Iterator<Item = (&'a String, &'a String)>,
        interner: &mut Interner,
    ) -> Labels {
        Labels(pairs.map(|(k, v)| (interner.text(k), interner.text(v))).collect())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sets `key` (test fixtures; the watch builds labels whole).
    #[cfg(test)]
    pub fn insert(&mut self, key: &str, value: &str) {
        let mut pairs = self.0.to_vec();
        match pairs.binary_search_by(|(k, _)| (**k).cmp(key)) {
            Ok(i) => pairs[i].1 = value.into(),
            Err(i) => pairs.insert(i, (key.into(), value.into())),
        }
        self.0 = pairs.into();
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Labels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Labels {
        let sorted: BTreeMap<String, String> = iter
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_string(), v.as_ref().to_string()))
            .collect();
        Labels(sorted.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
    }
}
