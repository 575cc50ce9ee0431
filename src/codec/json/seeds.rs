//! The serde pieces every JSON reader here shares (the instance reader and the replication
//! batch's): [`Scalar`], a value reduced to what Java's lenient getters read, the seeds that read
//! one, borrowed map keys, and the macro that fills a visitor's scalar visits.

use super::*;

/// A semantic decode failure, carried as a value (see the module docs).
pub(super) type Checked<T> = Result<T, String>;

/// Any JSON value, reduced to what Java's lenient getters read; objects and arrays are skipped
/// without being built.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Scalar {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Compound,
}

impl Scalar {
    /// Java's `getValueAsLong`: numbers, numeric strings; anything else is 0.
    pub(super) fn as_i64(&self) -> i64 {
        match self {
            Scalar::Int(i) => *i,
            Scalar::UInt(u) => i64::try_from(*u).unwrap_or(*u as f64 as i64),
            Scalar::Float(f) => *f as i64,
            Scalar::Str(s) => s.trim().parse::<i64>().unwrap_or(0),
            Scalar::Bool(b) => i64::from(*b),
            Scalar::Null | Scalar::Compound => 0,
        }
    }

    pub(super) fn as_i32(&self) -> i32 {
        self.as_i64().clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
    }

    /// Java's `getValueAsBoolean`: true, "true" (any case), or a non-zero integer.
    pub(super) fn as_bool(&self) -> bool {
        match self {
            Scalar::Bool(b) => *b,
            Scalar::Str(s) => s.trim().eq_ignore_ascii_case("true"),
            Scalar::Int(i) => *i != 0,
            Scalar::UInt(u) => i64::try_from(*u).is_ok_and(|i| i != 0),
            _ => false,
        }
    }

    /// A scalar as text (metadata values: numbers become their text, `null` becomes "null").
    pub(super) fn into_text(self) -> Option<String> {
        match self {
            Scalar::Str(s) => Some(s),
            Scalar::Int(i) => Some(i.to_string()),
            Scalar::UInt(u) => Some(u.to_string()),
            Scalar::Float(f) => serde_json::Number::from_f64(f).map(|n| n.to_string()),
            Scalar::Bool(b) => Some(b.to_string()),
            Scalar::Null => Some("null".to_string()),
            Scalar::Compound => None,
        }
    }

    /// An optional text field: `null` is absent, objects and arrays read as absent.
    pub(crate) fn into_opt_string(self) -> Option<String> {
        match self {
            Scalar::Null => None,
            other => other.into_text(),
        }
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Scalar::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(super) fn is_null(&self) -> bool {
        *self == Scalar::Null
    }
}

pub(super) fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

pub(super) fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Implements the scalar visits of a visitor whose value for a scalar is `$scalar(self, scalar)`
/// (objects and arrays are the visitor's own business).
macro_rules! scalar_visits {
    ($scalar:expr) => {
        fn visit_bool<E: ::serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::Bool(v)))
        }
        fn visit_i64<E: ::serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::Int(v)))
        }
        fn visit_u64<E: ::serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::UInt(v)))
        }
        fn visit_f64<E: ::serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::Float(v)))
        }
        fn visit_str<E: ::serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::Str(v.to_string())))
        }
        fn visit_string<E: ::serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::Str(v)))
        }
        fn visit_unit<E: ::serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::Null))
        }
        fn visit_none<E: ::serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($scalar(self, $crate::codec::json::Scalar::Null))
        }
    };
}
pub(crate) use scalar_visits;

/// `null` (as `None`), or what the seed reads.
pub(crate) struct NullOr<S>(pub S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for NullOr<S> {
    type Value = Option<S::Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for NullOr<S> {
    type Value = Option<S::Value>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value or null")
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(d).map(Some)
    }
}

/// Reads any value as a [`Scalar`].
pub(crate) struct ScalarSeed;

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = Scalar;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Scalar, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ScalarSeed {
    type Value = Scalar;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    scalar_visits!(|_, s| s);
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Scalar, A::Error> {
        drain_map(map)?;
        Ok(Scalar::Compound)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Scalar, A::Error> {
        drain_seq(seq)?;
        Ok(Scalar::Compound)
    }
}

/// A field that must be an object: its visitor reads the object; `null` is `None`; any other
/// value is the error `what`.
macro_rules! object_seed {
    ($seed:ty, $value:ty, $what:expr) => {
        impl<'de> DeserializeSeed<'de> for $seed {
            type Value = Option<Checked<$value>>;
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(self)
            }
        }

        impl<'de> Visitor<'de> for $seed {
            type Value = Option<Checked<$value>>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str($what)
            }
            scalar_visits!(|_, s: Scalar| if s.is_null() {
                None
            } else {
                Some(Err($what.to_string()))
            });
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                drain_seq(seq)?;
                Ok(Some(Err($what.to_string())))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                self.read(map).map(Some)
            }
        }
    };
}
pub(super) use object_seed;

/// A map key, borrowed when the parser can lend it.
pub(crate) struct FieldName<'a>(pub &'a str);

impl<'de: 'a, 'a> de::Deserialize<'de> for FieldName<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

/// Keys the reader cares about are all short ASCII; anything else (or a key the parser had to
/// unescape) reads as one that matches no field.
pub(super) struct KeyVisitor;

pub(super) const FIELDS: &[&str] = &[
    "$",
    "@enabled",
    "@class",
    "name",
    "metadata",
    "renewalIntervalInSecs",
    "durationInSecs",
    "instanceId",
    "hostName",
    "app",
    "ipAddr",
    "sid",
    "status",
    "overriddenStatus",
    "overriddenstatus",
    "port",
    "securePort",
    "countryId",
    "dataCenterInfo",
    "leaseInfo",
    "appGroupName",
    "homePageUrl",
    "statusPageUrl",
    "healthCheckUrl",
    "secureHealthCheckUrl",
    "vipAddress",
    "secureVipAddress",
    "lastUpdatedTimestamp",
    "lastDirtyTimestamp",
    "actionType",
    "asgName",
    "instance",
    "applications",
    "application",
    "replicationList",
    "responseList",
    "statusCode",
    "responseEntity",
    "action",
    "appName",
    "id",
    "instanceInfo",
    "eviction",
];

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = FieldName<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<FieldName<'de>, E> {
        Ok(FieldName(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<FieldName<'de>, E> {
        Ok(FieldName(FIELDS.iter().find(|f| **f == v).copied().unwrap_or("")))
    }
}
