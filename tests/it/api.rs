//! Black-box tests of the Eureka HTTP API, in process (the router driven with `oneshot`): status
//! codes, payload quirks, content negotiation, gzip, paths, bad input, basic auth.

use std::{io::Read, sync::Arc};

use axum::{
    body::{Body, to_bytes},
    http::{Request, StatusCode, header},
};
use base64::Engine;
use eureka_operator::{
    api::{
        self, Api,
        auth::{self, Access},
    },
    health::Health,
    metrics::Metrics,
    registry::{Registry, RegistryConfig},
    state::{AppState, Clock, SystemClock},
};
use serde_json::Value;
use tokio::sync::watch;
use tower::ServiceExt;

fn app_with(disable_delta: bool, access: Option<Access>) -> (api::Service, AppState) {
    let health = Health::new(Arc::new(std::sync::atomic::AtomicBool::new(true)));
    app_full(disable_delta, access, health, Metrics::new())
}

fn app_full(
    disable_delta: bool,
    access: Option<Access>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
) -> (api::Service, AppState) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let state = AppState::new(
        Registry::new(RegistryConfig::default(), clock.now_ms()),
        clock.clone(),
        disable_delta,
        Default::default(),
    );
    state.open_for_traffic(0);
    let (_tx, peers) = watch::channel(Vec::new());
    let api = Api {
        state: state.clone(),
        metrics,
        health,
        max_body: 64 * 1024,
        input: Default::default(),
        started_at: clock.now_ms(),
        environment: "test".into(),
        peers,
        leadership: None,
        identity: Arc::new(api::identity("test-1", "127.0.0.1", 8761, clock.now_ms())),
        links: None,
    };
    (api::router(api, access), state)
}

fn app() -> (api::Service, AppState) {
    app_with(false, None)
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    fn content_type(&self) -> Option<&str> {
        self.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok())
    }
}

async fn call(app: &api::Service, req: Request<Body>) -> Reply {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = to_bytes(resp.into_body(), usize::MAX).await.unwrap().to_vec();
    Reply { status, headers, body }
}

fn req(method: &str, uri: &str) -> axum::http::request::Builder {
    Request::builder().method(method).uri(uri)
}

fn instance_json(app: &str, id: &str) -> String {
    format!(
        r#"{{"instance":{{"instanceId":"{id}","hostName":"10.0.0.9","app":"{app}","ipAddr":"10.0.0.9","status":"UP",
        "port":{{"$":8080,"@enabled":"true"}},"vipAddress":"{vip}","secureVipAddress":"{vip}-secure",
        "dataCenterInfo":{{"@class":"com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo","name":"MyOwn"}},
        "leaseInfo":{{"renewalIntervalInSecs":30,"durationInSecs":90}},"metadata":{{"zone":"a"}},
        "lastDirtyTimestamp":"1000"}}}}"#,
        vip = app.to_ascii_lowercase()
    )
}

async fn register(app: &api::Service, name: &str, id: &str) -> Reply {
    call(
        app,
        req("POST", &format!("/eureka/apps/{name}"))
            .header("content-type", "application/json")
            .body(Body::from(instance_json(name, id)))
            .unwrap(),
    )
    .await
}

#[tokio::test]
async fn register_fetch_renew_cancel_with_java_status_codes() {
    let (app, _) = app();
    let r = register(&app, "ORDERS", "o-1").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert!(r.body.is_empty());

    // XML without an Accept header; JSON when asked.
    let r = call(&app, req("GET", "/eureka/apps").body(Body::empty()).unwrap()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.content_type(), Some("application/xml"));
    assert!(
        r.text()
            .starts_with("<applications><versions__delta>1</versions__delta><apps__hashcode>UP_1_</apps__hashcode>")
    );
    let r = call(
        &app,
        req("GET", "/eureka/v2/apps/")
            .header("accept", "application/json")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.content_type(), Some("application/json"));
    let v = r.json();
    assert_eq!(v["applications"]["application"][0]["instance"][0]["instanceId"], "o-1");
    assert_eq!(
        v["applications"]["application"][0]["instance"][0]["metadata"]["zone"],
        "a"
    );

    // Renew: 200 with an empty body and no content type; unknown: 404 likewise.
    let r = call(
        &app,
        req("PUT", "/eureka/apps/ORDERS/o-1?status=UP&lastDirtyTimestamp=1000")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.is_empty() && r.content_type().is_none());
    let r = call(
        &app,
        req("PUT", "/eureka/apps/ORDERS/zzz?status=UP")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.body.is_empty() && r.content_type().is_none());
    // A newer dirty timestamp from the client: re-register (404).
    let r = call(
        &app,
        req("PUT", "/eureka/apps/ORDERS/o-1?lastDirtyTimestamp=2000")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // An older one from a peer: 409 with our copy.
    let r = call(
        &app,
        req("PUT", "/eureka/apps/ORDERS/o-1?lastDirtyTimestamp=10")
            .header("x-netflix-discovery-replication", "true")
            .header("accept", "application/json")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.json()["instance"]["lastDirtyTimestamp"], "1000");

    let r = call(
        &app,
        req("DELETE", "/eureka/apps/ORDERS/o-1").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = call(
        &app,
        req("DELETE", "/eureka/apps/ORDERS/o-1").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = call(&app, req("GET", "/eureka/apps/ORDERS").body(Body::empty()).unwrap()).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn paths_are_case_insensitive_for_apps_and_decode_ids() {
    let (app, _) = app();
    assert_eq!(
        register(&app, "orders", "host:orders:8080").await.status,
        StatusCode::NO_CONTENT
    );
    for uri in [
        "/eureka/apps/ORDERS/host%3Aorders%3A8080",
        "/eureka/apps/orders/host:orders:8080",
        "/eureka/v2/apps/Orders/host%3Aorders%3A8080/",
        "/eureka/instances/host%3Aorders%3A8080",
    ] {
        let r = call(
            &app,
            req("GET", uri)
                .header("accept", "application/json")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{uri}");
        assert_eq!(r.json()["instance"]["app"], "ORDERS");
    }
    let r = call(&app, req("GET", "/eureka/apps/orders").body(Body::empty()).unwrap()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.text().starts_with("<application><name>ORDERS</name>"));
}

#[tokio::test]
async fn gzip_is_served_for_full_and_delta_fetches() {
    let (app, _) = app();
    register(&app, "ORDERS", "o-1").await;
    for uri in ["/eureka/apps/", "/eureka/apps/delta"] {
        let plain = call(
            &app,
            req("GET", uri)
                .header("accept", "application/json")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        let gz = call(
            &app,
            req("GET", uri)
                .header("accept", "application/json")
                .header("accept-encoding", "gzip, deflate")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(gz.headers.get(header::CONTENT_ENCODING).unwrap(), "gzip");
        assert_eq!(gz.content_type(), Some("application/json"));
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&gz.body[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, plain.body, "{uri}");
    }
}

/// Each application's gzip piece refers back into the one before it: a write to an application
/// must recompress the next one's piece too, or the document no longer inflates to the text.
#[tokio::test]
async fn gzip_payloads_stay_whole_after_a_write_to_the_application_before_another() {
    let (app, _) = app();
    for name in ["AAA", "BBB", "CCC"] {
        for i in 0..3 {
            register(&app, name, &format!("{}-{i}", name.to_lowercase())).await;
        }
    }
    for round in 0..2 {
        for uri in ["/eureka/apps/", "/eureka/apps/delta"] {
            let get = |gzip: bool| {
                let mut r = req("GET", uri).header("accept", "application/json");
                if gzip {
                    r = r.header("accept-encoding", "gzip");
                }
                r.body(Body::empty()).unwrap()
            };
            let plain = call(&app, get(false)).await;
            let gz = call(&app, get(true)).await;
            let mut out = Vec::new();
            let inflated = flate2::read::GzDecoder::new(&gz.body[..]).read_to_end(&mut out);
            assert!(inflated.is_ok(), "{uri}, round {round}: {inflated:?}");
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&plain.body),
                "{uri}, round {round}"
            );
        }
        // A new last instance of the first application changes the bytes BBB's piece follows.
        // Its id is longer than the one it follows, so the window BBB's piece was compressed
        // after shifts: a piece not compressed again then inflates to other bytes whatever the
        // clock read (with ids of one length and registrations in one millisecond, the old and
        // the new window differed in one digit, which the piece might not refer to).
        register(&app, "AAA", &format!("aaa-9-{round}-a-longer-id")).await;
    }
}

#[tokio::test]
async fn delta_carries_action_types_and_the_full_hash() {
    let (app, _) = app();
    register(&app, "ORDERS", "o-1").await;
    register(&app, "ORDERS", "o-2").await;
    call(
        &app,
        req("PUT", "/eureka/apps/ORDERS/o-2/status?value=OUT_OF_SERVICE")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    call(
        &app,
        req("DELETE", "/eureka/apps/ORDERS/o-1").body(Body::empty()).unwrap(),
    )
    .await;
    register(&app, "BILLING", "b-1").await;
    let r = call(
        &app,
        req("GET", "/eureka/apps/delta")
            .header("accept", "application/json")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    let v = r.json();
    assert_eq!(v["applications"]["apps__hashcode"], "OUT_OF_SERVICE_1_UP_1_");
    let mut actions = Vec::new();
    for a in v["applications"]["application"].as_array().unwrap() {
        for i in a["instance"].as_array().unwrap() {
            actions.push((
                i["instanceId"].as_str().unwrap().to_string(),
                i["actionType"].as_str().unwrap().to_string(),
            ));
        }
    }
    actions.sort();
    assert_eq!(
        actions,
        [("b-1", "ADDED"), ("o-1", "DELETED"), ("o-2", "MODIFIED")].map(|(a, b)| (a.to_string(), b.to_string()))
    );
    let (app, _) = app_with(true, None);
    let r = call(&app, req("GET", "/eureka/apps/delta").body(Body::empty()).unwrap()).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "delta disabled");
}

#[tokio::test]
async fn vips_svips_and_metadata() {
    let (app, _) = app();
    register(&app, "ORDERS", "o-1").await;
    let r = call(
        &app,
        req("GET", "/eureka/vips/orders")
            .header("accept", "application/json")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(
        r.json()["applications"]["application"][0]["instance"][0]["instanceId"],
        "o-1"
    );
    assert_eq!(r.json()["applications"]["versions__delta"], "-1");
    let r = call(
        &app,
        req("GET", "/eureka/svips/orders-secure")
            .header("accept", "application/json")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.json()["applications"]["application"].as_array().unwrap().len(), 1);
    let r = call(
        &app,
        req("GET", "/eureka/vips/nothing")
            .header("accept", "application/json")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "an unknown VIP is an empty document, as Java");
    assert_eq!(r.json()["applications"]["application"], serde_json::json!([]));

    let r = call(
        &app,
        req("PUT", "/eureka/apps/ORDERS/o-1/metadata?team=blue&zone=b")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = call(
        &app,
        req("GET", "/eureka/apps/ORDERS/o-1")
            .header("accept", "application/json")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(
        r.json()["instance"]["metadata"],
        serde_json::json!({"zone": "b", "team": "blue"})
    );
    let r = call(
        &app,
        req("PUT", "/eureka/apps/ORDERS/none/metadata?a=b")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn xml_registration_and_head() {
    let (app, _) = app();
    let body = r#"<instance><instanceId>x-1</instanceId><hostName>h</hostName><app>XML-APP</app><ipAddr>10.1.1.1</ipAddr>
        <status>UP</status><port enabled="true">80</port>
        <dataCenterInfo class="com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo"><name>MyOwn</name></dataCenterInfo></instance>"#;
    let r = call(
        &app,
        req("POST", "/eureka/apps/xml-app")
            .header("content-type", "application/xml")
            .body(Body::from(body))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let r = call(&app, req("HEAD", "/eureka/apps/XML-APP").body(Body::empty()).unwrap()).await;
    assert_eq!(r.status, StatusCode::OK);
}

/// Every bad request gets a 4xx with a short message, and changes nothing.
#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let (app, state) = app();
    register(&app, "ORDERS", "o-1").await;
    let before = state.with_registry(|r, _| (r.version(), r.full_view()));
    let json = |body: &str| {
        req("POST", "/eureka/apps/ORDERS")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let xml = |body: &str| {
        req("POST", "/eureka/apps/ORDERS")
            .header("content-type", "application/xml")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let cases: Vec<(&str, Request<Body>, StatusCode, &str)> = vec![
        (
            "malformed JSON",
            json("{\"instance\": {"),
            StatusCode::BAD_REQUEST,
            "cannot parse request body",
        ),
        (
            "unwrapped body",
            json(r#"{"hostName":"h"}"#),
            StatusCode::BAD_REQUEST,
            "does not match expected ('instance')",
        ),
        (
            "port as a number",
            json(r#"{"instance":{"hostName":"h","port":80}}"#),
            StatusCode::BAD_REQUEST,
            "port must be an object",
        ),
        (
            "missing hostname",
            json(
                r#"{"instance":{"instanceId":"i","app":"ORDERS","ipAddr":"1.1.1.1","dataCenterInfo":{"@class":"x","name":"MyOwn"}}}"#,
            ),
            StatusCode::BAD_REQUEST,
            "Missing hostname",
        ),
        (
            "mismatched app",
            json(&instance_json("BILLING", "b")),
            StatusCode::BAD_REQUEST,
            "Mismatched appName, expecting ORDERS but was BILLING",
        ),
        (
            "missing data center",
            json(r#"{"instance":{"hostName":"h","app":"ORDERS","ipAddr":"1.1.1.1"}}"#),
            StatusCode::BAD_REQUEST,
            "Missing dataCenterInfo",
        ),
        (
            "malformed XML",
            xml("<instance><hostName>h</instance>"),
            StatusCode::BAD_REQUEST,
            "cannot parse request body",
        ),
        (
            "XML with a DTD",
            xml(
                r#"<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><instance><hostName>&e;</hostName></instance>"#,
            ),
            StatusCode::BAD_REQUEST,
            "DTD",
        ),
        (
            "XML entity",
            xml("<instance><hostName>&e;</hostName></instance>"),
            StatusCode::BAD_REQUEST,
            "undefined XML entity",
        ),
        (
            "wrong root",
            xml("<application/>"),
            StatusCode::BAD_REQUEST,
            "expected an &lt;instance&gt;",
        ),
        (
            "unsupported media type",
            req("POST", "/eureka/apps/ORDERS")
                .header("content-type", "text/plain")
                .body(Body::from("x"))
                .unwrap(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "text/plain",
        ),
        (
            "unsupported charset",
            req("POST", "/eureka/apps/ORDERS")
                .header("content-type", "application/json; charset=UTF-16")
                .body(Body::from("x"))
                .unwrap(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "charset",
        ),
        (
            "oversized body",
            json(&format!(
                "{{\"instance\":{{\"hostName\":\"{}\"}}}}",
                "x".repeat(100_000)
            )),
            StatusCode::PAYLOAD_TOO_LARGE,
            "larger than",
        ),
        (
            "gzip bomb",
            req("POST", "/eureka/apps/ORDERS")
                .header("content-type", "application/json")
                .header("content-encoding", "gzip")
                .body(Body::from(gzip(&vec![b' '; 1_000_000])))
                .unwrap(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "larger than",
        ),
        (
            "broken gzip",
            req("POST", "/eureka/apps/ORDERS")
                .header("content-type", "application/json")
                .header("content-encoding", "gzip")
                .body(Body::from("nope"))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "gzip",
        ),
        (
            "unknown status value",
            req("PUT", "/eureka/apps/ORDERS/o-1/status?value=up")
                .body(Body::empty())
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "unknown status \"up\"",
        ),
        (
            "missing status value",
            req("PUT", "/eureka/apps/ORDERS/o-1/status")
                .body(Body::empty())
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "`value`",
        ),
        (
            "bad overriddenstatus from a peer",
            req("PUT", "/eureka/apps/ORDERS/o-1?overriddenstatus=NOPE")
                .header("x-netflix-discovery-replication", "true")
                .body(Body::empty())
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "unknown status",
        ),
        (
            "bad dirty timestamp",
            req("PUT", "/eureka/apps/ORDERS/o-1?lastDirtyTimestamp=soon")
                .body(Body::empty())
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "lastDirtyTimestamp",
        ),
        (
            "unknown path",
            req("GET", "/eureka/apps/ORDERS/o-1/nope").body(Body::empty()).unwrap(),
            StatusCode::NOT_FOUND,
            "no Eureka endpoint",
        ),
        (
            "unknown method",
            req("PATCH", "/eureka/apps/ORDERS").body(Body::empty()).unwrap(),
            StatusCode::METHOD_NOT_ALLOWED,
            "PATCH",
        ),
        (
            "POST to apps",
            req("POST", "/eureka/apps").body(Body::empty()).unwrap(),
            StatusCode::METHOD_NOT_ALLOWED,
            "POST",
        ),
        (
            "unacceptable type",
            req("GET", "/eureka/apps")
                .header("accept", "text/html")
                .body(Body::empty())
                .unwrap(),
            StatusCode::NOT_ACCEPTABLE,
            "application/json",
        ),
        (
            "malformed batch",
            req("POST", "/eureka/peerreplication/batch")
                .header("content-type", "application/json")
                .body(Body::from("[1,2]"))
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "replicationList",
        ),
        (
            "ASG status",
            req("PUT", "/eureka/asg/my-asg/status?value=ENABLED")
                .body(Body::empty())
                .unwrap(),
            StatusCode::BAD_REQUEST,
            "AWS",
        ),
    ];
    for (name, request, status, message) in cases {
        let r = call(&app, request).await;
        assert_eq!(r.status, status, "{name}: {}", r.text());
        assert!(
            r.text().contains(message),
            "{name}: {:?} does not contain {message:?}",
            r.text()
        );
    }
    let r = call(&app, req("PATCH", "/eureka/apps/ORDERS").body(Body::empty()).unwrap()).await;
    let allow = r.headers.get(header::ALLOW).unwrap().to_str().unwrap().to_string();
    let mut allow: Vec<&str> = allow.split(',').map(str::trim).collect();
    allow.sort();
    assert_eq!(allow, ["GET", "HEAD", "POST"]);
    let r = call(&app, json("{")).await;
    assert_eq!(r.content_type(), Some("application/json"));
    assert_eq!(r.json()["error"], "cannot parse request body");
    let r = call(&app, xml("<")).await;
    assert!(
        r.text()
            .starts_with("<error><message>cannot parse request body</message>")
    );

    let after = state.with_registry(|r, _| (r.version(), r.full_view()));
    assert_eq!(before, after, "the registry is unchanged");
    let r = call(&app, req("GET", "/eureka/apps/ORDERS/o-1").body(Body::empty()).unwrap()).await;
    assert_eq!(r.status, StatusCode::OK, "still serving");
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

#[tokio::test]
async fn peer_batch_dispatches_each_action() {
    let (app, _) = app();
    register(&app, "ORDERS", "o-1").await;
    let batch = serde_json::json!({"replicationList": [
        {"appName": "BILLING", "id": "b-1", "lastDirtyTimestamp": 5, "status": "UP",
         "instanceInfo": serde_json::from_str::<Value>(&instance_json("BILLING", "b-1")).unwrap()["instance"],
         "action": "Register"},
        {"appName": "ORDERS", "id": "o-1", "lastDirtyTimestamp": 1000, "status": "UP", "action": "Heartbeat"},
        {"appName": "ORDERS", "id": "o-1", "lastDirtyTimestamp": 1, "status": "UP", "action": "Heartbeat"},
        {"appName": "ORDERS", "id": "nope", "action": "Heartbeat"},
        {"appName": "ORDERS", "id": "o-1", "lastDirtyTimestamp": 1000, "status": "OUT_OF_SERVICE", "action": "StatusUpdate"},
        {"appName": "ORDERS", "id": "o-1", "lastDirtyTimestamp": 1000, "status": "sideways", "action": "StatusUpdate"},
        {"appName": "ORDERS", "id": "o-1", "lastDirtyTimestamp": 1000, "status": "UP", "action": "DeleteStatusOverride"},
        {"appName": "BILLING", "id": "b-1", "action": "Cancel"},
        {"appName": "BILLING", "id": "b-1", "action": "Cancel"}
    ]});
    let r = call(
        &app,
        req("POST", "/eureka/peerreplication/batch/")
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(Body::from(batch.to_string()))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    let codes: Vec<u64> = v["responseList"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["statusCode"].as_u64().unwrap())
        .collect();
    assert_eq!(codes, vec![200, 200, 409, 404, 200, 500, 200, 200, 404]);
    assert_eq!(
        v["responseList"][2]["responseEntity"]["instanceId"], "o-1",
        "409 carries our copy"
    );
    let r = call(
        &app,
        req("GET", "/eureka/apps/ORDERS/o-1")
            .header("accept", "application/json")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.json()["instance"]["status"], "UP");
    // One malformed item fails the whole batch, as Java's Jackson reader does.
    let r = call(
        &app,
        req("POST", "/eureka/peerreplication/batch")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"replicationList":[{"action":"Teleport"}]}"#))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text().contains("unknown replication action"));
}

#[tokio::test]
async fn basic_auth_guards_the_api_and_the_dashboard() {
    let access = auth::configure((Some("eureka"), Some("pw"), None), (None, None, None), None).unwrap();
    let (app, _) = app_with(false, access);
    for uri in ["/eureka/apps", "/", "/lastn"] {
        let r = call(&app, req("GET", uri).body(Body::empty()).unwrap()).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{uri}");
        assert_eq!(
            r.headers.get(header::WWW_AUTHENTICATE).unwrap(),
            "Basic realm=\"eureka\""
        );
    }
    let token = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("eureka:pw")
    );
    let r = call(
        &app,
        req("GET", "/eureka/apps")
            .header("authorization", &token)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    // No CSRF token is needed to write (the Spring Security trap).
    let r = call(
        &app,
        req("POST", "/eureka/apps/ORDERS")
            .header("authorization", &token)
            .header("content-type", "application/json")
            .body(Body::from(instance_json("ORDERS", "o-1")))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let r = call(
        &app,
        req("GET", "/")
            .header("authorization", &token)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert!(r.text().contains("ORDERS"));
}

fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

#[tokio::test]
async fn only_the_peer_credentials_may_replicate() {
    let access = auth::configure((Some("app"), Some("a"), None), (Some("peer"), Some("p"), None), None).unwrap();
    let (app, state) = app_with(false, access);
    let (client, peer) = (basic("app", "a"), basic("peer", "p"));
    let register = |token: &str, marker: Option<(&'static str, &'static str)>, id: &str| {
        let mut b = req("POST", "/eureka/apps/ORDERS")
            .header("authorization", token)
            .header("content-type", "application/json");
        if let Some((k, v)) = marker {
            b = b.header(k, v);
        }
        b.body(Body::from(instance_json("ORDERS", id))).unwrap()
    };
    // A client may register, but not pretend to be a peer with either marker.
    assert_eq!(
        call(&app, register(&client, None, "c-1")).await.status,
        StatusCode::NO_CONTENT
    );
    for marker in [
        ("x-netflix-discovery-replication", "true"),
        ("x-eureka-operator-replica", "r-1"),
    ] {
        let r = call(&app, register(&client, Some(marker), "forged")).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{marker:?}");
        assert!(r.text().contains("peer credentials"), "{}", r.text());
    }
    let batch = |token: &str| {
        req("POST", "/eureka/peerreplication/batch/")
            .header("authorization", token)
            .header("content-type", "application/json")
            .body(Body::from(
                r#"{"replicationList":[{"appName":"ORDERS","id":"c-1","action":"Cancel"}]}"#,
            ))
            .unwrap()
    };
    assert_eq!(call(&app, batch(&client)).await.status, StatusCode::FORBIDDEN);
    assert!(
        state.with_registry(|r, _| r.contains("ORDERS", "c-1")),
        "nothing changed"
    );
    // The peer credentials may.
    let r = call(
        &app,
        register(&peer, Some(("x-netflix-discovery-replication", "true")), "p-1"),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(call(&app, batch(&peer)).await.status, StatusCode::OK);
    assert!(!state.with_registry(|r, _| r.contains("ORDERS", "c-1")));
}

#[tokio::test]
async fn an_incomplete_registry_answers_fetches_with_503_and_takes_writes() {
    let health = Health::new(Arc::new(std::sync::atomic::AtomicBool::new(true)));
    let pods = health.condition("EurekaApps reconciled");
    let (app, _) = app_full(false, None, health, Metrics::new());
    assert_eq!(register(&app, "ORDERS", "o-1").await.status, StatusCode::NO_CONTENT);
    for uri in [
        "/eureka/apps",
        "/eureka/apps/delta",
        "/eureka/v2/apps/ORDERS",
        "/eureka/apps/ORDERS/o-1",
        "/eureka/instances/o-1",
        "/eureka/vips/orders",
        "/eureka/svips/orders",
    ] {
        let r = call(&app, req("GET", uri).body(Body::empty()).unwrap()).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{uri}");
        assert_eq!(r.headers.get(header::RETRY_AFTER).unwrap(), "1");
    }
    pods.met();
    let r = call(&app, req("GET", "/eureka/apps").body(Body::empty()).unwrap()).await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn dashboard_and_status_render() {
    let (app, _) = app();
    register(&app, "ORDERS", "o-1").await;
    let r = call(&app, req("GET", "/").body(Body::empty()).unwrap()).await;
    assert_eq!(r.content_type(), Some("text/html; charset=utf-8"));
    let page = r.text();
    assert!(
        page.contains("Renews threshold") && page.contains("ORDERS") && page.contains("UP (1)"),
        "{page}"
    );
    let r = call(&app, req("GET", "/lastn").body(Body::empty()).unwrap()).await;
    assert!(r.text().contains("ORDERS(o-1)"));
    let r = call(
        &app,
        req("GET", "/eureka/status")
            .header("accept", "application/json")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.json()["instanceInfo"]["instanceId"], "test-1");
    assert!(r.json()["generalStats"]["num-of-cpus"].is_string());
    let r = call(&app, req("GET", "/eureka/v2/status").body(Body::empty()).unwrap()).await;
    assert!(
        r.text()
            .starts_with("<com.netflix.eureka.util.StatusInfo><generalStats><num-of-cpus>")
    );
}

#[tokio::test]
async fn request_metrics_have_bounded_labels_whatever_the_method_and_path() {
    let health = Health::new(Arc::new(std::sync::atomic::AtomicBool::new(true)));
    let metrics = Metrics::new();
    let (app, _) = app_full(false, None, health, metrics.clone());
    // Made-up methods on a route and off any route, then two ordinary requests.
    for (method, uri) in [
        ("BREW", "/eureka/apps"),
        ("XYZZY", "/eureka/v2/apps/ORDERS"),
        ("BREW", "/nowhere/at/all"),
    ] {
        let r = call(&app, req(method, uri).body(Body::empty()).unwrap()).await;
        assert!(r.status.is_client_error(), "{method} {uri}: {}", r.status);
    }
    for (method, uri, status) in [
        ("GET", "/eureka/v2/apps", StatusCode::OK),
        ("PUT", "/eureka/apps/ORDERS/o-1?status=UP", StatusCode::NOT_FOUND),
    ] {
        let r = call(&app, req(method, uri).body(Body::empty()).unwrap()).await;
        assert_eq!(r.status, status, "{method} {uri}");
    }
    let text = metrics.encode();
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("eureka_http_request_duration_seconds_count"))
        .collect();
    for l in &series {
        assert!(
            !l.contains("BREW") && !l.contains("XYZZY"),
            "a client-chosen method names a series: {l}"
        );
    }
    let expected = [
        ("apps", "OTHER", 405),
        ("unknown", "OTHER", 404),
        // Both prefixes record under the same endpoint names.
        ("apps", "GET", 200),
        ("instance", "PUT", 404),
    ];
    for (endpoint, method, status) in expected {
        let labels = [
            format!("endpoint=\"{endpoint}\""),
            format!("method=\"{method}\""),
            format!("status=\"{status}\""),
        ];
        assert!(
            series.iter().any(|l| labels.iter().all(|x| l.contains(x.as_str()))),
            "no series with {labels:?}: {series:#?}"
        );
    }
}

/// Plain heartbeat paths are answered in front of the router (`api::heartbeat`); the same
/// heartbeat spelled so that the router must decode or normalise it goes through the routed
/// handler. Both must answer alike, auth included, and record alike.
#[tokio::test]
async fn heartbeats_answer_alike_in_front_of_the_router_and_through_it() {
    let (client, peer) = (basic("app", "a"), basic("peer", "p"));
    // (application, credentials, as a Java peer, query, answer)
    let cases: [(&str, Option<&str>, bool, &str, StatusCode); 8] = [
        ("ORDERS", None, false, "", StatusCode::UNAUTHORIZED),
        (
            "ORDERS",
            Some(&client),
            false,
            "?status=UP&lastDirtyTimestamp=1000",
            StatusCode::OK,
        ),
        ("orders", Some(&client), false, "", StatusCode::OK),
        (
            "ORDERS",
            Some(&client),
            false,
            "?lastDirtyTimestamp=soon",
            StatusCode::BAD_REQUEST,
        ),
        (
            "BILLING",
            Some(&client),
            false,
            "?lastDirtyTimestamp=soon",
            StatusCode::NOT_FOUND,
        ),
        ("ORDERS", Some(&client), true, "", StatusCode::FORBIDDEN),
        (
            "ORDERS",
            Some(&peer),
            true,
            "?lastDirtyTimestamp=500",
            StatusCode::CONFLICT,
        ),
        (
            "ORDERS",
            Some(&client),
            false,
            "?lastDirtyTimestamp=2000",
            StatusCode::NOT_FOUND,
        ),
    ];
    // Each spelling on a server of its own, so that their metrics can be compared.
    let mut recorded = Vec::new();
    for spell in [
        |app: &str| format!("/eureka/apps/{app}/o-1"),
        |app: &str| format!("/eureka/v2/apps/{app}/o-1"),
        |app: &str| format!("/eureka/apps/{app}/o-1/"),
        |app: &str| format!("/eureka/v2/apps/{app}/o%2D1"),
    ] {
        let access = auth::configure((Some("app"), Some("a"), None), (Some("peer"), Some("p"), None), None).unwrap();
        let health = Health::new(Arc::new(std::sync::atomic::AtomicBool::new(true)));
        let metrics = Metrics::new();
        let (app, state) = app_full(false, access, health, metrics.clone());
        let r = call(
            &app,
            req("POST", "/eureka/apps/ORDERS")
                .header("authorization", &client)
                .header("content-type", "application/json")
                .body(Body::from(instance_json("ORDERS", "o-1")))
                .unwrap(),
        )
        .await;
        assert_eq!(r.status, StatusCode::NO_CONTENT);
        let renewals = || state.with_registry(|r, now| r.instance("ORDERS", "o-1", now).unwrap().lease.last_renewal_ts);
        for (name, token, peer, query, status) in cases {
            let uri = format!("{}{query}", spell(name));
            let mut b = req("PUT", &uri).header("accept", "application/json");
            if let Some(t) = token {
                b = b.header("authorization", t);
            }
            if peer {
                b = b.header("x-netflix-discovery-replication", "true");
            }
            let r = call(&app, b.body(Body::empty()).unwrap()).await;
            assert_eq!(r.status, status, "PUT {uri} with {token:?}, peer {peer}: {}", r.text());
            if status == StatusCode::CONFLICT {
                // Java's answer to a stale peer: the instance as stored.
                assert_eq!(r.json()["instance"]["lastDirtyTimestamp"], "1000", "{uri}");
            }
        }
        assert!(renewals() > 0, "the heartbeats renewed the lease");
        let mut series: Vec<String> = metrics
            .encode()
            .lines()
            .filter(|l| {
                l.starts_with("eureka_http_request_duration_seconds_count") && l.contains("endpoint=\"instance\"")
            })
            .map(str::to_string)
            .collect();
        series.sort();
        recorded.push(series);
    }
    assert!(!recorded[0].is_empty());
    for other in &recorded[1..] {
        assert_eq!(&recorded[0], other, "each spelling records the same requests");
    }
}
