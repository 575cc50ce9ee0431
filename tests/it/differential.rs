//! Differential test: one scripted sequence of Eureka HTTP requests is replayed against the real
//! Spring Cloud Netflix Eureka server (Java, on 127.0.0.2) and against ours (127.0.0.3), and every
//! answer is compared: status, `Content-Type` media type, `Content-Encoding`, body presence, and
//! the JSON/XML body as a tree after normalising what legitimately differs:
//!
//! * timestamps made during the run become the step that made them (`<step 12>`, or
//!   `<step 12 + 90s>` for Java's renewal-plus-duration `lastRenewalTimestamp`), so a server that
//!   stamps a change at a different step still differs; 0 and scripted values are kept;
//! * `versions__delta` of `apps/delta`;
//! * the order of applications, instances, object keys and XML elements, and XML whitespace.
//!
//! Every difference must be listed in [`ALLOWED`] with the reason it is deliberate; anything else
//! fails the test. The script covers every endpoint of spec section 2 under `/eureka/` and
//! `/eureka/v2/`: registrations (JSON, XML, Amazon) and their failures, reads, renewals with
//! lastDirtyTimestamp arbitration, status overrides, metadata, the replication batch, cancels,
//! ASG/status/serverinfo, unknown paths and wrong methods, then the final state, then probes
//! that may leave the two registries different.
//!
//! Requests go through a raw HTTP/1.1 client so that exactly the scripted headers are sent (no
//! implicit `Accept` or `Accept-Encoding`) and paths keep their percent-encoding. Set
//! `EUREKA_DIFFERENTIAL_DUMP=<dir>` to keep every raw answer.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Read,
    net::{Ipv4Addr, SocketAddr},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::common::eureka::{JavaServer, Server, spring_instance};
use quick_xml::events::Event;
use serde_json::{Map, Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

// === the allow-list ===

/// Differences that are deliberate: (step name, what differs, why). "What" is the kind of
/// difference (`status`, `content-type`, `content-encoding`, `body-presence` or `body`), for a
/// body optionally narrowed to a path: `body /instance/actionType` covers only differences at
/// that path (and below it).
const ALLOWED: &[(&str, &str, &str)] = &[
    // Bodiless 404s: Spring Boot turns Jersey's empty 404 into its JSON error document; we keep
    // Netflix's empty answer (spec 3.12 and 10: Jersey clients read any heartbeat body as an
    // instance, Netflix#1515, spring-cloud-netflix#4220).
    ("get-app-unknown-json", "content-type", EMPTY_404),
    ("get-app-unknown-json", "body-presence", EMPTY_404),
    ("get-app-unknown-xml-v2", "content-type", EMPTY_404),
    ("get-app-unknown-xml-v2", "body-presence", EMPTY_404),
    ("get-instance-unknown", "content-type", EMPTY_404),
    ("get-instance-unknown", "body-presence", EMPTY_404),
    ("get-instance-wrong-app", "content-type", EMPTY_404),
    ("get-instance-wrong-app", "body-presence", EMPTY_404),
    ("get-instances-by-id-unknown", "content-type", EMPTY_404),
    ("get-instances-by-id-unknown", "body-presence", EMPTY_404),
    ("renew-unknown-instance", "content-type", EMPTY_404),
    ("renew-unknown-instance", "body-presence", EMPTY_404),
    ("renew-unknown-app", "content-type", EMPTY_404),
    ("renew-unknown-app", "body-presence", EMPTY_404),
    ("renew-newer-dirty", "content-type", EMPTY_404),
    ("renew-newer-dirty", "body-presence", EMPTY_404),
    ("renew-newer-dirty-replication-with-override", "content-type", EMPTY_404),
    (
        "renew-newer-dirty-replication-with-override",
        "body-presence",
        EMPTY_404,
    ),
    ("renew-after-delete-without-value", "content-type", EMPTY_404),
    ("renew-after-delete-without-value", "body-presence", EMPTY_404),
    ("status-put-unknown-instance", "content-type", EMPTY_404),
    ("status-put-unknown-instance", "body-presence", EMPTY_404),
    ("status-delete-unknown-instance", "content-type", EMPTY_404),
    ("status-delete-unknown-instance", "body-presence", EMPTY_404),
    ("metadata-put-unknown", "content-type", EMPTY_404),
    ("metadata-put-unknown", "body-presence", EMPTY_404),
    ("cancel-again", "content-type", EMPTY_404),
    ("cancel-again", "body-presence", EMPTY_404),
    ("cancel-unknown-app", "content-type", EMPTY_404),
    ("cancel-unknown-app", "body-presence", EMPTY_404),
    ("get-app-after-last-cancel", "content-type", EMPTY_404),
    ("get-app-after-last-cancel", "body-presence", EMPTY_404),
    ("get-instance-after-cancel", "content-type", EMPTY_404),
    ("get-instance-after-cancel", "body-presence", EMPTY_404),
    // Unknown paths: a short text body instead of Spring Boot's JSON error document.
    ("serverinfo-statusoverrides", "content-type", NO_ROUTE),
    ("serverinfo-statusoverrides", "body", NO_ROUTE),
    ("unknown-path", "content-type", NO_ROUTE),
    ("unknown-path", "body", NO_ROUTE),
    ("unknown-path-json", "content-type", NO_ROUTE),
    ("unknown-path-json", "body", NO_ROUTE),
    ("unknown-path-v1", "content-type", NO_ROUTE),
    ("unknown-path-v1", "body", NO_ROUTE),
    ("unknown-path-deep", "content-type", NO_ROUTE),
    ("unknown-path-deep", "body", NO_ROUTE),
    ("unknown-path-outside-eureka", "content-type", NO_ROUTE),
    ("unknown-path-outside-eureka", "body", NO_ROUTE),
    // Other 4xx without an entity in Jersey: Spring Boot renders its error document (JSON, or
    // its Whitelabel HTML page for `Accept: text/html`); we answer a short text message.
    ("method-post-apps", "content-type", BOOT_4XX),
    ("method-post-apps", "body", BOOT_4XX),
    ("method-delete-app", "content-type", BOOT_4XX),
    ("method-delete-app", "body", BOOT_4XX),
    ("method-get-status", "content-type", BOOT_4XX),
    ("method-get-status", "body", BOOT_4XX),
    ("method-get-metadata", "content-type", BOOT_4XX),
    ("method-get-metadata", "body", BOOT_4XX),
    ("method-get-batch", "content-type", BOOT_4XX),
    ("method-get-batch", "body", BOOT_4XX),
    ("method-post-instance", "content-type", BOOT_4XX),
    ("method-post-instance", "body", BOOT_4XX),
    ("method-put-vips", "content-type", BOOT_4XX),
    ("method-put-vips", "body", BOOT_4XX),
    ("method-delete-delta", "content-type", BOOT_4XX),
    ("method-delete-delta", "body", BOOT_4XX),
    ("register-unsupported-media-type", "content-type", BOOT_4XX),
    ("register-unsupported-media-type", "body", BOOT_4XX),
    ("get-apps-accept-html", "content-type", BOOT_4XX),
    ("get-apps-accept-html", "body", BOOT_4XX),
    ("asg-status", "content-type", BOOT_4XX),
    ("asg-status", "body", BOOT_4XX),
    ("asg-status-v2", "content-type", BOOT_4XX),
    ("asg-status-v2", "body", BOOT_4XX),
    // Decode failures: Java's `{"error": "cannot parse request body"}` (or its XML form) plus
    // our `detail` saying what is wrong.
    ("register-datacenter-without-class", "body", DETAIL),
    ("register-port-as-number", "body", DETAIL),
    ("register-unwrapped-json", "body", DETAIL),
    ("register-unparseable-json", "body", DETAIL),
    ("register-unparseable-xml", "body", DETAIL),
    ("register-empty-json-body", "body", DETAIL),
    ("batch-unparseable", "body", DETAIL),
    // Java fails with an unhandled exception (500 + Spring Boot's error document) on a status
    // that is not an exact enum name (or missing), or a lastDirtyTimestamp that is not a number;
    // we answer 400 with a message saying what is wrong.
    ("renew-bad-timestamp", "status", BAD_PARAM),
    ("renew-bad-timestamp", "content-type", BAD_PARAM),
    ("renew-bad-timestamp", "body", BAD_PARAM),
    ("status-put-missing-value", "status", BAD_PARAM),
    ("status-put-missing-value", "content-type", BAD_PARAM),
    ("status-put-missing-value", "body", BAD_PARAM),
    ("status-put-lowercase-value", "status", BAD_PARAM),
    ("status-put-lowercase-value", "content-type", BAD_PARAM),
    ("status-put-lowercase-value", "body", BAD_PARAM),
    ("status-delete-bad-value", "status", BAD_PARAM),
    ("status-delete-bad-value", "content-type", BAD_PARAM),
    ("status-delete-bad-value", "body", BAD_PARAM),
    ("status-put-bad-timestamp-changing-status", "status", BAD_PARAM),
    ("status-put-bad-timestamp-changing-status", "content-type", BAD_PARAM),
    ("status-put-bad-timestamp-changing-status", "body", BAD_PARAM),
    // Java corrects a status at renewal silently (no delta entry, no lastUpdatedTimestamp);
    // ours records the correction as a MODIFIED change so that clients' delta-merged registries
    // keep matching apps__hashcode (src/registry.rs, `renew`).
    (
        "get-instance-after-override-renew",
        "body /instance/actionType",
        RENEW_CORRECTION,
    ),
    (
        "get-instance-after-override-renew",
        "body /instance/lastUpdatedTimestamp",
        RENEW_CORRECTION,
    ),
    (
        "get-delta-after-status-changes",
        "body /applications/application[BILLING]/instance[billing-2]/actionType",
        RENEW_CORRECTION,
    ),
    (
        "get-delta-after-status-changes",
        "body /applications/application[BILLING]/instance[billing-2]/lastUpdatedTimestamp",
        RENEW_CORRECTION,
    ),
    // Spec 10: Java's JSON `GET status` fails (500, `isHealthy` is null by default); we return a
    // valid document.
    (
        "server-status-json-v2",
        "status",
        "spec 10: JSON /status is broken in Java (500); ours returns a valid document",
    ),
    (
        "server-status-json-v2",
        "body",
        "spec 10: JSON /status is broken in Java (500); ours returns a valid document",
    ),
    // The same 404s with a Spring Boot error document on Java's side.
    ("renew-unknown-instance-bad-timestamp", "content-type", EMPTY_404),
    ("renew-unknown-instance-bad-timestamp", "body-presence", EMPTY_404),
    ("status-put-unknown-instance-bad-value", "content-type", EMPTY_404),
    ("status-put-unknown-instance-bad-value", "body-presence", EMPTY_404),
    ("batch-unknown-action", "body", DETAIL),
    // Jersey labels a JSON payload `application/xml` when Accept lists XML first; ours labels
    // what it sends (the payload, JSON because Accept mentions JSON, is the same).
    (
        "get-apps-accept-xml-and-json",
        "content-type",
        "our design: the Content-Type names the payload's real format (Jersey mislabels JSON as XML here)",
    ),
    // Java answers a batch without Accept in XStream XML with Java class names; Java peers always
    // send `Accept: application/json`, and ours always answers JSON.
    ("batch-no-accept", "content-type", BATCH_JSON),
    ("batch-no-accept", "body", BATCH_JSON),
    // The status document has Java's shape; its values describe each server (host, memory, the
    // server's own instance) and cannot match.
    (
        "server-status-xml",
        "body",
        "per-server values: host, port, memory, uptime and the server's own instance differ by nature",
    ),
    // Java's AmazonInfo reader is order-sensitive (`metadata` must follow `name`, Netflix#1310);
    // ours reads the keys in any order.
    // Lease timestamps of an application that did not change since step 13.
    (
        "final-apps-json",
        "body /applications/application[CHARSET]/instance[cs-1]/leaseInfo/lastRenewalTimestamp",
        FRAGMENTS,
    ),
    (
        "final-apps-xml",
        "body /applications/application[CHARSET]/instance/leaseInfo/lastRenewalTimestamp",
        FRAGMENTS,
    ),
    (
        "final-apps-gzip-json",
        "body /applications/application[CHARSET]/instance[cs-1]/leaseInfo/lastRenewalTimestamp",
        FRAGMENTS,
    ),
    // The same for an application's part of the delta, cached until that part changes.
    (
        "get-delta-after-status-changes",
        "body /applications/application[AMZN]/instance[amzn-1]/leaseInfo/lastRenewalTimestamp",
        FRAGMENTS,
    ),
    (
        "get-delta-after-status-changes",
        "body /applications/application[CHARSET]/instance[cs-1]/leaseInfo/lastRenewalTimestamp",
        FRAGMENTS,
    ),
    (
        "get-delta-after-status-changes",
        "body /applications/application[START]/instance[start-1]/leaseInfo/lastRenewalTimestamp",
        FRAGMENTS,
    ),
    (
        "final-delta-json",
        "body /applications/application[CHARSET]/instance[cs-1]/leaseInfo/lastRenewalTimestamp",
        FRAGMENTS,
    ),
    (
        "final-delta-xml",
        "body /applications/application[CHARSET]/instance/leaseInfo/lastRenewalTimestamp",
        FRAGMENTS,
    ),
    // A changed application's lease timestamps as of the write that changed it: the payload,
    // read a moment before, was built again right after that write, before the renewal Java's
    // first read after it shows.
    (
        "get-delta-after-status-changes",
        "body /applications/application[BILLING]/instance[billing-1]/leaseInfo/lastRenewalTimestamp",
        BUILT_AHEAD,
    ),
    (
        "final-delta-json",
        "body /applications/application[REPL]/instance[repl-1]/leaseInfo/lastRenewalTimestamp",
        BUILT_AHEAD,
    ),
    (
        "final-delta-xml",
        "body /applications/application[REPL]/instance/leaseInfo/lastRenewalTimestamp",
        BUILT_AHEAD,
    ),
    (
        "final-apps-json",
        "body /applications/application[REPL]/instance[repl-1]/leaseInfo/lastRenewalTimestamp",
        BUILT_AHEAD,
    ),
    (
        "final-apps-xml",
        "body /applications/application[REPL]/instance/leaseInfo/lastRenewalTimestamp",
        BUILT_AHEAD,
    ),
    (
        "final-apps-gzip-json",
        "body /applications/application[REPL]/instance[repl-1]/leaseInfo/lastRenewalTimestamp",
        BUILT_AHEAD,
    ),
    ("register-json-amazon-metadata-before-name", "status", LENIENT_AMAZON),
    (
        "register-json-amazon-metadata-before-name",
        "content-type",
        LENIENT_AMAZON,
    ),
    (
        "register-json-amazon-metadata-before-name",
        "body-presence",
        LENIENT_AMAZON,
    ),
];

const FRAGMENTS: &str = "our design: an application's encoding (in the full registry and in the delta) is reused until it changes (at most 180 s, Java's responseCacheAutoExpirationInSeconds), so its lease timestamps are as of its last change; Java re-encodes everything after any change";
const BUILT_AHEAD: &str = "our design: a full or delta payload read in the last 5 s is built again right after a write changes the registry (--response-cache-build-ahead-ms), so the changed application's lease timestamps are as of that write; Java encodes at the first read after it";
const BATCH_JSON: &str = "our design: the replication batch is answered in JSON, the protocol's format";
const LENIENT_AMAZON: &str =
    "our design: dataCenterInfo keys are read in any order (Java 400s when metadata precedes name, Netflix#1310)";

const RENEW_CORRECTION: &str =
    "our design: a status corrected at renewal is a MODIFIED change (delta entry, lastUpdatedTimestamp)";
const EMPTY_404: &str = "spec 3.12/10: 404 without body or Content-Type (Spring Boot adds its JSON error document)";
const NO_ROUTE: &str =
    "our design: 404 for an unknown path carries a short text body (Spring Boot: JSON error document)";
const BOOT_4XX: &str =
    "our design: a short text message instead of Spring Boot's error document for a bodiless Jersey 4xx";
const DETAIL: &str = "our design: decode-failure 400 bodies add a `detail` field to Java's `cannot parse request body`";
const BAD_PARAM: &str =
    "our design: 400 with a message where Java throws (500) on a bad status value or lastDirtyTimestamp";

// === the script ===

const E: &str = "/eureka";
const V2: &str = "/eureka/v2";

const JSON_ACCEPT: (&str, &str) = ("Accept", "application/json");
const JSON_TYPE: (&str, &str) = ("Content-Type", "application/json");
const XML_TYPE: (&str, &str) = ("Content-Type", "application/xml");
const GZIP: (&str, &str) = ("Accept-Encoding", "gzip");
const REPLICATION: (&str, &str) = ("x-netflix-discovery-replication", "true");

/// One scripted request.
struct Step {
    name: String,
    method: &'static str,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

#[derive(Default)]
struct Script {
    steps: Vec<Step>,
}

impl Script {
    fn add(
        &mut self,
        name: &str,
        method: &'static str,
        path: String,
        headers: &[(&str, &str)],
        body: impl Into<Vec<u8>>,
    ) {
        assert!(self.steps.iter().all(|s| s.name != name), "duplicate step name {name}");
        self.steps.push(Step {
            name: name.to_string(),
            method,
            path,
            headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            body: body.into(),
        });
    }

    fn get(&mut self, name: &str, path: String, headers: &[(&str, &str)]) {
        self.add(name, "GET", path, headers, Vec::new());
    }

    fn put(&mut self, name: &str, path: String, headers: &[(&str, &str)]) {
        self.add(name, "PUT", path, headers, Vec::new());
    }

    fn delete(&mut self, name: &str, path: String, headers: &[(&str, &str)]) {
        self.add(name, "DELETE", path, headers, Vec::new());
    }

    fn post_json(&mut self, name: &str, path: String, body: &Value) {
        self.add(name, "POST", path, &[JSON_TYPE, JSON_ACCEPT], body.to_string());
    }

    fn post_xml(&mut self, name: &str, path: String, body: &str) {
        self.add(name, "POST", path, &[XML_TYPE], body.to_string());
    }
}

const MY_OWN: &str = "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo";
const AMAZON: &str = "com.netflix.appinfo.AmazonInfo";
const LDT: i64 = 1_700_000_000_000;
const LDT_OLD: i64 = 1_600_000_000_000;
const LDT_NEW: i64 = 1_800_000_000_000;

fn my_own() -> Value {
    json!({"@class": MY_OWN, "name": "MyOwn"})
}

/// An instance as the Netflix/Jersey clients send it (the server's own JSON codec: strings for
/// the `@Auto` fields).
fn netflix_instance(id: &str, host: &str, app: &str, ip: &str, port: u16, vip: &str, metadata: Value) -> Value {
    json!({
        "instanceId": id,
        "hostName": host,
        "app": app,
        "ipAddr": ip,
        "status": "UP",
        "overriddenStatus": "UNKNOWN",
        "port": {"$": port, "@enabled": "true"},
        "securePort": {"$": 8443, "@enabled": "false"},
        "countryId": 1,
        "dataCenterInfo": my_own(),
        "leaseInfo": {"renewalIntervalInSecs": 30, "durationInSecs": 90},
        "metadata": metadata,
        "homePageUrl": format!("http://{host}:{port}/"),
        "statusPageUrl": format!("http://{host}:{port}/Status"),
        "healthCheckUrl": format!("http://{host}:{port}/healthcheck"),
        "vipAddress": vip,
        "secureVipAddress": format!("{vip}-secure"),
        "isCoordinatingDiscoveryServer": "false",
        "lastUpdatedTimestamp": LDT.to_string(),
        "lastDirtyTimestamp": LDT.to_string(),
        "actionType": "ADDED"
    })
}

/// `{"instance": instance}` with an Amazon `dataCenterInfo` whose keys are in the order Java
/// needs (`@class`, `name`, `metadata`).
fn amazon_body(instance: &Value, metadata: &str) -> String {
    let placeholder = "__DATA_CENTER_INFO__";
    let body = wrap(with(instance.clone(), "dataCenterInfo", json!(placeholder))).to_string();
    body.replace(
        &format!("\"{placeholder}\""),
        &format!(r#"{{"@class":"{AMAZON}","name":"Amazon","metadata":{metadata}}}"#),
    )
}

fn wrap(instance: Value) -> Value {
    json!({ "instance": instance })
}

fn without(mut v: Value, key: &str) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove(key);
    }
    v
}

fn with(mut v: Value, key: &str, value: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.insert(key.to_string(), value);
    }
    v
}

const BILLING_1_XML: &str = r#"<instance>
  <instanceId>billing-1</instanceId>
  <hostName>billing1.local</hostName>
  <app>BILLING</app>
  <ipAddr>10.0.0.7</ipAddr>
  <status>UP</status>
  <overriddenstatus>UNKNOWN</overriddenstatus>
  <port enabled="true">9000</port>
  <securePort enabled="false">443</securePort>
  <countryId>1</countryId>
  <dataCenterInfo class="com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo">
    <name>MyOwn</name>
  </dataCenterInfo>
  <leaseInfo>
    <renewalIntervalInSecs>30</renewalIntervalInSecs>
    <durationInSecs>90</durationInSecs>
  </leaseInfo>
  <metadata>
    <zone>a</zone>
    <management.port>9001</management.port>
    <my__key>x</my__key>
  </metadata>
  <homePageUrl>http://billing1.local:9000/</homePageUrl>
  <statusPageUrl>http://billing1.local:9000/Status</statusPageUrl>
  <healthCheckUrl>http://billing1.local:9000/healthcheck</healthCheckUrl>
  <vipAddress>billing</vipAddress>
  <secureVipAddress>billing-secure</secureVipAddress>
  <isCoordinatingDiscoveryServer>false</isCoordinatingDiscoveryServer>
  <lastUpdatedTimestamp>1700000000000</lastUpdatedTimestamp>
  <lastDirtyTimestamp>1700000000000</lastDirtyTimestamp>
  <actionType>ADDED</actionType>
</instance>"#;

const BILLING_2_XML: &str = r#"<instance>
  <instanceId>billing-2</instanceId>
  <hostName>billing2.local</hostName>
  <app>BILLING</app>
  <ipAddr>10.0.0.8</ipAddr>
  <status>UP</status>
  <port enabled="true">9000</port>
  <dataCenterInfo class="com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo"><name>MyOwn</name></dataCenterInfo>
  <vipAddress>billing</vipAddress>
  <lastDirtyTimestamp>1700000000000</lastDirtyTimestamp>
</instance>"#;

const AMAZON_XML: &str = r#"<instance>
  <instanceId>amzn-xml</instanceId>
  <hostName>amzn-xml.local</hostName>
  <app>AMZN</app>
  <ipAddr>10.0.2.2</ipAddr>
  <status>UP</status>
  <port enabled="true">7001</port>
  <dataCenterInfo class="com.netflix.appinfo.AmazonInfo">
    <name>Amazon</name>
    <metadata>
      <instance-id>i-0def456</instance-id>
      <availability-zone>us-east-1b</availability-zone>
      <local-ipv4>10.0.2.2</local-ipv4>
    </metadata>
  </dataCenterInfo>
  <leaseInfo><renewalIntervalInSecs>30</renewalIntervalInSecs><durationInSecs>120</durationInSecs></leaseInfo>
  <vipAddress>amzn</vipAddress>
  <lastDirtyTimestamp>1700000000000</lastDirtyTimestamp>
</instance>"#;

/// The whole sequence, in order. Both servers receive exactly these requests.
/// The instance id every section uses, raw and percent-encoded, and an id with encoded colons.
const HOST1: &str = "HOST1:orders:8080";
const HOST1_ENC: &str = "HOST1%3Aorders%3A8080";
const PCT_ENC: &str = "host%3Apct%3A8080";

/// The first ORDERS instance, registered first and reused by later sections.
fn orders1() -> Value {
    netflix_instance(
        HOST1,
        "orders1.local",
        "ORDERS",
        "10.0.0.5",
        8080,
        "orders",
        json!({"management.port": "8080", "zone": "a", "my_key": "x", "dollar$key": "y"}),
    )
}

/// The first Amazon-style instance.
fn amzn1() -> Value {
    netflix_instance("amzn-1", "amzn1.local", "AMZN", "10.0.1.1", 7001, "amzn", json!({}))
}

/// The query of a heartbeat at the registrations' dirty timestamp.
fn current_renewal() -> String {
    format!("status=UP&lastDirtyTimestamp={LDT}")
}

/// The script, section by section (each section a function, in the order they run).
fn script() -> Script {
    let mut s = Script::default();
    registrations(&mut s);
    registration_failures(&mut s);
    reads(&mut s);
    renewals(&mut s);
    status_overrides(&mut s);
    metadata(&mut s);
    replication_batches(&mut s);
    cancels(&mut s);
    status_and_the_rest(&mut s);
    unknown_paths_and_methods(&mut s);
    final_state(&mut s);
    probes_that_come_last(&mut s);
    s
}

/// Registrations (endpoint 1).
fn registrations(s: &mut Script) {
    let orders1 = orders1();
    s.post_json("register-json-full", format!("{E}/apps/ORDERS"), &wrap(orders1.clone()));
    s.post_json(
        "register-spring-body-v2-lowercase-path",
        format!("{V2}/apps/orders"),
        &wrap(spring_instance(
            "orders",
            "orders-2",
            "orders2.local",
            "10.0.0.6",
            8081,
            "orders",
            LDT,
        )),
    );
    s.post_xml("register-xml-full", format!("{E}/apps/billing"), BILLING_1_XML);
    s.post_xml(
        "register-xml-minimal-trailing-slash",
        format!("{V2}/apps/BILLING/"),
        BILLING_2_XML,
    );
    // The Amazon codec is order-sensitive: `metadata` must come after `name` (Netflix#1310), and
    // `json!` sorts keys, so these bodies are spliced by hand.
    let amzn1 = amzn1();
    s.add(
        "register-json-amazon",
        "POST",
        format!("{E}/apps/AMZN"),
        &[JSON_TYPE, JSON_ACCEPT],
        amazon_body(
            &amzn1,
            r#"{"instance-id":"i-0abc123","ami-id":"ami-1","instance-type":"t3.small","availability-zone":"us-east-1a","local-ipv4":"10.0.1.1"}"#,
        ),
    );
    let amzn2 = with(without(amzn1.clone(), "instanceId"), "hostName", json!("amzn2.local"));
    s.add(
        "register-json-amazon-id-from-metadata",
        "POST",
        format!("{E}/apps/AMZN"),
        &[JSON_TYPE, JSON_ACCEPT],
        amazon_body(
            &amzn2,
            r#"{"instance-id":"i-0abc999","availability-zone":"us-east-1c"}"#,
        ),
    );
    s.post_xml("register-xml-amazon", format!("{E}/apps/AMZN"), AMAZON_XML);
    s.post_json(
        "register-json-minimal",
        format!("{E}/apps/MINI"),
        &json!({"instance": {"hostName": "mini.local", "app": "MINI", "ipAddr": "10.0.0.9",
                             "dataCenterInfo": my_own()}}),
    );
    s.post_json(
        "register-colon-id",
        format!("{E}/apps/PCT"),
        &wrap(netflix_instance(
            "host:pct:8080",
            "pct.local",
            "PCT",
            "10.0.0.10",
            8080,
            "pct",
            json!({}),
        )),
    );
    let ovr = with(
        netflix_instance("ovr-1", "ovr.local", "OVR", "10.0.0.11", 8080, "ovr", json!({})),
        "overriddenStatus",
        json!("OUT_OF_SERVICE"),
    );
    s.post_json("register-with-overridden-status", format!("{E}/apps/OVR"), &wrap(ovr));
    let starting = with(
        netflix_instance("start-1", "start.local", "START", "10.0.0.12", 8080, "start", json!({})),
        "status",
        json!("STARTING"),
    );
    s.post_json("register-status-starting", format!("{E}/apps/START"), &wrap(starting));
    let stale = with(
        with(orders1.clone(), "lastDirtyTimestamp", json!(LDT_OLD.to_string())),
        "metadata",
        json!({"zone": "stale"}),
    );
    s.post_json("register-stale-reregister", format!("{E}/apps/ORDERS"), &wrap(stale));
    s.add(
        "register-json-charset",
        "POST",
        format!("{E}/apps/CHARSET"),
        &[("Content-Type", "application/json;charset=UTF-8")],
        wrap(netflix_instance(
            "cs-1",
            "cs.local",
            "CHARSET",
            "10.0.0.13",
            8080,
            "cs",
            json!({}),
        ))
        .to_string(),
    );
    s.get("get-apps-json-after-registrations", format!("{E}/apps"), &[JSON_ACCEPT]);
    s.get("get-apps-xml-after-registrations", format!("{E}/apps/"), &[]);
}

/// Registration failures.
fn registration_failures(s: &mut Script) {
    let valid = orders1();
    s.post_json(
        "register-missing-hostname",
        format!("{E}/apps/ORDERS"),
        &wrap(without(valid.clone(), "hostName")),
    );
    s.post_json(
        "register-missing-ip",
        format!("{E}/apps/ORDERS"),
        &wrap(without(valid.clone(), "ipAddr")),
    );
    s.post_json(
        "register-mismatched-app",
        format!("{E}/apps/BILLING"),
        &wrap(valid.clone()),
    );
    s.post_json(
        "register-missing-datacenter",
        format!("{E}/apps/ORDERS"),
        &wrap(without(valid.clone(), "dataCenterInfo")),
    );
    s.post_json(
        "register-datacenter-without-name",
        format!("{E}/apps/ORDERS"),
        &wrap(with(valid.clone(), "dataCenterInfo", json!({"@class": MY_OWN}))),
    );
    s.post_json(
        "register-datacenter-without-class",
        format!("{E}/apps/ORDERS"),
        &wrap(with(valid.clone(), "dataCenterInfo", json!({"name": "MyOwn"}))),
    );
    s.post_json(
        "register-port-as-number",
        format!("{E}/apps/ORDERS"),
        &wrap(with(valid.clone(), "port", json!(8080))),
    );
    s.post_json("register-unwrapped-json", format!("{E}/apps/ORDERS"), &valid);
    s.add(
        "register-unparseable-json",
        "POST",
        format!("{E}/apps/ORDERS"),
        &[JSON_TYPE, JSON_ACCEPT],
        r#"{"instance": {"hostName": "#,
    );
    s.post_xml(
        "register-missing-hostname-xml",
        format!("{E}/apps/BILLING"),
        &BILLING_1_XML.replace("<hostName>billing1.local</hostName>", ""),
    );
    s.post_xml(
        "register-unparseable-xml",
        format!("{V2}/apps/BILLING"),
        "<instance><hostName>x</instance>",
    );
    s.add(
        "register-unsupported-media-type",
        "POST",
        format!("{E}/apps/ORDERS"),
        &[("Content-Type", "text/plain")],
        "hello",
    );
    s.add(
        "register-empty-json-body",
        "POST",
        format!("{E}/apps/ORDERS"),
        &[JSON_TYPE],
        Vec::new(),
    );
}

/// Reads (endpoints 7-13).
fn reads(s: &mut Script) {
    s.get("get-apps-json", format!("{E}/apps"), &[JSON_ACCEPT]);
    s.get("get-apps-xml-no-accept", format!("{E}/apps/"), &[]);
    s.get("get-apps-v2-json-trailing-slash", format!("{V2}/apps/"), &[JSON_ACCEPT]);
    s.get("get-apps-v2-xml", format!("{V2}/apps"), &[]);
    s.get(
        "get-apps-accept-xml",
        format!("{E}/apps/"),
        &[("Accept", "application/xml")],
    );
    s.get("get-apps-accept-any", format!("{E}/apps/"), &[("Accept", "*/*")]);
    s.get(
        "get-apps-accept-xml-and-json",
        format!("{E}/apps/"),
        &[("Accept", "application/xml, application/json")],
    );
    s.get("get-apps-accept-html", format!("{E}/apps/"), &[("Accept", "text/html")]);
    s.get("get-apps-gzip-json", format!("{E}/apps/"), &[JSON_ACCEPT, GZIP]);
    s.get("get-apps-gzip-xml", format!("{V2}/apps/"), &[GZIP]);
    s.get(
        "get-apps-gzip-spring-client",
        format!("{E}/apps/"),
        &[JSON_ACCEPT, JSON_TYPE, ("Accept-Encoding", "gzip, x-gzip, deflate")],
    );
    s.get("get-delta-json", format!("{E}/apps/delta"), &[JSON_ACCEPT]);
    s.get("get-delta-xml-v2-trailing-slash", format!("{V2}/apps/delta/"), &[]);
    s.get("get-delta-gzip-json", format!("{E}/apps/delta"), &[JSON_ACCEPT, GZIP]);
    s.get("get-app-json", format!("{E}/apps/ORDERS"), &[JSON_ACCEPT]);
    s.get("get-app-xml-v2", format!("{V2}/apps/ORDERS"), &[]);
    s.get("get-app-lowercase", format!("{E}/apps/orders"), &[JSON_ACCEPT]);
    s.get("get-app-trailing-slash", format!("{E}/apps/BILLING/"), &[JSON_ACCEPT]);
    s.get(
        "get-app-gzip-not-compressed",
        format!("{E}/apps/AMZN"),
        &[JSON_ACCEPT, GZIP],
    );
    s.get("get-app-amazon-xml", format!("{E}/apps/AMZN"), &[]);
    s.get("get-app-unknown-json", format!("{E}/apps/NOPE"), &[JSON_ACCEPT]);
    s.get("get-app-unknown-xml-v2", format!("{V2}/apps/NOPE"), &[]);
    s.get(
        "get-instance-json-raw-colons",
        format!("{E}/apps/ORDERS/{HOST1}"),
        &[JSON_ACCEPT],
    );
    s.get(
        "get-instance-xml-encoded-v2",
        format!("{V2}/apps/orders/{HOST1_ENC}"),
        &[],
    );
    s.get(
        "get-instance-encoded-json",
        format!("{E}/apps/PCT/{PCT_ENC}"),
        &[JSON_ACCEPT],
    );
    s.get(
        "get-instance-spring-body",
        format!("{E}/apps/ORDERS/orders-2"),
        &[JSON_ACCEPT],
    );
    s.get(
        "get-instance-xml-registered-json",
        format!("{E}/apps/ORDERS/orders-2"),
        &[],
    );
    s.get(
        "get-instance-json-registered-xml",
        format!("{E}/apps/BILLING/billing-1"),
        &[JSON_ACCEPT],
    );
    s.get("get-instance-minimal-xml", format!("{E}/apps/BILLING/billing-2"), &[]);
    s.get(
        "get-instance-minimal-json",
        format!("{E}/apps/MINI/mini.local"),
        &[JSON_ACCEPT],
    );
    s.get(
        "get-instance-amazon-json",
        format!("{E}/apps/AMZN/i-0abc999"),
        &[JSON_ACCEPT],
    );
    s.get("get-instance-amazon-xml", format!("{E}/apps/AMZN/amzn-xml"), &[]);
    s.get(
        "get-instance-overridden-at-register",
        format!("{E}/apps/OVR/ovr-1"),
        &[JSON_ACCEPT],
    );
    s.get(
        "get-instance-starting",
        format!("{E}/apps/START/start-1"),
        &[JSON_ACCEPT],
    );
    s.get(
        "get-instance-trailing-slash",
        format!("{E}/apps/CHARSET/cs-1/"),
        &[JSON_ACCEPT],
    );
    s.get("get-instance-unknown", format!("{E}/apps/ORDERS/nope"), &[JSON_ACCEPT]);
    s.get(
        "get-instance-wrong-app",
        format!("{E}/apps/BILLING/orders-2"),
        &[JSON_ACCEPT],
    );
    s.get(
        "get-instances-by-id-json",
        format!("{E}/instances/orders-2"),
        &[JSON_ACCEPT],
    );
    s.get("get-instances-by-id-xml-v2", format!("{V2}/instances/billing-1"), &[]);
    s.get(
        "get-instances-by-id-encoded",
        format!("{E}/instances/{PCT_ENC}"),
        &[JSON_ACCEPT],
    );
    s.get(
        "get-instances-by-id-unknown",
        format!("{E}/instances/nope"),
        &[JSON_ACCEPT],
    );
    s.get("get-vip-json", format!("{E}/vips/orders"), &[JSON_ACCEPT]);
    s.get("get-vip-xml-v2", format!("{V2}/vips/billing"), &[]);
    s.get("get-vip-case-sensitive", format!("{E}/vips/ORDERS"), &[JSON_ACCEPT]);
    s.get("get-vip-unknown-json", format!("{E}/vips/nope"), &[JSON_ACCEPT]);
    s.get("get-vip-unknown-xml", format!("{E}/vips/nope"), &[]);
    s.get(
        "get-vip-gzip-not-compressed",
        format!("{E}/vips/amzn"),
        &[JSON_ACCEPT, GZIP],
    );
    s.get("get-svip-json", format!("{E}/svips/orders-secure"), &[JSON_ACCEPT]);
    s.get("get-svip-xml-v2", format!("{V2}/svips/billing-secure"), &[]);
    s.get("get-svip-unknown", format!("{E}/svips/nope"), &[JSON_ACCEPT]);
}

/// Renew (endpoint 2).
fn renewals(s: &mut Script) {
    let q = current_renewal();
    s.put("renew-ok", format!("{E}/apps/ORDERS/{HOST1}?{q}"), &[]);
    s.put("renew-no-params-v2", format!("{V2}/apps/ORDERS/orders-2"), &[]);
    s.put("renew-lowercase-encoded", format!("{E}/apps/pct/{PCT_ENC}?{q}"), &[]);
    s.put(
        "renew-spring-style",
        format!("{E}/apps/BILLING/billing-1?{q}"),
        &[JSON_TYPE, JSON_ACCEPT],
    );
    s.add(
        "renew-jersey3-style-body",
        "PUT",
        format!("{E}/apps/AMZN/amzn-1?{q}"),
        &[JSON_TYPE, JSON_ACCEPT],
        "{}",
    );
    s.put("renew-unknown-instance", format!("{E}/apps/ORDERS/nope?{q}"), &[]);
    s.put("renew-unknown-app", format!("{E}/apps/NOAPP/x?status=UP"), &[]);
    s.put(
        "renew-newer-dirty",
        format!("{E}/apps/ORDERS/orders-2?status=UP&lastDirtyTimestamp={LDT_NEW}"),
        &[],
    );
    let old_q = format!("status=UP&lastDirtyTimestamp={LDT_OLD}");
    s.put(
        "renew-older-dirty-client",
        format!("{E}/apps/ORDERS/{HOST1}?{old_q}"),
        &[],
    );
    s.put(
        "renew-older-dirty-replication-xml",
        format!("{E}/apps/ORDERS/{HOST1}?{old_q}"),
        &[REPLICATION],
    );
    s.put(
        "renew-older-dirty-replication-json",
        format!("{E}/apps/ORDERS/{HOST1}?{old_q}"),
        &[REPLICATION, JSON_ACCEPT],
    );
    s.put(
        "renew-older-dirty-replication-header-not-true",
        format!("{E}/apps/ORDERS/{HOST1}?{old_q}"),
        &[("x-netflix-discovery-replication", "yes")],
    );
    s.put(
        "renew-newer-dirty-replication-with-override",
        format!("{E}/apps/BILLING/billing-2?status=UP&lastDirtyTimestamp={LDT_NEW}&overriddenstatus=OUT_OF_SERVICE"),
        &[REPLICATION],
    );
    s.get(
        "get-instance-after-replicated-override",
        format!("{E}/apps/BILLING/billing-2"),
        &[JSON_ACCEPT],
    );
    s.put(
        "renew-applies-override",
        format!("{E}/apps/BILLING/billing-2?status=UP"),
        &[],
    );
    s.get(
        "get-instance-after-override-renew",
        format!("{E}/apps/BILLING/billing-2"),
        &[JSON_ACCEPT],
    );
    s.put(
        "renew-bad-timestamp",
        format!("{E}/apps/ORDERS/{HOST1}?status=UP&lastDirtyTimestamp=abc"),
        &[],
    );
    s.put(
        "renew-unknown-instance-bad-timestamp",
        format!("{E}/apps/ORDERS/nope?status=UP&lastDirtyTimestamp=abc"),
        &[],
    );
    s.put(
        "renew-bogus-overriddenstatus",
        format!("{E}/apps/ORDERS/{HOST1}?{q}&overriddenstatus=bogus"),
        &[],
    );
    s.put("renew-starting", format!("{E}/apps/START/start-1?{q}"), &[]);
    s.put("renew-trailing-slash", format!("{E}/apps/CHARSET/cs-1/?{q}"), &[]);
}

/// Status override (endpoints 4 and 5).
fn status_overrides(s: &mut Script) {
    let status = |id: &str, rest: &str| format!("{E}/apps/ORDERS/{id}/status{rest}");
    s.put(
        "status-put-out-of-service",
        status(HOST1, &format!("?value=OUT_OF_SERVICE&lastDirtyTimestamp={LDT}")),
        &[],
    );
    s.get(
        "get-instance-after-status-put",
        format!("{E}/apps/ORDERS/{HOST1}"),
        &[JSON_ACCEPT],
    );
    s.get("get-app-xml-after-status-put", format!("{V2}/apps/ORDERS"), &[]);
    let q = current_renewal();
    s.put("renew-while-overridden", format!("{E}/apps/ORDERS/{HOST1}?{q}"), &[]);
    s.post_json(
        "reregister-while-overridden",
        format!("{E}/apps/ORDERS"),
        &wrap(orders1()),
    );
    s.get(
        "get-instance-after-reregister-overridden",
        format!("{E}/apps/ORDERS/{HOST1}"),
        &[JSON_ACCEPT],
    );
    s.put("status-put-same-status", status(HOST1, "?value=OUT_OF_SERVICE"), &[]);
    s.put(
        "status-put-spring-style-v2-encoded",
        format!("{V2}/apps/orders/{HOST1_ENC}/status?value=DOWN&lastDirtyTimestamp={LDT}"),
        &[JSON_TYPE, JSON_ACCEPT],
    );
    s.put("status-put-missing-value", status(HOST1, ""), &[]);
    s.put("status-put-lowercase-value", status(HOST1, "?value=down"), &[]);
    // HOST1 is DOWN already: Java parses lastDirtyTimestamp only when the status changes.
    s.put(
        "status-put-bad-timestamp-same-status",
        status(HOST1, "?value=DOWN&lastDirtyTimestamp=abc"),
        &[],
    );
    s.put("status-put-unknown-instance", status("nope", "?value=DOWN"), &[]);
    s.put(
        "status-put-unknown-instance-bad-value",
        status("nope", "?value=bogus"),
        &[],
    );
    s.delete(
        "status-delete-with-value-up",
        status(HOST1, &format!("?value=UP&lastDirtyTimestamp={LDT}")),
        &[],
    );
    s.get(
        "get-instance-after-delete-up",
        format!("{E}/apps/ORDERS/{HOST1}"),
        &[JSON_ACCEPT],
    );
    s.put(
        "status-put-encoded-down",
        format!("{E}/apps/PCT/{PCT_ENC}/status?value=DOWN&lastDirtyTimestamp={LDT}"),
        &[],
    );
    s.delete(
        "status-delete-without-value-v2",
        format!("{V2}/apps/pct/{PCT_ENC}/status?lastDirtyTimestamp={LDT}"),
        &[],
    );
    s.get(
        "get-instance-after-delete-without-value",
        format!("{E}/apps/PCT/{PCT_ENC}"),
        &[JSON_ACCEPT],
    );
    s.put(
        "renew-after-delete-without-value",
        format!("{E}/apps/PCT/{PCT_ENC}?{}", current_renewal()),
        &[],
    );
    s.delete(
        "status-delete-no-override",
        format!("{E}/apps/BILLING/billing-1/status"),
        &[],
    );
    s.delete("status-delete-unknown-instance", status("nope", ""), &[]);
    s.delete(
        "status-delete-bad-value",
        format!("{E}/apps/BILLING/billing-1/status?value=bogus"),
        &[],
    );
    s.get(
        "get-delta-after-status-changes",
        format!("{E}/apps/delta"),
        &[JSON_ACCEPT],
    );
}

/// Metadata (endpoint 6).
fn metadata(s: &mut Script) {
    s.put(
        "metadata-put",
        format!("{E}/apps/BILLING/billing-1/metadata?zone=b&added=yes"),
        &[],
    );
    s.put(
        "metadata-put-on-empty-v2",
        format!("{V2}/apps/billing/billing-2/metadata?k=v&url=http%3A%2F%2Fx%2Fy%3Fa%3D1"),
        &[],
    );
    s.put(
        "metadata-put-unknown",
        format!("{E}/apps/BILLING/nope/metadata?k=v"),
        &[],
    );
    s.get(
        "get-instance-after-metadata-xml",
        format!("{V2}/apps/BILLING/billing-1"),
        &[],
    );
    s.get(
        "get-instance-after-metadata-json",
        format!("{E}/apps/BILLING/billing-2"),
        &[JSON_ACCEPT],
    );
}

/// Peer replication batch (endpoint 14).
fn replication_batches(s: &mut Script) {
    let repl = without(
        netflix_instance(
            "repl-1",
            "repl.local",
            "REPL",
            "10.0.0.20",
            8080,
            "repl",
            json!({"r": "1"}),
        ),
        "actionType",
    );
    let batch = json!({"replicationList": [
        {"appName": "REPL", "id": "repl-1", "lastDirtyTimestamp": LDT, "status": "UP",
         "instanceInfo": repl, "action": "Register"},
        {"appName": "ORDERS", "id": HOST1, "lastDirtyTimestamp": LDT, "status": "UP", "action": "Heartbeat"},
        {"appName": "ORDERS", "id": HOST1, "lastDirtyTimestamp": LDT_OLD, "status": "UP", "action": "Heartbeat"},
        {"appName": "ORDERS", "id": "nope", "lastDirtyTimestamp": LDT, "status": "UP", "action": "Heartbeat"},
        {"appName": "ORDERS", "id": HOST1, "lastDirtyTimestamp": LDT_NEW, "status": "UP", "action": "Heartbeat"},
        {"appName": "REPL", "id": "repl-1", "lastDirtyTimestamp": LDT + 1, "status": "OUT_OF_SERVICE",
         "action": "StatusUpdate"},
        {"appName": "REPL", "id": "nope", "lastDirtyTimestamp": LDT, "status": "DOWN", "action": "StatusUpdate"},
        {"appName": "AMZN", "id": "amzn-1", "lastDirtyTimestamp": LDT, "status": "DOWN", "action": "StatusUpdate"},
        {"appName": "AMZN", "id": "amzn-1", "lastDirtyTimestamp": LDT + 2, "status": "UP",
         "action": "DeleteStatusOverride"},
        {"appName": "ORDERS", "id": "orders-2", "action": "Cancel"},
        {"appName": "ORDERS", "id": "nope", "action": "Cancel"}
    ]});
    s.add(
        "batch-every-action",
        "POST",
        format!("{E}/peerreplication/batch/"),
        &[JSON_TYPE, JSON_ACCEPT, GZIP],
        batch.to_string(),
    );
    s.get("get-app-after-batch-register", format!("{E}/apps/REPL"), &[JSON_ACCEPT]);
    s.get(
        "get-instance-after-batch-override",
        format!("{E}/apps/AMZN/amzn-1"),
        &[JSON_ACCEPT],
    );
    let one = json!({"replicationList": [
        {"appName": "REPL", "id": "repl-1", "lastDirtyTimestamp": LDT + 1, "status": "OUT_OF_SERVICE",
         "overriddenStatus": "OUT_OF_SERVICE", "action": "Heartbeat"}
    ]});
    s.add(
        "batch-v2-no-trailing-slash",
        "POST",
        format!("{V2}/peerreplication/batch"),
        &[JSON_TYPE, JSON_ACCEPT],
        one.to_string(),
    );
    s.add(
        "batch-no-accept",
        "POST",
        format!("{E}/peerreplication/batch/"),
        &[JSON_TYPE],
        one.to_string(),
    );
    s.add(
        "batch-unparseable",
        "POST",
        format!("{E}/peerreplication/batch/"),
        &[JSON_TYPE, JSON_ACCEPT],
        "nope",
    );
    s.add(
        "batch-unknown-action",
        "POST",
        format!("{E}/peerreplication/batch/"),
        &[JSON_TYPE, JSON_ACCEPT],
        json!({"replicationList": [{"appName": "REPL", "id": "repl-1", "action": "Bogus"}]}).to_string(),
    );
    s.add(
        "batch-empty-list",
        "POST",
        format!("{E}/peerreplication/batch/"),
        &[JSON_TYPE, JSON_ACCEPT],
        json!({"replicationList": []}).to_string(),
    );
}

/// Cancel (endpoint 3).
fn cancels(s: &mut Script) {
    s.delete("cancel-ok", format!("{E}/apps/MINI/mini.local"), &[]);
    s.delete("cancel-again", format!("{E}/apps/MINI/mini.local"), &[]);
    s.get("get-app-after-last-cancel", format!("{E}/apps/MINI"), &[JSON_ACCEPT]);
    s.delete("cancel-encoded-v2", format!("{V2}/apps/pct/{PCT_ENC}"), &[]);
    s.delete("cancel-unknown-app", format!("{E}/apps/NOAPP/x"), &[]);
    s.delete(
        "cancel-spring-style",
        format!("{E}/apps/START/start-1"),
        &[JSON_TYPE, JSON_ACCEPT],
    );
    s.delete(
        "cancel-replication-header",
        format!("{E}/apps/OVR/ovr-1"),
        &[REPLICATION],
    );
    s.get(
        "get-instance-after-cancel",
        format!("{E}/apps/OVR/ovr-1"),
        &[JSON_ACCEPT],
    );
}

/// The rest of section 2 (endpoints 15-17).
fn status_and_the_rest(s: &mut Script) {
    s.put("asg-status", format!("{E}/asg/my-asg/status?value=ENABLED"), &[]);
    s.put("asg-status-v2", format!("{V2}/asg/my-asg/status?value=DISABLED"), &[]);
    s.get("server-status-xml", format!("{E}/status"), &[]);
    s.get("server-status-json-v2", format!("{V2}/status"), &[JSON_ACCEPT]);
    s.get(
        "serverinfo-statusoverrides",
        format!("{E}/serverinfo/statusoverrides"),
        &[JSON_ACCEPT],
    );
}

/// Unknown paths and wrong methods.
fn unknown_paths_and_methods(s: &mut Script) {
    s.get("unknown-path", format!("{E}/nope"), &[]);
    s.get("unknown-path-json", format!("{E}/nope"), &[JSON_ACCEPT]);
    s.get("unknown-path-v1", "/eureka/v1/apps".into(), &[JSON_ACCEPT]);
    s.get(
        "unknown-path-deep",
        format!("{E}/apps/ORDERS/{HOST1}/status/extra"),
        &[],
    );
    s.get("unknown-path-outside-eureka", "/nope".into(), &[]);
    s.add("method-post-apps", "POST", format!("{E}/apps"), &[JSON_TYPE], "{}");
    s.delete("method-delete-app", format!("{E}/apps/ORDERS"), &[]);
    s.get("method-get-status", format!("{E}/apps/ORDERS/{HOST1}/status"), &[]);
    s.get("method-get-metadata", format!("{E}/apps/ORDERS/{HOST1}/metadata"), &[]);
    s.get("method-get-batch", format!("{E}/peerreplication/batch/"), &[]);
    s.add(
        "method-post-instance",
        "POST",
        format!("{E}/apps/ORDERS/{HOST1}"),
        &[JSON_TYPE],
        "{}",
    );
    s.put("method-put-vips", format!("{E}/vips/orders"), &[]);
    s.delete("method-delete-delta", format!("{V2}/apps/delta"), &[]);
}

/// The final state.
fn final_state(s: &mut Script) {
    s.get("final-delta-json", format!("{E}/apps/delta"), &[JSON_ACCEPT]);
    s.get("final-delta-xml", format!("{V2}/apps/delta"), &[]);
    s.get("final-apps-json", format!("{E}/apps/"), &[JSON_ACCEPT]);
    s.get("final-apps-xml", format!("{V2}/apps/"), &[]);
    s.get("final-apps-gzip-json", format!("{E}/apps/"), &[JSON_ACCEPT, GZIP]);
    s.get("final-vip-json", format!("{E}/vips/orders"), &[JSON_ACCEPT]);
    s.get("final-svip-xml", format!("{E}/svips/repl-secure"), &[]);
}

/// Probes that may leave the two registries in different states, so they come last.
fn probes_that_come_last(s: &mut Script) {
    // Java changes the status, then fails on the timestamp (500); we refuse it up front (400).
    s.put(
        "status-put-bad-timestamp-changing-status",
        format!("{E}/apps/BILLING/billing-1/status?value=DOWN&lastDirtyTimestamp=abc"),
        &[],
    );
    let amzn3 = with(
        with(amzn1(), "instanceId", json!("amzn-3")),
        "dataCenterInfo",
        json!({"@class": AMAZON, "name": "Amazon", "metadata": {"instance-id": "i-0abc333"}}),
    );
    s.post_json(
        "register-json-amazon-metadata-before-name",
        format!("{E}/apps/AMZN"),
        &wrap(amzn3),
    );
}

// === a raw HTTP/1.1 client ===

/// A normalised answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: Option<String>,
    content_encoding: Option<String>,
    body: Body,
    /// The raw (decompressed) body, for the report.
    raw: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Body {
    Empty,
    Json(Value),
    Xml(Value),
    Text(String),
}

impl Body {
    fn kind(&self) -> &'static str {
        match self {
            Body::Empty => "empty",
            Body::Json(_) => "JSON",
            Body::Xml(_) => "XML",
            Body::Text(_) => "text",
        }
    }
}

async fn send(addr: SocketAddr, step: &Step) -> Result<(u16, Vec<(String, String)>, Vec<u8>), String> {
    let mut stream = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nUser-Agent: eureka-differential\r\n",
        step.method, step.path
    );
    for (k, v) in &step.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !step.body.is_empty() || matches!(step.method, "POST" | "PUT") {
        head.push_str(&format!("Content-Length: {}\r\n", step.body.len()));
    }
    head.push_str("\r\n");
    let mut request = head.into_bytes();
    request.extend_from_slice(&step.body);
    stream.write_all(&request).await.map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| format!("read: {e}"))?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no header end in {:?}", String::from_utf8_lossy(&raw)))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut body = raw[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    if header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        body = dechunk(&body)?;
    } else if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.truncate(len);
    }
    Ok((status, headers, body))
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated chunk size")?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| format!("bad chunk size {size_text:?}: {e}"))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&data[..size]);
        data = data.get(size + 2..).unwrap_or_default();
    }
}

/// Sends the step and normalises the answer.
async fn ask(addr: SocketAddr, step: &Step) -> Answer {
    let (status, headers, mut body) = match send(addr, step).await {
        Ok(r) => r,
        Err(e) => {
            return Answer {
                status: 0,
                content_type: None,
                content_encoding: None,
                body: Body::Text(format!("request failed: {e}")),
                raw: e,
            };
        }
    };
    let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let content_type =
        header("content-type").map(|v| v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase());
    let content_encoding = header("content-encoding").map(|v| v.trim().to_ascii_lowercase());
    if content_encoding.as_deref() == Some("gzip") {
        let mut out = Vec::new();
        match flate2::read::GzDecoder::new(&body[..]).read_to_end(&mut out) {
            Ok(_) => body = out,
            Err(e) => body = format!("<<undecodable gzip: {e}>>").into_bytes(),
        }
    }
    let raw = String::from_utf8_lossy(&body).into_owned();
    let body = parse_body(&raw, content_type.as_deref());
    Answer {
        status,
        content_type,
        content_encoding,
        body,
        raw,
    }
}

fn parse_body(raw: &str, content_type: Option<&str>) -> Body {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Body::Empty;
    }
    let ct = content_type.unwrap_or_default();
    let json_first = ct.contains("json") || (!ct.contains("xml") && trimmed.starts_with(['{', '[']));
    if json_first && let Ok(v) = serde_json::from_str(trimmed) {
        return Body::Json(v);
    }
    if (ct.contains("xml") || trimmed.starts_with('<'))
        && let Ok(v) = xml_to_value(trimmed)
    {
        return Body::Xml(v);
    }
    if let Ok(v) = serde_json::from_str::<Value>(trimmed)
        && (v.is_object() || v.is_array())
    {
        return Body::Json(v);
    }
    Body::Text(trimmed.to_string())
}

// === XML as a comparable tree ===

struct Element {
    name: String,
    attributes: Vec<(String, String)>,
    text: String,
    children: Vec<Element>,
}

fn entity(name: &str) -> Option<char> {
    Some(match name {
        "lt" => '<',
        "gt" => '>',
        "amp" => '&',
        "quot" => '"',
        "apos" => '\'',
        _ => return None,
    })
}

/// Parses XML into `{root: tree}`, where an element without attributes and child elements is
/// its trimmed text, and any other element is an object of `@attribute`s, children (grouped by
/// name; an array when a name repeats) and `$` for non-blank text. Child order is not kept.
fn xml_to_value(text: &str) -> Result<Value, String> {
    let mut reader = quick_xml::Reader::from_str(text);
    reader.config_mut().check_end_names = true;
    let mut stack: Vec<Element> = Vec::new();
    let mut root: Option<Element> = None;
    let open = |e: &quick_xml::events::BytesStart<'_>| -> Result<Element, String> {
        let mut attributes = Vec::new();
        for a in e.attributes() {
            let a = a.map_err(|e| e.to_string())?;
            let value = a
                .normalized_value(quick_xml::XmlVersion::Implicit1_0)
                .map_err(|e| e.to_string())?
                .into_owned();
            attributes.push((a.key.0.to_string(), value));
        }
        Ok(Element {
            name: e.name().0.to_string(),
            attributes,
            text: String::new(),
            children: Vec::new(),
        })
    };
    loop {
        match reader.read_event().map_err(|e| e.to_string())? {
            Event::Start(e) => stack.push(open(&e)?),
            Event::Empty(e) => {
                let el = open(&e)?;
                match stack.last_mut() {
                    Some(parent) => parent.children.push(el),
                    None if root.is_none() => root = Some(el),
                    None => return Err("several roots".into()),
                }
            }
            Event::End(_) => {
                let el = stack.pop().ok_or("unbalanced end tag")?;
                match stack.last_mut() {
                    Some(parent) => parent.children.push(el),
                    None if root.is_none() => root = Some(el),
                    None => return Err("several roots".into()),
                }
            }
            Event::Text(t) => match stack.last_mut() {
                Some(el) => el.text.push_str(&t.xml10_content()),
                None if t.xml10_content().trim().is_empty() => {}
                None => return Err("text outside the root".into()),
            },
            Event::CData(t) => {
                if let Some(el) = stack.last_mut() {
                    el.text.push_str(&t.xml10_content());
                }
            }
            Event::GeneralRef(r) => {
                let c = if r.is_char_ref() {
                    r.resolve_char_ref().map_err(|e| e.to_string())?
                } else {
                    entity(&r.xml10_content())
                };
                let c = c.ok_or("unknown entity")?;
                if let Some(el) = stack.last_mut() {
                    el.text.push(c);
                }
            }
            Event::Decl(_) | Event::Comment(_) | Event::PI(_) | Event::DocType(_) => {}
            Event::Eof => break,
        }
    }
    if !stack.is_empty() {
        return Err("unclosed element".into());
    }
    let root = root.ok_or("no root element")?;
    let mut map = Map::new();
    map.insert(root.name.clone(), element_value(&root));
    Ok(Value::Object(map))
}

fn element_value(el: &Element) -> Value {
    if el.attributes.is_empty() && el.children.is_empty() {
        return Value::String(el.text.trim().to_string());
    }
    let mut map = Map::new();
    for (k, v) in &el.attributes {
        map.insert(format!("@{k}"), Value::String(v.clone()));
    }
    let mut groups: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    for child in &el.children {
        groups.entry(&child.name).or_default().push(element_value(child));
    }
    for (name, mut values) in groups {
        let v = if values.len() == 1 {
            values.remove(0)
        } else {
            Value::Array(values)
        };
        map.insert(name.to_string(), v);
    }
    if !el.text.trim().is_empty() {
        map.insert("$".into(), Value::String(el.text.trim().to_string()));
    }
    Value::Object(map)
}

// === normalisation ===

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// When each step ran (wall clock, ms): a timestamp made by a server while it answered step N
/// falls into `spans[N - 1]`.
struct Clock {
    spans: Vec<(i64, i64)>,
}

/// Offsets a server adds to "now": Java's renewal time plus the lease duration (the scripted
/// leases last 90 or 120 s).
const OFFSETS_MS: [i64; 3] = [0, 90_000, 120_000];

impl Clock {
    /// `<step N>` (or `<step N + 90s>`) for a timestamp made during the run; `None` for 0 and
    /// scripted values.
    fn label(&self, n: i64) -> Option<String> {
        let (first, last) = (self.spans.first()?.0, self.spans.last()?.1);
        if n == 0 || n < first || n > last + 3_600_000 {
            return None;
        }
        for offset in OFFSETS_MS {
            let t = n - offset;
            if let Some(i) = self.spans.iter().position(|(a, b)| (*a..=*b).contains(&t)) {
                return Some(match offset {
                    0 => format!("<step {}>", i + 1),
                    o => format!("<step {} + {}s>", i + 1, o / 1000),
                });
            }
        }
        Some("<during the run, between steps>".into())
    }
}

/// Replaces a timestamp made during the run by the step it was made in, keeping 0, scripted
/// values and the JSON type.
fn normalise_timestamp(v: &mut Value, clock: &Clock) {
    let (n, kind) = match v {
        Value::Number(n) => (n.as_i64(), "number"),
        Value::String(s) => (s.trim().parse::<i64>().ok(), "string"),
        _ => return,
    };
    let Some(n) = n else {
        if let Value::String(s) = v {
            // e.g. Spring Boot's ISO date in error documents
            *s = "<date>".into();
        }
        return;
    };
    if let Some(label) = clock.label(n) {
        *v = Value::String(format!("{label} ({kind})"));
    }
}

fn sort_key(v: &Value, fields: &[&str]) -> String {
    fields
        .iter()
        .find_map(|f| v.get(*f).and_then(Value::as_str))
        .unwrap_or_default()
        .to_string()
}

/// Normalises a parsed body in place: timestamps, delta versions, and the order of applications
/// and instances (object keys are compared without order anyway).
fn normalise(v: &mut Value, key: Option<&str>, delta: bool, clock: &Clock) {
    if let Some(k) = key {
        if k.ends_with("Timestamp") || k == "timestamp" {
            normalise_timestamp(v, clock);
            return;
        }
        if k == "versions__delta" && delta {
            if let Value::String(s) = v {
                *s = "<delta version>".into();
            }
            return;
        }
    }
    match v {
        Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                normalise(child, Some(k), delta, clock);
            }
        }
        Value::Array(items) => {
            for item in items.iter_mut() {
                normalise(item, key, delta, clock);
            }
            match key {
                Some("application") => items.sort_by_key(|a| sort_key(a, &["name"])),
                Some("instance") => items.sort_by_key(|i| sort_key(i, &["instanceId", "hostName"])),
                _ => {}
            }
        }
        _ => {}
    }
}

fn normalise_answer(answer: &mut Answer, step: &Step, clock: &Clock) {
    let delta = step.path.contains("/apps/delta");
    if let Body::Json(v) | Body::Xml(v) = &mut answer.body {
        normalise(v, None, delta, clock);
    }
}

// === comparison ===

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 160 {
        format!(
            "{}…",
            &s[..s.char_indices().nth(160).map(|(i, _)| i).unwrap_or(s.len())]
        )
    } else {
        s
    }
}

/// The identity of an application (`name`) or instance (`instanceId`, else `hostName`), for
/// arrays that are compared as sets.
fn identity(key: &str, item: &Value) -> Option<String> {
    let fields: &[&str] = match key {
        "application" => &["name"],
        "instance" => &["instanceId", "hostName"],
        _ => return None,
    };
    Some(sort_key(item, fields))
}

/// Appends the differences between two normalised trees to `out`, one line each, starting with
/// the path (`/applications/application[ORDERS]/instance[host1:orders:8080]/status`).
fn diff_values(path: &str, key: &str, java: &Value, ours: &Value, out: &mut Vec<String>) {
    match (java, ours) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let p = format!("{path}/{k}");
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => diff_values(&p, k, x, y, out),
                    (Some(x), None) => out.push(format!("{p}: only Java has it: {}", short(x))),
                    (None, Some(y)) => out.push(format!("{p}: only ours has it: {}", short(y))),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.iter().chain(b).all(|v| identity(key, v).is_some()) => {
            let ids = |items: &[Value]| -> BTreeMap<String, Value> {
                items
                    .iter()
                    .map(|v| (identity(key, v).unwrap_or_default(), v.clone()))
                    .collect()
            };
            let (a, b) = (ids(a), ids(b));
            let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for name in names {
                let p = format!("{path}[{name}]");
                match (a.get(name), b.get(name)) {
                    (Some(x), Some(y)) => diff_values(&p, key, x, y, out),
                    (Some(x), None) => out.push(format!("{p}: only Java has it: {}", short(x))),
                    (None, Some(y)) => out.push(format!("{p}: only ours has it: {}", short(y))),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                out.push(format!(
                    "{path}: Java has {} items, ours {}: Java {} / ours {}",
                    a.len(),
                    b.len(),
                    short(java),
                    short(ours)
                ));
                return;
            }
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff_values(&format!("{path}[{i}]"), key, x, y, out);
            }
        }
        _ if java == ours => {}
        _ => out.push(format!("{path}: Java {} / ours {}", short(java), short(ours))),
    }
}

/// The differences between the two answers, as (kind, detail).
fn compare(java: &Answer, ours: &Answer) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if java.status != ours.status {
        out.push(("status", format!("Java {} / ours {}", java.status, ours.status)));
    }
    if java.content_type != ours.content_type {
        out.push((
            "content-type",
            format!("Java {:?} / ours {:?}", java.content_type, ours.content_type),
        ));
    }
    if java.content_encoding != ours.content_encoding {
        out.push((
            "content-encoding",
            format!("Java {:?} / ours {:?}", java.content_encoding, ours.content_encoding),
        ));
    }
    match (&java.body, &ours.body) {
        (a, b) if a == b => {}
        (Body::Empty, _) | (_, Body::Empty) => out.push((
            "body-presence",
            format!("Java {} / ours {}", java.body.kind(), ours.body.kind()),
        )),
        (Body::Json(a), Body::Json(b)) | (Body::Xml(a), Body::Xml(b)) => {
            let mut details = Vec::new();
            diff_values("", "", a, b, &mut details);
            out.extend(details.into_iter().map(|d| ("body", d)));
        }
        (a, b) => out.push((
            "body",
            format!(
                "Java {} {:?} / ours {} {:?}",
                a.kind(),
                snippet(&java.raw),
                b.kind(),
                snippet(&ours.raw)
            ),
        )),
    }
    out
}

fn snippet(raw: &str) -> String {
    let s: String = raw.trim().chars().take(200).collect();
    if raw.trim().chars().count() > 200 {
        format!("{s}…")
    } else {
        s
    }
}

/// Whether an allow-list "what" covers a difference: either its kind (`body`), or its kind and
/// the start of its detail (`body /instance/actionType`).
fn covers(what: &str, kind: &str, detail: &str) -> bool {
    match what.split_once(' ') {
        None => what == kind,
        Some((k, prefix)) => k == kind && detail.starts_with(prefix),
    }
}

// === the test ===

#[tokio::test]
async fn java_and_ours_answer_the_same_script_the_same_way() {
    let started = Instant::now();
    let java_ip = Ipv4Addr::new(127, 0, 0, 2);
    let our_ip = Ipv4Addr::new(127, 0, 0, 3);
    // JavaServer::start already sets fast eviction (1 s), no read-only response cache and no
    // wait after an empty start; these are the equivalent flags for ours.
    let java_args = vec!["--eureka.server.enable-self-preservation=false".to_string()];
    let our_args = [
        "--enable-self-preservation",
        "false",
        "--eviction-interval-timer-in-ms",
        "1000",
        "--wait-time-in-ms-when-sync-empty",
        "0",
        "--lease-expiry",
        "java",
    ];
    let (java, ours) = tokio::join!(JavaServer::start(java_ip, &java_args), Server::start(our_ip, &our_args));
    let Some(java) = java else {
        return;
    };
    println!("servers up after {:?}", started.elapsed());
    let java_addr = SocketAddr::from((java.ip, java.port));
    let our_addr = SocketAddr::from((ours.ip, ours.port));

    let script = script();
    // EUREKA_DIFFERENTIAL_DUMP=<dir> keeps every raw answer there, for debugging.
    let dump = std::env::var_os("EUREKA_DIFFERENTIAL_DUMP").map(std::path::PathBuf::from);
    if let Some(dir) = &dump {
        std::fs::create_dir_all(dir).expect("dump directory");
    }
    let mut clock = Clock { spans: Vec::new() };
    let mut unexpected: Vec<String> = Vec::new();
    let mut used: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut same = 0;
    for (n, step) in script.steps.iter().enumerate() {
        let n = n + 1;
        let began = now_ms();
        let (mut java_answer, mut our_answer) = tokio::join!(ask(java_addr, step), ask(our_addr, step));
        clock.spans.push((began, now_ms()));
        // Keeps the spans of consecutive steps apart at millisecond resolution.
        tokio::time::sleep(Duration::from_millis(2)).await;
        if let Some(dir) = &dump {
            for (who, a) in [("java", &java_answer), ("ours", &our_answer)] {
                let file = dir.join(format!("{n:03}-{}.{who}", step.name));
                let _ = std::fs::write(
                    file,
                    format!(
                        "{} {:?} {:?}\n\n{}",
                        a.status, a.content_type, a.content_encoding, a.raw
                    ),
                );
            }
        }
        normalise_answer(&mut java_answer, step, &clock);
        normalise_answer(&mut our_answer, step, &clock);
        let diffs = compare(&java_answer, &our_answer);
        if diffs.is_empty() {
            same += 1;
            println!("step {n} {}: same", step.name);
            continue;
        }
        println!(
            "step {n} {}: {} {}{}",
            step.name,
            step.method,
            step.path,
            if step.headers.is_empty() {
                String::new()
            } else {
                format!(
                    " [{}]",
                    step.headers
                        .iter()
                        .map(|(k, v)| format!("{k}: {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
        for (who, a) in [("Java", &java_answer), ("ours", &our_answer)] {
            println!(
                "    {who}: {} {:?}{} {}",
                a.status,
                a.content_type,
                a.content_encoding
                    .as_deref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default(),
                snippet(&a.raw)
            );
        }
        for (kind, detail) in diffs {
            match ALLOWED
                .iter()
                .find(|(s, what, _)| *s == step.name && covers(what, kind, &detail))
            {
                Some((s, k, why)) => {
                    used.insert((s, k));
                    println!("    allowed {kind}: {detail}  [{why}]");
                }
                None => {
                    println!("    DIFFERS {kind}: {detail}");
                    unexpected.push(format!("step {n} {} {kind}: {detail}", step.name));
                }
            }
        }
    }
    for (s, k, _) in ALLOWED {
        if !used.contains(&(*s, *k)) {
            println!("note: allow-list entry ({s}, {k}) was not needed in this run");
        }
        assert!(
            script.steps.iter().any(|st| st.name == *s),
            "allow-list entry for unknown step {s}"
        );
    }
    println!(
        "{} steps, {same} the same, {} unexpected differences, {:?} in all",
        script.steps.len(),
        unexpected.len(),
        started.elapsed()
    );
    assert!(
        unexpected.is_empty(),
        "{} unexpected differences between Java and ours:\n{}",
        unexpected.len(),
        unexpected.join("\n")
    );
}
