//! Codec tests against the payload shapes documented for the Java server and captured from the
//! Python, Node and Spring clients.

use std::sync::Arc;

use super::*;
use crate::registry::{
    Replication, ReplicationAction,
    instance::{ActionType, DataCenterName, LeaseTerms, PortInfo, Status},
    limits::{InstanceLimits, LimitExceeded},
    view::{AppView, AppsView, InstanceView, LeaseView, Origin},
};

fn sample() -> InstanceView {
    let mut i = InstanceInfo::new("order-service", "10.0.0.5", "10.0.0.5", 1_700_000_000_123);
    i.instance_id = Some("10.0.0.5:order-service:8080".into());
    i.port = PortInfo {
        port: 8080,
        enabled: true,
    };
    i.secure_port = PortInfo {
        port: 443,
        enabled: false,
    };
    i.metadata.insert("management.port", "8080");
    i.home_page_url = Some("http://10.0.0.5:8080/".into());
    i.status_page_url = Some("http://10.0.0.5:8080/actuator/info".into());
    i.health_check_url = Some("http://10.0.0.5:8080/actuator/health".into());
    i.vip_address = Some("order-service".into());
    i.secure_vip_address = Some("order-service".into());
    i.last_dirty_timestamp = 1_699_999_990_000;
    i.action_type = Some(ActionType::Added);
    InstanceView {
        info: Arc::new(i),
        lease: LeaseView {
            renewal_interval_secs: 30,
            duration_secs: 90,
            registration_ts: 1_700_000_000_123,
            last_renewal_ts: 1_700_000_120_456,
            eviction_ts: 0,
            service_up_ts: 1_700_000_000_100,
        },
        origin: Origin::Native,
    }
}

#[test]
fn json_instance_matches_the_java_shape_field_for_field() {
    let out = String::from_utf8(json::instance_document(&sample())).unwrap();
    let expected = concat!(
        r#"{"instance":{"instanceId":"10.0.0.5:order-service:8080","hostName":"10.0.0.5","app":"ORDER-SERVICE","#,
        r#""ipAddr":"10.0.0.5","status":"UP","overriddenStatus":"UNKNOWN","port":{"$":8080,"@enabled":"true"},"#,
        r#""securePort":{"$":443,"@enabled":"false"},"countryId":1,"#,
        r#""dataCenterInfo":{"@class":"com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo","name":"MyOwn"},"#,
        r#""leaseInfo":{"renewalIntervalInSecs":30,"durationInSecs":90,"registrationTimestamp":1700000000123,"#,
        r#""lastRenewalTimestamp":1700000120456,"evictionTimestamp":0,"serviceUpTimestamp":1700000000100},"#,
        r#""metadata":{"management.port":"8080"},"homePageUrl":"http://10.0.0.5:8080/","#,
        r#""statusPageUrl":"http://10.0.0.5:8080/actuator/info","healthCheckUrl":"http://10.0.0.5:8080/actuator/health","#,
        r#""vipAddress":"order-service","secureVipAddress":"order-service","isCoordinatingDiscoveryServer":"false","#,
        r#""lastUpdatedTimestamp":"1700000000123","lastDirtyTimestamp":"1699999990000","actionType":"ADDED"}}"#
    );
    assert_eq!(out, expected);
    serde_json::from_str::<serde_json::Value>(&out).unwrap();
}

#[test]
fn empty_metadata_and_amazon_data_center_use_the_class_markers() {
    let mut i = (*sample().info).clone();
    i.metadata = Default::default();
    i.data_center_info = crate::registry::instance::DataCenterInfo {
        name: DataCenterName::Amazon,
        metadata: [("instance-id", "i-1"), ("availability-zone", "us-east-1c")]
            .into_iter()
            .collect(),
    };
    let view = InstanceView {
        info: Arc::new(i),
        ..sample()
    };
    let out = String::from_utf8(json::instance_document(&view)).unwrap();
    assert!(
        out.contains(r#""metadata":{"@class":"java.util.Collections$EmptyMap"}"#),
        "{out}"
    );
    assert!(out.contains(
        r#""dataCenterInfo":{"@class":"com.netflix.appinfo.AmazonInfo","name":"Amazon","metadata":{"instance-id":"i-1","availability-zone":"us-east-1c"}}"#
    ));
    let xml = String::from_utf8(xml::instance_document(&view)).unwrap();
    assert!(
        xml.contains(r#"<metadata class="java.util.Collections$EmptyMap"/>"#),
        "{xml}"
    );
    assert!(xml.contains(r#"<dataCenterInfo class="com.netflix.appinfo.AmazonInfo"><name>Amazon</name><metadata><instance-id>i-1</instance-id>"#));
}

#[test]
fn applications_documents_always_use_arrays_and_string_versions() {
    let empty = AppsView {
        versions_delta: 1,
        apps_hashcode: String::new(),
        apps: vec![],
    };
    assert_eq!(
        String::from_utf8(json::applications(&empty)).unwrap(),
        r#"{"applications":{"versions__delta":"1","apps__hashcode":"","application":[]}}"#
    );
    assert_eq!(
        String::from_utf8(xml::applications(&empty)).unwrap(),
        "<applications><versions__delta>1</versions__delta><apps__hashcode></apps__hashcode></applications>"
    );
    let one = AppsView {
        versions_delta: 7,
        apps_hashcode: "UP_1_".into(),
        apps: vec![AppView {
            name: "ORDER-SERVICE".into(),
            instances: vec![sample()],
        }],
    };
    let v: serde_json::Value = serde_json::from_slice(&json::applications(&one)).unwrap();
    assert!(v["applications"]["application"].is_array());
    assert!(v["applications"]["application"][0]["instance"].is_array());
    assert_eq!(v["applications"]["versions__delta"], "7");
    let app: serde_json::Value = serde_json::from_slice(&json::application(&one.apps[0])).unwrap();
    assert_eq!(app["application"]["name"], "ORDER-SERVICE");
}

#[test]
fn xml_instance_matches_the_xstream_shape() {
    let out = String::from_utf8(xml::instance_document(&sample())).unwrap();
    let expected = concat!(
        "<instance><instanceId>10.0.0.5:order-service:8080</instanceId><hostName>10.0.0.5</hostName>",
        "<app>ORDER-SERVICE</app><ipAddr>10.0.0.5</ipAddr><status>UP</status>",
        "<overriddenstatus>UNKNOWN</overriddenstatus><port enabled=\"true\">8080</port>",
        "<securePort enabled=\"false\">443</securePort><countryId>1</countryId>",
        "<dataCenterInfo class=\"com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo\"><name>MyOwn</name></dataCenterInfo>",
        "<leaseInfo><renewalIntervalInSecs>30</renewalIntervalInSecs><durationInSecs>90</durationInSecs>",
        "<registrationTimestamp>1700000000123</registrationTimestamp><lastRenewalTimestamp>1700000120456</lastRenewalTimestamp>",
        "<evictionTimestamp>0</evictionTimestamp><serviceUpTimestamp>1700000000100</serviceUpTimestamp></leaseInfo>",
        "<metadata><management.port>8080</management.port></metadata>",
        "<homePageUrl>http://10.0.0.5:8080/</homePageUrl><statusPageUrl>http://10.0.0.5:8080/actuator/info</statusPageUrl>",
        "<healthCheckUrl>http://10.0.0.5:8080/actuator/health</healthCheckUrl><vipAddress>order-service</vipAddress>",
        "<secureVipAddress>order-service</secureVipAddress><isCoordinatingDiscoveryServer>false</isCoordinatingDiscoveryServer>",
        "<lastUpdatedTimestamp>1700000000123</lastUpdatedTimestamp><lastDirtyTimestamp>1699999990000</lastDirtyTimestamp>",
        "<actionType>ADDED</actionType></instance>"
    );
    assert_eq!(out, expected);
}

#[test]
fn xml_escapes_text_and_codes_metadata_names() {
    let mut i = (*sample().info).clone();
    i.metadata = [("a_b", "x<y & z"), ("$cost", "1")].into_iter().collect();
    let view = InstanceView {
        info: Arc::new(i),
        ..sample()
    };
    let out = String::from_utf8(xml::instance_document(&view)).unwrap();
    assert!(
        out.contains("<metadata><a__b>x&lt;y &amp; z</a__b><_-cost>1</_-cost></metadata>"),
        "{out}"
    );
    let back = decode_registration(out.as_bytes(), Format::Xml, 0).unwrap().info;
    assert_eq!(back.metadata.get("a_b"), Some("x<y & z"));
    assert_eq!(back.metadata.get("$cost"), Some("1"));
}

#[test]
fn both_formats_round_trip_an_instance() {
    let view = sample();
    for format in [Format::Json, Format::Xml] {
        let body = encode_instance(&view, format);
        let reg = decode_registration(&body, format, 42).unwrap();
        assert_eq!(reg.data_center, DataCenter::Named);
        let mut expected = (*view.info).clone();
        expected.lease = LeaseTerms {
            renewal_interval_secs: 30,
            duration_secs: 90,
        };
        assert_eq!(reg.info, expected, "{format:?}");
    }
}

#[test]
fn python_client_registration_is_accepted() {
    // Captured from py-eureka-client 0.13.3.
    let body = br#"{"instance": {"instanceId": "py-peer-1", "hostName": "127.0.0.1", "app": "PY-PEER", "ipAddr": "127.0.0.1",
       "port": {"$": 9090, "@enabled": "true"}, "securePort": {"$": 9443, "@enabled": "false"}, "countryId": 1,
       "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"},
       "leaseInfo": {"renewalIntervalInSecs": 30, "durationInSecs": 90, "registrationTimestamp": 0, "lastRenewalTimestamp": 0,
                     "evictionTimestamp": 0, "serviceUpTimestamp": 0},
       "metadata": {"management.port": "9090", "zone": "default", "lang": "python"},
       "homePageUrl": "http://127.0.0.1:9090/", "statusPageUrl": "http://127.0.0.1:9090/info",
       "healthCheckUrl": "http://127.0.0.1:9090/health", "secureHealthCheckUrl": "", "vipAddress": "py-peer",
       "secureVipAddress": "py-peer", "isCoordinatingDiscoveryServer": "false", "status": "UP",
       "overriddenstatus": "UNKNOWN", "lastUpdatedTimestamp": "1795997006790", "lastDirtyTimestamp": "1795997006790"}}"#;
    let reg = decode_registration(body, Format::Json, 0).unwrap();
    validate_registration(&reg, "PY-PEER").unwrap();
    assert_eq!(reg.info.id(), "py-peer-1");
    assert_eq!(
        reg.info.port,
        PortInfo {
            port: 9090,
            enabled: true
        }
    );
    assert_eq!(reg.info.last_dirty_timestamp, 1_795_997_006_790);
    assert_eq!(reg.info.metadata.get("lang"), Some("python"));
    assert_eq!(reg.info.secure_health_check_url(), Some(""));
}

#[test]
fn node_client_registration_is_accepted() {
    // Captured from eureka-js-client 4.5.0: boolean @enabled, no leaseInfo, no timestamps.
    let body = br#"{"instance":{"app":"JS-PEER","instanceId":"js-peer-1","hostName":"127.0.0.1","ipAddr":"127.0.0.1",
       "statusPageUrl":"http://127.0.0.1:9091/info","healthCheckUrl":"http://127.0.0.1:9091/health",
       "port":{"$":9091,"@enabled":true},"vipAddress":"js-peer",
       "dataCenterInfo":{"@class":"com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo","name":"MyOwn"},
       "metadata":{"lang":"node"},"status":"UP"}}"#;
    let reg = decode_registration(body, Format::Json, 77).unwrap();
    validate_registration(&reg, "JS-PEER").unwrap();
    assert_eq!(reg.info.port.port, 9091);
    assert_eq!(
        reg.info.secure_port,
        PortInfo {
            port: 7002,
            enabled: false
        }
    );
    assert_eq!(reg.info.last_dirty_timestamp, 77, "defaults to the decode time");
    assert_eq!(
        reg.info.lease,
        LeaseTerms {
            renewal_interval_secs: 30,
            duration_secs: 90
        }
    );
}

#[test]
fn spring_client_registration_is_accepted() {
    let body = br#"{"instance":{"instanceId":"host1:order-service:8080","app":"ORDER-SERVICE","appGroupName":null,"ipAddr":"10.0.0.5","sid":"na",
     "homePageUrl":"http://10.0.0.5:8080/","statusPageUrl":"http://10.0.0.5:8080/actuator/info",
     "healthCheckUrl":"http://10.0.0.5:8080/actuator/health","secureHealthCheckUrl":null,"vipAddress":"order-service",
     "secureVipAddress":"order-service","countryId":1,
     "dataCenterInfo":{"@class":"com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo","name":"MyOwn"},
     "hostName":"10.0.0.5","status":"UP","overriddenStatus":"UNKNOWN",
     "leaseInfo":{"renewalIntervalInSecs":30,"durationInSecs":90,"registrationTimestamp":0,"lastRenewalTimestamp":0,"evictionTimestamp":0,"serviceUpTimestamp":0},
     "isCoordinatingDiscoveryServer":false,"lastUpdatedTimestamp":1700000000000,"lastDirtyTimestamp":1700000000000,
     "actionType":null,"asgName":null,"port":{"$":8080,"@enabled":"true"},"securePort":{"$":443,"@enabled":"false"},
     "metadata":{"management.port":"8080"}}}"#;
    let reg = decode_registration(body, Format::Json, 0).unwrap();
    validate_registration(&reg, "ORDER-SERVICE").unwrap();
    assert_eq!(reg.info.app_group_name(), None);
    assert_eq!(reg.info.last_dirty_timestamp, 1_700_000_000_000);
}

#[test]
fn json_quirks_follow_java() {
    let base = |inner: &str| {
        format!(
            r#"{{"instance":{{"hostName":"h","app":"A","ipAddr":"1.2.3.4","dataCenterInfo":{{"@class":"com.netflix.appinfo.MyDataCenterInfo","name":"MyOwn"}}{inner}}}}}"#
        )
    };
    // Statuses are case-sensitive; unknown ones become UNKNOWN.
    let reg = decode_registration(base(r#","status":"up""#).as_bytes(), Format::Json, 0).unwrap();
    assert_eq!(reg.info.status, Status::Unknown);
    // Numbers as strings, the legacy lowercase override key, metadata @class skipped.
    let reg = decode_registration(
        base(r#","countryId":"3","overriddenstatus":"OUT_OF_SERVICE","metadata":{"@class":"x","k":5}"#).as_bytes(),
        Format::Json,
        0,
    )
    .unwrap();
    assert_eq!(reg.info.country_id, 3);
    assert_eq!(reg.info.overridden_status, Status::OutOfService);
    assert_eq!(reg.info.metadata.get("k"), Some("5"));
    assert_eq!(reg.info.metadata.len(), 1);
    // The id falls back to the host name.
    assert_eq!(reg.info.id(), "h");
    // Spring's server codec builds the id from metadata.instanceId.
    let reg = decode_registration(base(r#","metadata":{"instanceId":"a:1"}"#).as_bytes(), Format::Json, 0).unwrap();
    assert_eq!(reg.info.id(), "h:a:1");
}

#[test]
fn malformed_registrations_are_decode_errors() {
    let cases: &[&[u8]] = &[
        b"",
        b"not json",
        br#"{"hostName":"h"}"#,
        br#"{"instance":"x"}"#,
        br#"{"instance":{"hostName":"h","port":8080,"dataCenterInfo":{"@class":"x","name":"MyOwn"}}}"#,
        br#"{"instance":{"hostName":"h","dataCenterInfo":{"name":"MyOwn"}}}"#,
        br#"{"instance":{"hostName":"h","dataCenterInfo":{"@class":"com.netflix.appinfo.MyDataCenterInfo","name":"Mine"}}}"#,
        br#"{"instance":{"hostName":"h","metadata":{"k":{"nested":1}}}}"#,
    ];
    for body in cases {
        let err = decode_registration(body, Format::Json, 0).unwrap_err();
        assert!(!err.message.is_empty());
    }
    let err = decode_registration(br#"{"application":{}}"#, Format::Json, 0).unwrap_err();
    assert_eq!(
        err.message,
        "Root name 'application' does not match expected ('instance')"
    );
}

#[test]
fn xml_with_a_dtd_or_unknown_entities_is_refused() {
    let bomb = r#"<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]><instance><hostName>&lol2;</hostName></instance>"#;
    let err = decode_registration(bomb.as_bytes(), Format::Xml, 0).unwrap_err();
    assert!(err.message.contains("DTD"), "{err:?}");
    let ext = r#"<instance><hostName>&xxe;</hostName></instance>"#;
    let err = decode_registration(ext.as_bytes(), Format::Xml, 0).unwrap_err();
    assert!(err.message.contains("entity"), "{err:?}");
    let ok = r#"<?xml version="1.0" encoding="UTF-8"?><instance><hostName>a&amp;b&#x41;</hostName></instance>"#;
    assert_eq!(
        decode_registration(ok.as_bytes(), Format::Xml, 0)
            .unwrap()
            .info
            .host_name,
        "a&bA"
    );
    for bad in [
        "<instance>",
        "<instance></other>",
        "<instance/><instance/>",
        "<a><port>x</port></a>",
        "text",
    ] {
        assert!(decode_registration(bad.as_bytes(), Format::Xml, 0).is_err(), "{bad}");
    }
    let deep = "<instance>".to_string() + &"<a>".repeat(40) + &"</a>".repeat(40) + "</instance>";
    assert!(decode_registration(deep.as_bytes(), Format::Xml, 0).is_err());
}

#[test]
fn xml_registration_is_lenient_where_xstream_is() {
    let body = r#"<instance><hostName>h</hostName><app>a</app><ipAddr>1.2.3.4</ipAddr><status>up</status>
        <port>80</port><securePort enabled="true">443</securePort><lastDirtyTimestamp>bad</lastDirtyTimestamp>
        <dataCenterInfo class="whatever"><name>MyOwn</name></dataCenterInfo></instance>"#;
    let reg = decode_registration(body.as_bytes(), Format::Xml, 9).unwrap();
    validate_registration(&reg, "A").unwrap();
    assert_eq!(reg.info.status, Status::Up);
    assert_eq!(
        reg.info.port,
        PortInfo {
            port: 80,
            enabled: true
        }
    );
    assert_eq!(
        reg.info.secure_port,
        PortInfo {
            port: 443,
            enabled: true
        }
    );
    assert_eq!(reg.info.last_dirty_timestamp, 9);
}

#[test]
fn validation_messages_and_order_follow_java() {
    let reg = |host: &str, ip: &str, app: &str, dc: bool| Registration {
        info: InstanceInfo::new(app, host, ip, 0),
        data_center: if dc { DataCenter::Named } else { DataCenter::Missing },
    };
    assert_eq!(
        validate_registration(&reg("", "1.1.1.1", "A", true), "A").unwrap_err(),
        "Missing instanceId"
    );
    let mut r = reg("", "1.1.1.1", "A", true);
    r.info.instance_id = Some("i".into());
    assert_eq!(validate_registration(&r, "A").unwrap_err(), "Missing hostname");
    assert_eq!(
        validate_registration(&reg("h", "", "A", true), "A").unwrap_err(),
        "Missing ip address"
    );
    assert_eq!(
        validate_registration(&reg("h", "1", "", true), "A").unwrap_err(),
        "Missing appName"
    );
    assert_eq!(
        validate_registration(&reg("h", "1", "B", true), "A").unwrap_err(),
        "Mismatched appName, expecting A but was B"
    );
    assert_eq!(
        validate_registration(&reg("h", "1", "A", false), "A").unwrap_err(),
        "Missing dataCenterInfo"
    );
    validate_registration(&reg("h", "1", "A", true), "A").unwrap();
}

/// The record of a client registering `view`.
fn register_record(view: &InstanceView) -> Replication {
    Replication {
        action: ReplicationAction::Register,
        app: "ORDER-SERVICE".into(),
        id: view.id().into(),
        last_dirty_timestamp: Some(1),
        status: Some(Status::Up),
        overridden_status: None,
        instance: Some(view.clone()),
        origin: Origin::Native,
        writer: crate::registry::Writer::Client,
    }
}

/// Every kind of batch item in Java's shapes, written and read back (one table, so one test).
#[test]
fn batch_round_trips_with_java_shapes() {
    let view = sample();
    let items = [
        register_record(&view),
        Replication {
            action: ReplicationAction::Heartbeat,
            app: "ORDER-SERVICE".into(),
            id: view.id().into(),
            last_dirty_timestamp: Some(2),
            status: Some(Status::OutOfService),
            overridden_status: Some(Status::OutOfService),
            instance: None,
            origin: Origin::Native,
            writer: crate::registry::Writer::Client,
        },
        Replication {
            action: ReplicationAction::Cancel,
            app: "BILLING".into(),
            id: "b".into(),
            last_dirty_timestamp: None,
            status: None,
            overridden_status: None,
            instance: None,
            origin: Origin::Native,
            writer: crate::registry::Writer::Client,
        },
    ];
    let body = batch::encode_list(&items.iter().collect::<Vec<_>>());
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        v["replicationList"][2],
        serde_json::json!({"appName": "BILLING", "id": "b", "action": "Cancel"}),
        "nulls omitted"
    );
    assert!(v["replicationList"][0]["lastDirtyTimestamp"].is_number());
    let decoded = batch::decode_list(&body, 0).unwrap();
    let hb = &decoded[1];
    assert_eq!(hb.action, ReplicationAction::Heartbeat);
    assert_eq!(hb.overridden_status.as_deref(), Some("OUT_OF_SERVICE"));
    let reg = &decoded[0];
    assert_eq!(reg.instance.as_ref().unwrap().id(), view.id());

    let resp = batch::encode_response(&[
        batch::ItemResponse {
            status_code: 200,
            entity: None,
        },
        batch::ItemResponse {
            status_code: 409,
            entity: Some(view.clone()),
        },
    ]);
    let back = batch::decode_response(&resp, 0).unwrap();
    assert_eq!(back[0].status_code, 200);
    assert_eq!(back[1].entity.as_ref().unwrap().id(), view.id());

    let bad = batch::decode_list(
        br#"{"replicationList":[{"action":"Nope"},{"action":"Cancel","appName":"x","id":"y"}]}"#,
        0,
    );
    assert!(bad.unwrap_err().message.contains("item 0: unknown replication action"));
    assert!(batch::decode_list(b"[]", 0).is_err());
}

#[test]
fn a_repeated_xml_metadata_key_keeps_its_place_and_takes_the_last_value() {
    let body = br#"<instance><instanceId>x-1</instanceId><hostName>h</hostName><app>X</app><ipAddr>10.0.0.1</ipAddr>
      <dataCenterInfo class="com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo"><name>MyOwn</name></dataCenterInfo>
      <metadata><zone>a</zone><lang>rust</lang><zone>b</zone></metadata></instance>"#;
    let reg = decode_registration(body, Format::Xml, 0).unwrap();
    let pairs: Vec<_> = reg.info.metadata.iter().collect();
    assert_eq!(pairs, [("zone", "b"), ("lang", "rust")]);
}

#[test]
fn metadata_names_are_coded_as_the_java_server_codes_them() {
    // Captured from the Spring Cloud Netflix Eureka server (the test peer) after
    // `PUT .../metadata?a%20b=1&x%3E%3Cevil%2F=2&1num=3&u_s%20p=4&ctl%01k=v` and a registration
    // with the key U+1F600.
    for (key, coded) in [
        ("a b", "a_.0020b"),
        ("x><evil/", "x_.003e_.003cevil_.002f"),
        ("1num", "_.0031num"),
        ("u_s p", "u__s_.0020p"),
        ("ctl\u{1}k", "ctl_.0001k"),
        ("\u{1F600}", "_.d83d_.de00"),
        ("management.port", "management.port"),
        ("$cost_x", "_-cost__x"),
        ("é-ü", "é-ü"),
        // Java writes `c:d`; a namespace-aware reader refuses the unbound prefix.
        ("c:d", "c_.003ad"),
    ] {
        assert_eq!(xml::encode_name(key), coded, "{key:?}");
        assert_eq!(xml::decode_name(coded), key, "{coded:?}");
    }
    assert_eq!(xml::decode_name("c:d"), "c:d");
    assert_eq!(xml::decode_name("a_.zz"), "a_.zz", "not a code: kept");
    assert_eq!(xml::decode_name("_.d83d"), "\u{FFFD}", "a lone surrogate");
}

fn hostile_view() -> InstanceView {
    let mut i = (*sample().info).clone();
    i.host_name = "h\u{1}\r\n\u{FFFF}<&>\"'".into();
    i.app = "A\u{0}PP".into();
    i.metadata = [
        ("a b", "1"),
        ("x><evil/", "<evil/>"),
        ("1num", "v\u{1}v"),
        ("c:d", "a\rb"),
        ("\u{1F600}", "emoji"),
        ("-", ""),
        ("ok", "]]>"),
    ]
    .into_iter()
    .collect();
    InstanceView {
        info: Arc::new(i),
        ..sample()
    }
}

#[test]
fn every_xml_document_is_well_formed_whatever_is_stored() {
    let view = hostile_view();
    let app = AppView {
        name: "A\u{0}PP<".into(),
        instances: vec![view.clone()],
    };
    let apps = AppsView {
        versions_delta: 1,
        apps_hashcode: "UP_1_".into(),
        apps: vec![app.clone()],
    };
    let docs = [
        xml::instance_document(&view),
        xml::application(&app),
        xml::applications(&apps),
        encode_apps_from_fragments(1, "UP_1_", &[&xml::application(&app)], Format::Xml),
    ];
    for doc in &docs {
        let text = String::from_utf8(doc.clone()).unwrap();
        roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    }
    let back = decode_registration(&docs[0], Format::Xml, 0).unwrap().info;
    assert_eq!(back.metadata.get("a b"), Some("1"));
    assert_eq!(back.metadata.get("x><evil/"), Some("<evil/>"));
    assert_eq!(back.metadata.get("c:d"), Some("a\rb"), "a carriage return survives");
    assert_eq!(back.metadata.get("\u{1F600}"), Some("emoji"));
    assert_eq!(
        back.metadata.get("1num"),
        Some("v\u{FFFD}v"),
        "XML 1.0 cannot carry U+0001"
    );
    assert_eq!(back.host_name, "h\u{FFFD}\r\n\u{FFFD}<&>\"'");
}

#[test]
fn empty_metadata_keys_are_never_written() {
    let mut i = (*sample().info).clone();
    i.metadata = [("", "x"), ("k", "v")].into_iter().collect();
    let out = String::from_utf8(xml::instance_document(&InstanceView {
        info: Arc::new(i),
        ..sample()
    }))
    .unwrap();
    assert!(out.contains("<metadata><k>v</k></metadata>"), "{out}");
}

fn limits(keys: usize, bytes: usize) -> InstanceLimits {
    InstanceLimits {
        max_metadata_keys: keys,
        max_bytes: bytes,
    }
}

fn registration_with_metadata(format: Format, n: usize) -> Vec<u8> {
    let mut i = (*sample().info).clone();
    i.metadata = (0..n).map(|k| (format!("k{k}"), "v")).collect();
    encode_instance(
        &InstanceView {
            info: Arc::new(i),
            ..sample()
        },
        format,
    )
}

#[test]
fn caps_apply_while_decoding() {
    for format in [Format::Json, Format::Xml] {
        let body = registration_with_metadata(format, 50);
        let ok = decode_registration_from(Input::Bytes(&body), Some(format), 0, limits(50, 10_000));
        assert_eq!(ok.unwrap().info.metadata.len(), 50);
        let err = decode_registration_from(Input::Bytes(&body), Some(format), 0, limits(49, 10_000)).unwrap_err();
        assert_eq!(
            err,
            RegistrationError::OverLimit(LimitExceeded::MetadataKeys { limit: 49 })
        );
        let err = decode_registration_from(Input::Bytes(&body), Some(format), 0, limits(50, 300)).unwrap_err();
        assert_eq!(
            err,
            RegistrationError::OverLimit(LimitExceeded::InstanceBytes { limit: 300 })
        );
    }
    // An empty key cannot be an XML element; in JSON it is refused, as no XML reader could get it.
    let body = String::from_utf8(registration_with_metadata(Format::Json, 5))
        .unwrap()
        .replacen("k0", "", 1);
    let err = decode_registration_from(Input::Bytes(body.as_bytes()), Some(Format::Json), 0, limits(50, 10_000));
    assert_eq!(
        err.unwrap_err(),
        RegistrationError::OverLimit(LimitExceeded::EmptyMetadataKey)
    );
}

#[test]
fn streams_decode_as_bytes_do_and_the_format_is_sniffed() {
    for format in [Format::Json, Format::Xml] {
        let mut body = b" \n\t ".to_vec();
        body.extend(registration_with_metadata(format, 20));
        let from_bytes = decode_registration_from(Input::Bytes(&body), None, 5, InstanceLimits::default()).unwrap();
        // A reader that hands out one byte at a time, the worst case for a streaming decoder.
        struct Trickle<'a>(&'a [u8]);
        impl std::io::Read for Trickle<'_> {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.len().min(out.len()).min(1);
                out[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut stream = std::io::BufReader::with_capacity(1, Trickle(&body));
        let from_stream = decode_registration_from(Input::Stream(&mut stream), None, 5, InstanceLimits::default());
        assert_eq!(from_stream.unwrap(), from_bytes, "{format:?}");
    }
}

#[test]
fn unknown_values_are_skipped_whatever_their_size_or_shape() {
    let bomb = format!(
        r#"{{"instance":{{"hostName":"h","junk":[{}0],"nested":{{"a":[{{"b":[1,2,{{"c":null}}]}}]}},"app":"A","ipAddr":"1","dataCenterInfo":{{"@class":"x","name":"MyOwn"}}}}}}"#,
        "0,".repeat(500_000)
    );
    let reg = decode_registration(bomb.as_bytes(), Format::Json, 0).unwrap();
    assert_eq!((reg.info.host_name.as_str(), reg.info.app.as_str()), ("h", "A"));
    let xml = format!(
        "<instance><hostName>h</hostName><junk>{}</junk><app>a</app></instance>",
        "<a x=\"1\"><b>text</b></a>".repeat(50_000)
    );
    let reg = decode_registration(xml.as_bytes(), Format::Xml, 0).unwrap();
    assert_eq!((reg.info.host_name.as_str(), reg.info.app.as_str()), ("h", "A"));
}

#[test]
fn an_oversized_instance_in_a_batch_fails_only_its_item() {
    let mut i = (*sample().info).clone();
    i.metadata = (0..10).map(|k| (format!("k{k}"), "v")).collect();
    let view = InstanceView {
        info: Arc::new(i),
        ..sample()
    };
    let register = register_record(&view);
    let cancel = Replication {
        action: ReplicationAction::Cancel,
        instance: None,
        ..register.clone()
    };
    let body = batch::encode_list(&[&register, &cancel]);
    let items = batch::decode_list_from(Input::Bytes(&body), 0, limits(5, 10_000)).unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0].instance, None);
    assert_eq!(items[0].over_limit, Some(LimitExceeded::MetadataKeys { limit: 5 }));
    assert_eq!(items[1].action, ReplicationAction::Cancel);
    let items = batch::decode_list_from(Input::Bytes(&body), 0, limits(10, 10_000)).unwrap();
    assert_eq!(items[0].instance.as_ref().unwrap().metadata.len(), 10);
}

#[test]
fn json_metadata_keeps_the_order_it_was_sent_in() {
    let body = br#"{"instance":{"hostName":"h","metadata":{"zeta":"1","alpha":"2","mid":3,"alpha":"4"}}}"#;
    let reg = decode_registration(body, Format::Json, 0).unwrap();
    let pairs: Vec<_> = reg.info.metadata.iter().collect();
    assert_eq!(pairs, [("zeta", "1"), ("alpha", "4"), ("mid", "3")]);
}
