//! Property tests: anything we encode decodes to the same instance (JSON for any text; XML for
//! any text XML 1.0 can carry), and every XML document we write is well-formed whatever it holds.

use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::registry::{
    instance::{ActionType, DataCenterInfo, DataCenterName, LeaseTerms, Metadata, PortInfo, Status},
    view::{InstanceView, LeaseView, Origin},
};

/// Characters that stress the codecs, mixed with any character at all.
fn any_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => any::<char>(),
        1 => prop::sample::select(vec!['<', '>', '&', '"', '\'', '_', '$', '.', '-', ':', ' ', '\r', '\n', '\t', '\u{0}', '\u{1}', '\u{FFFE}', '\u{1F600}', 'é']),
        3 => prop::char::range('a', 'z'),
    ]
}

fn text(xml_safe: bool) -> impl Strategy<Value = String> {
    prop::collection::vec(any_char(), 0..10).prop_map(move |chars| {
        chars
            .into_iter()
            .filter(|c| !xml_safe || xml::is_xml_char(*c))
            .collect()
    })
}

fn status() -> impl Strategy<Value = Status> {
    prop::sample::select(Status::ALL.to_vec())
}

/// Metadata keys a client can store and read back: not empty, not `@class` (Jackson's type
/// marker, which readers skip), and not `instanceId` (Spring's codec makes the id from it).
fn metadata(xml_safe: bool) -> impl Strategy<Value = Metadata> {
    prop::collection::vec((text(xml_safe), text(xml_safe)), 0..6).prop_map(|pairs| {
        pairs
            .into_iter()
            .filter(|(k, _)| !k.is_empty() && k != "@class" && k != "instanceId")
            .collect()
    })
}

prop_compose! {
    fn instance(xml_safe: bool)(
        id in prop::option::of(text(xml_safe).prop_filter("an id", |s| !s.is_empty())),
        host in text(xml_safe),
        app in text(xml_safe),
        ip in text(xml_safe),
        sid in text(xml_safe),
        statuses in (status(), status()),
        ports in (any::<i32>(), any::<bool>(), any::<i32>(), any::<bool>()),
        country in any::<i32>(),
        dc in 0..3u8,
        dc_meta in metadata(xml_safe),
        lease in (any::<i32>(), any::<i32>()),
        meta in metadata(xml_safe),
        urls in prop::collection::vec(prop::option::of(text(xml_safe)), 7),
        times in (any::<i64>(), any::<i64>()),
        action in prop::option::of(prop::sample::select(vec![ActionType::Added, ActionType::Modified, ActionType::Deleted])),
        asg in prop::option::of(text(xml_safe)),
    ) -> InstanceInfo {
        let mut i = InstanceInfo::new(&app, &host, &ip, 0);
        i.instance_id = id.map(Into::into);
        // `unknown` and `na` are not written (Java's defaults), and read back as `na`.
        i.set_sid(if sid == "unknown" { "na".into() } else { sid });
        (i.status, i.overridden_status) = statuses;
        i.port = PortInfo { port: ports.0, enabled: ports.1 };
        i.secure_port = PortInfo { port: ports.2, enabled: ports.3 };
        i.country_id = country;
        i.data_center_info = match dc {
            0 => DataCenterInfo::my_own(),
            1 => DataCenterInfo { name: DataCenterName::Netflix, metadata: Metadata::new() },
            _ => DataCenterInfo { name: DataCenterName::Amazon, metadata: dc_meta },
        };
        i.lease = LeaseTerms { renewal_interval_secs: lease.0, duration_secs: lease.1 };
        i.metadata = meta;
        i.set_app_group_name(urls[0].as_ref().map(|s| s.to_ascii_uppercase().into()));
        i.home_page_url = urls[1].clone().map(Into::into);
        i.status_page_url = urls[2].clone().map(Into::into);
        i.health_check_url = urls[3].clone().map(Into::into);
        i.set_secure_health_check_url(urls[4].clone().map(Into::into));
        i.vip_address = urls[5].clone().map(Into::into);
        i.secure_vip_address = urls[6].clone().map(Into::into);
        (i.last_updated_timestamp, i.last_dirty_timestamp) = times;
        i.action_type = action;
        i.set_asg_name(asg.map(Into::into));
        i
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
            eviction_ts: 3,
            service_up_ts: 4,
        },
        origin: Origin::Native,
    }
}

fn decode(body: &[u8], format: Format) -> InstanceInfo {
    let reg = decode_registration_from(Input::Bytes(body), Some(format), 0, InstanceLimits::UNLIMITED)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)));
    assert_eq!(reg.data_center, DataCenter::Named);
    reg.info
}

use crate::registry::limits::InstanceLimits;

proptest! {
    #[test]
    fn json_decodes_what_it_encodes(info in instance(false)) {
        let body = encode_instance(&view(&info), Format::Json);
        prop_assert_eq!(decode(&body, Format::Json), info);
    }

    #[test]
    fn xml_decodes_what_it_encodes(info in instance(true)) {
        let body = encode_instance(&view(&info), Format::Xml);
        prop_assert_eq!(decode(&body, Format::Xml), info);
    }

    #[test]
    fn xml_is_well_formed_whatever_it_holds(info in instance(false)) {
        let body = encode_instance(&view(&info), Format::Xml);
        let text = String::from_utf8(body.clone()).unwrap();
        prop_assert!(roxmltree::Document::parse(&text).is_ok(), "{}", text);
        // What XML cannot carry reads back as U+FFFD; everything else is intact.
        let back = decode(&body, Format::Xml);
        prop_assert_eq!(back.metadata.len(), info.metadata.len());
    }

    #[test]
    fn batches_decode_what_they_encode(info in instance(false), dirty in any::<i64>()) {
        let record = crate::registry::Replication {
            action: crate::registry::ReplicationAction::Register,
            app: info.app.to_string(),
            id: info.id().to_string(),
            last_dirty_timestamp: Some(dirty),
            status: Some(info.status),
            overridden_status: Some(info.overridden_status),
            instance: Some(view(&info)),
            origin: Origin::Native,
            writer: crate::registry::Writer::Client,
        };
        let body = batch::encode_list(&[&record]);
        let items = batch::decode_list(&body, 0).unwrap();
        prop_assert_eq!(items.len(), 1);
        prop_assert_eq!(items[0].last_dirty_timestamp, Some(dirty));
        prop_assert_eq!(items[0].instance.as_ref(), Some(&info));
    }

    #[test]
    fn metadata_names_round_trip_and_are_xml_names(key in text(false).prop_filter("a key", |k| !k.is_empty())) {
        let coded = xml::encode_name(&key);
        prop_assert_eq!(xml::decode_name(&coded), key);
        let doc = format!("<{coded}/>");
        prop_assert!(roxmltree::Document::parse(&doc).is_ok(), "{}", doc);
    }
}
