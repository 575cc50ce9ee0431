//! Fuzzing entry points: each feeds arbitrary bytes to one decoder and checks what must hold for
//! any input. Nothing panics; a body decodes the same from memory as from a stream read a few
//! bytes at a time; what decodes, encoded again, decodes to the same instance (in JSON always, in
//! XML when its text is text XML 1.0 can carry) and every XML document written is accepted by our
//! own reader; query parsing keeps the first value of a repeated key; the body reader never passes
//! its limit and converts ISO-8859-1 to valid UTF-8.
//!
//! Used by the cargo-fuzz targets in `fuzz/fuzz_targets/` and, on stable Rust, by the corpus replay
//! in `tests/it/fuzz_replay.rs`.

use std::{
    io::{BufReader, Read},
    sync::Arc,
};

use eureka_operator::{
    api::{negotiate, route},
    codec::{self, Format, Input, batch, json},
    registry::{
        instance::{CompactString, InstanceInfo, Metadata},
        limits::InstanceLimits,
        view::{InstanceView, LeaseView, Origin},
    },
};

/// Small caps, so the fuzzer reaches them.
const LIMITS: InstanceLimits = InstanceLimits {
    max_metadata_keys: 64,
    max_bytes: 16 * 1024,
};

/// A reader that hands out at most `n` bytes per read, the hard case for a streaming decoder.
struct Trickle<'a>(&'a [u8], usize);

impl Read for Trickle<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.len().min(out.len()).min(self.1);
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

fn view(info: &InstanceInfo) -> InstanceView {
    InstanceView {
        info: Arc::new(info.clone()),
        lease: LeaseView {
            renewal_interval_secs: info.lease.renewal_interval_secs,
            duration_secs: info.lease.duration_secs,
            registration_ts: 1,
            last_renewal_ts: 2,
            eviction_ts: 0,
            service_up_ts: 3,
        },
        origin: Origin::Native,
    }
}

/// Every string of an instance, to check whether XML can carry them.
fn strings(i: &InstanceInfo) -> Vec<&str> {
    let mut v = vec![i.host_name.as_str(), &i.app, &i.ip_addr, i.sid()];
    v.extend(
        [
            &i.instance_id,
            &i.home_page_url,
            &i.status_page_url,
            &i.health_check_url,
            &i.vip_address,
            &i.secure_vip_address,
        ]
        .into_iter()
        .flatten()
        .map(CompactString::as_str),
    );
    v.extend(
        [i.app_group_name(), i.secure_health_check_url(), i.asg_name()]
            .into_iter()
            .flatten(),
    );
    for m in [&i.metadata, &i.data_center_info.metadata] {
        for (k, val) in m.iter() {
            v.push(k);
            v.push(val);
        }
    }
    v
}

fn xml_can_carry(s: &str) -> bool {
    s.chars().all(|c| {
        matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
    })
}

/// What decoding an encoding of `info` gives back in `format`. Read without caps: the caps
/// judge what a client sends, and text XML cannot carry is written as U+FFFD (three bytes where
/// a control character was one), so an instance just under the byte cap can come back over it.
fn reencoded(info: &InstanceInfo, format: Format) -> InstanceInfo {
    let body = codec::encode_instance(&view(info), format);
    match codec::decode_registration_from(Input::Bytes(&body), Some(format), 0, InstanceLimits::UNLIMITED) {
        Ok(r) => r.info,
        Err(e) => panic!(
            "our own {format:?} does not decode ({e}): {}",
            String::from_utf8_lossy(&body)
        ),
    }
}

/// The instance as its encodings carry it: `sid` "unknown" is not written (Java's default) and
/// reads back as "na".
fn as_written(info: &InstanceInfo) -> InstanceInfo {
    let mut i = info.clone();
    if i.sid() == "unknown" {
        i.set_sid("na");
    }
    i
}

fn registration(data: &[u8], format: Option<Format>) {
    let from_bytes = codec::decode_registration_from(Input::Bytes(data), format, 0, LIMITS);
    let mut stream = BufReader::with_capacity(3, Trickle(data, 5));
    let from_stream = codec::decode_registration_from(Input::Stream(&mut stream), format, 0, LIMITS);
    match (&from_bytes, &from_stream) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "memory and stream disagree"),
        (Err(_), Err(_)) => {}
        _ => panic!("memory and stream disagree: {from_bytes:?} / {from_stream:?}"),
    }
    let Ok(reg) = from_bytes else { return };
    let info = as_written(&reg.info);
    // Jackson's type marker is skipped when read, so a metadata key "@class" (possible only
    // from XML) does not survive JSON.
    if !info.metadata.contains_key("@class") && !info.data_center_info.metadata.contains_key("@class") {
        assert_eq!(
            reencoded(&info, Format::Json),
            info,
            "JSON does not decode what it encodes"
        );
    }
    let xml = reencoded(&info, Format::Xml);
    if strings(&info).into_iter().all(xml_can_carry) {
        assert_eq!(xml, info, "XML does not decode what it encodes");
    } else {
        assert_eq!(xml.metadata.len(), info.metadata.len());
    }
}

/// A registration in JSON.
pub fn json(data: &[u8]) {
    registration(data, Some(Format::Json));
    // A peer's full registry and a batch response share the instance reader.
    let _ = json::applications_from_slice(data, 0);
}

/// A registration in XML (and with its format sniffed).
pub fn xml(data: &[u8]) {
    registration(data, Some(Format::Xml));
    registration(data, None);
}

/// A replication batch, and a peer's answer to one.
pub fn batch(data: &[u8]) {
    let from_bytes = batch::decode_list_from(Input::Bytes(data), 0, LIMITS);
    let mut stream = BufReader::with_capacity(3, Trickle(data, 7));
    let from_stream = batch::decode_list_from(Input::Stream(&mut stream), 0, LIMITS);
    match (&from_bytes, &from_stream) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "memory and stream disagree"),
        (Err(_), Err(_)) => {}
        _ => panic!("memory and stream disagree: {from_bytes:?} / {from_stream:?}"),
    }
    if let Ok(items) = from_bytes {
        for item in items {
            assert!(item.instance.is_none() || item.over_limit.is_none());
            if let Some(i) = &item.instance {
                assert!(LIMITS.check(i).is_ok(), "an instance over the caps was kept");
            }
        }
    }
    let _ = batch::decode_response(data, 0);
}

/// A request line and headers: `path \n query \n accept \n content-type \n content-encoding \n
/// accept-encoding`. The path is read past: axum's router (matchit) parses it, not our code.
pub fn query_headers(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\n');
    let mut next = || parts.next().unwrap_or("");
    let (_path, query) = (next(), next());
    let params = route::query(Some(query));
    // The metadata PUT: the first value of a repeated key wins, as in Java.
    let mut entries = Metadata::new();
    for (k, v) in params.pairs() {
        entries.insert_first(k.to_string(), v.to_string());
    }
    for (k, _) in params.pairs() {
        assert_eq!(
            entries.get(&k),
            params.get(&k).as_deref(),
            "not the first value of {k:?}"
        );
    }
    assert!(entries.len() <= params.pairs().count());
    // The hand-written splitter against the standard library's: each pair `split` finds, read
    // alone, is the pair read in place.
    let alone = |k: &str, v: &str| {
        let pair = format!("{k}={v}");
        let (k, v) = route::query(Some(&pair)).pairs().next().expect("one pair");
        (k.into_owned(), v.into_owned())
    };
    let expected: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .map(|(k, v)| alone(k, v))
        .collect();
    let read: Vec<(String, String)> = params.pairs().map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
    assert_eq!(read, expected, "{query:?}");
    let mut headers = axum::http::HeaderMap::new();
    for name in ["accept", "content-type", "content-encoding", "accept-encoding"] {
        if let Ok(v) = axum::http::HeaderValue::from_str(next()) {
            headers.insert(name, v);
        }
    }
    let _ = negotiate::reply_format(&headers);
    let _ = negotiate::declared_format(&headers);
    let _ = negotiate::accepts_gzip(&headers);
    let _ = negotiate::json_request(&headers);
}

/// A request body as the server reads it: the first byte picks gzip and ISO-8859-1, the rest is
/// the body; it is read whole, then decoded as a registration.
pub fn body(data: &[u8]) {
    let Some((&flags, raw)) = data.split_first() else {
        return;
    };
    let (gzip, latin1) = (flags & 1 == 1, flags & 2 == 2);
    const LIMIT: usize = 64 * 1024;
    let read = negotiate::decode_bytes(raw, gzip, latin1, LIMIT, true, |input| {
        let mut out = Vec::new();
        match input {
            Input::Bytes(b) => out.extend_from_slice(b),
            Input::Stream(r) => {
                r.read_to_end(&mut out)
                    .map_err(|e| negotiate::ApiError::Invalid(e.to_string()))?;
            }
        }
        Ok(out)
    });
    // Every form (plain, gzip, ISO-8859-1, both) stays within the limit, or is refused as too
    // large; a plain body is refused only for its size.
    match &read {
        Ok(out) => {
            if latin1 {
                assert!(
                    std::str::from_utf8(out).is_ok(),
                    "ISO-8859-1 converted to invalid UTF-8"
                );
                let chars = std::str::from_utf8(out).map(|s| s.chars().count()).unwrap_or(0);
                assert!(chars <= LIMIT, "read past the limit");
            } else {
                assert!(out.len() <= LIMIT, "read or inflated past the limit");
            }
            if !gzip && !latin1 {
                assert_eq!(out.as_slice(), raw);
            }
        }
        Err(negotiate::ApiError::TooLarge(limit)) => assert_eq!(*limit, LIMIT),
        Err(e) => assert!(gzip, "a plain body refused for another reason than its size: {e}"),
    }
    let _ = negotiate::decode_bytes(raw, gzip, latin1, LIMIT, true, |input| {
        codec::decode_registration_from(input, None, 0, LIMITS).map_err(|e| negotiate::ApiError::Invalid(e.to_string()))
    });
}
