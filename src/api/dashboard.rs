//! The dashboard at `/`, laid out like Spring Cloud's Eureka page: system status, the
//! self-preservation banners, replicas, instances per application with their status, general
//! info; and `/lastn` with the last registrations and cancellations.
//!
//! Everything on it comes from clients, so every value is escaped, only `http` and `https` status
//! page URLs become links (a `javascript:` URL is shown as text), and the pages carry a
//! Content-Security-Policy that allows no script at all.

use std::{fmt::Write, sync::Arc};

use axum::{
    extract::State,
    http::header,
    response::{IntoResponse, Response},
};

use super::Api;
use crate::registry::{
    Stats,
    instance::Status,
    view::{AppsView, InstanceView},
};

/// Spring's banner when renewals are below the threshold and self-preservation is on.
pub const EMERGENCY: &str = "EMERGENCY! EUREKA MAY BE INCORRECTLY CLAIMING INSTANCES ARE UP WHEN THEY'RE NOT. RENEWALS ARE LESSER THAN THRESHOLD AND HENCE THE INSTANCES ARE NOT BEING EXPIRED JUST TO BE SAFE.";
/// Below the threshold with self-preservation off.
pub const BELOW_THRESHOLD_OFF: &str = "RENEWALS ARE LESSER THAN THE THRESHOLD. THE SELF PRESERVATION MODE IS TURNED OFF. THIS MAY NOT PROTECT INSTANCE EXPIRY IN CASE OF NETWORK/OTHER PROBLEMS.";
/// Self-preservation off, renewals fine.
pub const PRESERVATION_OFF: &str =
    "THE SELF PRESERVATION MODE IS TURNED OFF. THIS MAY NOT PROTECT INSTANCE EXPIRY IN CASE OF NETWORK/OTHER PROBLEMS.";

/// Which banner applies (Spring's `navbar.ftlh` logic).
pub fn banner(stats: &Stats) -> Option<&'static str> {
    match (stats.below_renew_threshold, stats.self_preservation_enabled) {
        (true, true) => Some(EMERGENCY),
        (true, false) => Some(BELOW_THRESHOLD_OFF),
        (false, false) => Some(PRESERVATION_OFF),
        (false, true) => None,
    }
}

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Whether `url` may be a link: it starts with `http://` or `https://` (in any case) as written,
/// so no leading space, control character or scheme trick can make it anything else.
fn is_web_url(url: &str) -> bool {
    let starts = |prefix: &str| url.get(..prefix.len()).is_some_and(|p| p.eq_ignore_ascii_case(prefix));
    starts("http://") || starts("https://")
}

/// No script, no plugins, no framing, no forms; the inline style sheet only.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn time(ms: i64) -> String {
    // Days since the epoch to a civil date (Howard Hinnant's algorithm), UTC.
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02} +0000",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

fn uptime(ms: i64) -> String {
    let mins = ms.max(0) / 60_000;
    format!("{:02}:{:02}", mins / 60, mins % 60)
}

/// What the page shows.
pub struct Model<'a> {
    pub stats: &'a Stats,
    pub apps: &'a AppsView,
    pub now: i64,
    pub started_at: i64,
    pub environment: &'a str,
    pub replicas: &'a [String],
    pub leader: Option<bool>,
    /// This replica's links to other clusters.
    pub links: &'a [LinkRow],
}

/// One link as the dashboard shows it.
#[derive(Clone, Debug, Default)]
pub struct LinkRow {
    pub name: String,
    pub state: crate::links::LinkState,
    pub figures: crate::registry::imports::LinkFigures,
}

const STYLE: &str = "body{font-family:sans-serif;margin:0;color:#222}header{background:#34495e;color:#fff;padding:12px 24px}\
main{padding:12px 24px}table{border-collapse:collapse;width:100%;margin-bottom:18px}\
th,td{border:1px solid #ccc;padding:6px 8px;text-align:left;vertical-align:top}th{background:#eee}\
h2{margin-top:22px}.banner{color:#c0392b;font-weight:bold;margin:12px 0}.up{color:#1e8449}.down{color:#c0392b}";

/// The page: system status, replicas, the registered applications and general info, each
/// value escaped.
pub fn render(m: &Model<'_>) -> String {
    let mut h = String::with_capacity(8192);
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Eureka</title><style>{STYLE}</style></head><body>\
         <header><h1>eureka-operator</h1><a style=\"color:#fff\" href=\"lastn\">LAST 1000 SINCE STARTUP</a></header><main>"
    );
    system_status(&mut h, m);
    h.push_str("<h2>DS Replicas</h2><ul id=\"replicas\">");
    for r in m.replicas {
        let _ = write!(h, "<li>{}</li>", esc(&scrub_credentials(r)));
    }
    h.push_str("</ul>");
    instances(&mut h, m.apps);
    links(&mut h, m);
    general_info(&mut h, m);
    h.push_str("</main></body></html>");
    h
}

/// A two-column row of a table.
fn row(h: &mut String, k: &str, v: &str) {
    let _ = write!(h, "<tr><td>{}</td><td>{}</td></tr>", esc(k), esc(v));
}

fn system_status(h: &mut String, m: &Model<'_>) {
    let s = m.stats;
    h.push_str("<h2>System Status</h2><table id=\"system-status\">");
    row(h, "Environment", m.environment);
    row(h, "Data center", "default");
    row(h, "Current time", &time(m.now));
    row(h, "Uptime", &uptime(m.now - m.started_at));
    row(h, "Lease expiration enabled", &s.lease_expiration_enabled.to_string());
    row(h, "Renews threshold", &s.renews_threshold.to_string());
    row(h, "Renews (last min)", &s.renews_last_min.to_string());
    row(h, "Self-preservation active", &s.self_preservation_active.to_string());
    if let Some(leader) = m.leader {
        row(h, "Holds the leader Lease", &leader.to_string());
    }
    h.push_str("</table>");
    if let Some(text) = banner(s) {
        let _ = write!(h, "<p class=\"banner\" id=\"banner\">{}</p>", esc(text));
    }
}

/// One row per application: its instance count, zones, and its instances by status (linked to
/// their status pages when those are http or https URLs).
fn instances(h: &mut String, apps: &AppsView) {
    h.push_str("<h2>Instances currently registered with Eureka</h2><table id=\"instances\"><tr><th>Application</th><th>AMIs</th><th>Availability Zones</th><th>Status</th></tr>");
    if apps.apps.is_empty() {
        h.push_str("<tr><td colspan=\"4\">No instances available</td></tr>");
    }
    for app in &apps.apps {
        let zones: std::collections::BTreeSet<&str> = app
            .instances
            .iter()
            .map(|i| i.info.metadata.get("zone").unwrap_or("default"))
            .collect();
        let _ = write!(
            h,
            "<tr><td><b>{}</b></td><td>n/a ({})</td><td>{}</td><td>",
            esc(&app.name),
            app.instances.len(),
            esc(&zones.into_iter().collect::<Vec<_>>().join(", "))
        );
        for status in [
            Status::Up,
            Status::Down,
            Status::Starting,
            Status::OutOfService,
            Status::Unknown,
        ] {
            let ids: Vec<&_> = app.instances.iter().filter(|i| i.info.status == status).collect();
            if ids.is_empty() {
                continue;
            }
            let class = if status == Status::Up { "up" } else { "down" };
            let _ = write!(
                h,
                "<div><b class=\"{class}\">{} ({})</b> - ",
                status.as_str(),
                ids.len()
            );
            let links: Vec<String> = ids.iter().map(|i| instance_link(i)).collect();
            let _ = write!(h, "{}</div>", links.join(" , "));
        }
        h.push_str("</td></tr>");
    }
    h.push_str("</table>");
}

/// This replica's links: each one's state, last answer, and what it imported.
fn links(h: &mut String, m: &Model<'_>) {
    if m.links.is_empty() {
        return;
    }
    h.push_str("<h2>Links to other clusters</h2><table id=\"links\"><tr><th>Link</th><th>URLs</th><th>State</th><th>Last answer</th><th>Imported</th><th>Shown</th><th>Hidden by local</th><th>Last error</th></tr>");
    for l in m.links {
        let state = match (&l.state.last_error, l.state.withdrawn, l.state.stale) {
            (_, true, _) => ("withdrawn", "down"),
            (_, false, true) => ("stale", "down"),
            (Some(_), false, false) => ("failing", "down"),
            (None, _, _) if l.state.last_success.is_none() => ("waiting", "down"),
            (None, _, _) => ("up", "up"),
        };
        let last = l
            .state
            .last_success
            .map(|t| format!("{} ago", uptime(m.now - t)))
            .unwrap_or_else(|| "never".into());
        let urls: Vec<String> = l.state.urls.iter().map(|u| scrub_credentials(u)).collect();
        let _ = write!(
            h,
            "<tr><td><b>{}</b></td><td>{}</td><td><b class=\"{}\">{}</b></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&l.name),
            esc(&urls.join(", ")),
            state.1,
            state.0,
            esc(&last),
            l.figures.instances,
            l.figures.shown,
            l.figures.hidden_by_local,
            esc(l.state.last_error.as_deref().unwrap_or(""))
        );
    }
    h.push_str("</table>");
}

/// An instance's id, linked to its status page only when that is an http or https URL.
fn instance_link(i: &InstanceView) -> String {
    match i.info.status_page_url.as_deref().filter(|u| is_web_url(u)) {
        Some(url) => format!(
            "<a href=\"{}\" rel=\"noopener noreferrer\">{}</a>",
            esc(url),
            esc(i.id())
        ),
        None => esc(i.id()),
    }
}

fn general_info(h: &mut String, m: &Model<'_>) {
    let s = m.stats;
    h.push_str("<h2>General Info</h2><table id=\"general-info\">");
    row(h, "environment", m.environment);
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    row(h, "num-of-cpus", &cpus.to_string());
    row(h, "server-uptime", &uptime(m.now - m.started_at));
    let replicas: Vec<String> = m.replicas.iter().map(|r| scrub_credentials(r)).collect();
    row(h, "registered-replicas", &replicas.join(", "));
    row(h, "instances", &s.instances.to_string());
    row(h, "applications", &s.applications.to_string());
    for (origin, n) in s.by_origin {
        row(h, &format!("{}-instances", origin.as_str()), &n.to_string());
    }
    row(h, "expected-clients", &s.expected_clients.to_string());
    h.push_str("</table>");
}

/// Replica URLs may carry `user:password@`; the page never shows it.
fn scrub_credentials(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}{}", &url[..scheme + 3], &url[at + 1..]),
        _ => url.to_string(),
    }
}

pub fn render_lastn(registered: &[(i64, String)], cancelled: &[(i64, String)]) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Eureka - last 1000</title><style>{STYLE}</style></head><body><header><h1>eureka-operator</h1><a style=\"color:#fff\" href=\".\">HOME</a></header><main>"
    );
    for (title, id, list) in [
        ("Last 1000 newly registered leases", "registered", registered),
        ("Last 1000 cancelled leases", "cancelled", cancelled),
    ] {
        let _ = write!(
            h,
            "<h2>{title}</h2><table id=\"{id}\"><tr><th>Timestamp</th><th>Lease</th></tr>"
        );
        for (t, lease) in list {
            let _ = write!(h, "<tr><td>{}</td><td>{}</td></tr>", time(*t), esc(lease));
        }
        h.push_str("</table>");
    }
    h.push_str("</main></body></html>");
    h
}

fn html(body: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        body,
    )
        .into_response()
}

pub async fn page(State(api): State<Arc<Api>>) -> Response {
    let board = api.links.as_ref().map(|l| l.board.snapshot()).unwrap_or_default();
    let (stats, now, mut figures) = api.state.with_registry(|r, now| (r.stats(now), now, r.link_figures()));
    // Application by application, not the whole registry under one lock.
    let apps = AppsView {
        versions_delta: 1,
        apps_hashcode: String::new(),
        apps: api.state.app_views_batched().await,
    };
    let links: Vec<LinkRow> = board
        .into_iter()
        .map(|(name, state)| LinkRow {
            figures: figures.remove(&name).unwrap_or_default(),
            name,
            state,
        })
        .collect();
    let leader = api.leadership.as_ref().map(|l| l.borrow().holds());
    let replicas = api.peer_urls();
    html(render(&Model {
        stats: &stats,
        apps: &apps,
        now,
        started_at: api.started_at,
        environment: &api.environment,
        replicas: &replicas,
        leader,
        links: &links,
    }))
}

pub async fn lastn(State(api): State<Arc<Api>>) -> Response {
    let (registered, cancelled) = api.state.with_registry(|r, _| r.recent());
    html(render_lastn(&registered, &cancelled))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{Registry, RegistryConfig};

    fn stats(below: bool, enabled: bool) -> Stats {
        let mut r = Registry::new(RegistryConfig::default(), 0);
        let mut s = r.stats(0);
        s.below_renew_threshold = below;
        s.self_preservation_enabled = enabled;
        s
    }

    #[test]
    fn banners_follow_spring() {
        assert_eq!(banner(&stats(true, true)), Some(EMERGENCY));
        assert_eq!(banner(&stats(true, false)), Some(BELOW_THRESHOLD_OFF));
        assert_eq!(banner(&stats(false, false)), Some(PRESERVATION_OFF));
        assert_eq!(banner(&stats(false, true)), None);
    }

    #[test]
    fn time_is_utc_civil() {
        assert_eq!(time(0), "1970-01-01T00:00:00 +0000");
        assert_eq!(time(1_700_000_000_000), "2023-11-14T22:13:20 +0000");
        assert_eq!(uptime(3_723_000), "01:02");
    }

    #[test]
    fn page_escapes_and_scrubs() {
        let s = stats(false, true);
        let apps = AppsView {
            versions_delta: 1,
            apps_hashcode: String::new(),
            apps: vec![],
        };
        let replicas = vec!["http://user:pw@peer:8761/eureka/".to_string()];
        let page = render(&Model {
            stats: &s,
            apps: &apps,
            now: 0,
            started_at: 0,
            environment: "<test>",
            replicas: &replicas,
            leader: None,
            links: &[],
        });
        assert!(page.contains("&lt;test&gt;"));
        assert!(!page.contains("<test>"));
        assert!(page.contains("http://peer:8761/eureka/"));
        assert!(!page.contains("pw@"));
        assert!(page.contains("No instances available"));
    }

    fn app_with(status_page_urls: &[&str]) -> AppsView {
        use crate::registry::{
            instance::InstanceInfo,
            view::{AppView, InstanceView, LeaseView, Origin},
        };
        let instances = status_page_urls
            .iter()
            .enumerate()
            .map(|(n, url)| {
                let mut i = InstanceInfo::new("<b>APP</b>", &format!("h{n}\"'"), "10.0.0.1", 0);
                i.instance_id = Some(format!("id-{n}<script>").into());
                i.status_page_url = Some((*url).into());
                i.metadata.insert("zone", "<img src=x onerror=alert(1)>");
                InstanceView {
                    info: std::sync::Arc::new(i),
                    lease: LeaseView {
                        renewal_interval_secs: 30,
                        duration_secs: 90,
                        registration_ts: 0,
                        last_renewal_ts: 0,
                        eviction_ts: 0,
                        service_up_ts: 0,
                    },
                    origin: Origin::Native,
                }
            })
            .collect();
        AppsView {
            versions_delta: 1,
            apps_hashcode: String::new(),
            apps: vec![AppView {
                name: "<b>APP</b>".into(),
                instances,
            }],
        }
    }

    #[test]
    fn only_web_urls_become_links_and_every_value_is_escaped() {
        let s = stats(false, true);
        let urls = [
            "javascript:alert(1)",
            " javascript:alert(1)",
            "JaVaScRiPt:alert(1)",
            "java\tscript:alert(1)",
            "data:text/html,<script>alert(1)</script>",
            "vbscript:x",
            "//evil.example/x",
            "http://ok.example/info",
            "HTTPS://ok.example/info?a=1&b=\"2\"",
        ];
        let apps = app_with(&urls);
        let page = render(&Model {
            stats: &s,
            apps: &apps,
            now: 0,
            started_at: 0,
            environment: "test",
            replicas: &[],
            leader: None,
            links: &[],
        });
        let hrefs: Vec<&str> = page
            .split("href=\"")
            .skip(1)
            .filter_map(|h| h.split('"').next())
            .collect();
        assert_eq!(
            hrefs,
            [
                "lastn",
                "http://ok.example/info",
                "HTTPS://ok.example/info?a=1&amp;b=&quot;2&quot;"
            ]
        );
        assert!(!page.to_ascii_lowercase().contains("href=\"javascript"));
        assert!(
            page.contains("id-0&lt;script&gt;"),
            "an instance without a web URL is shown unlinked"
        );
        for raw in ["<script>", "<b>APP</b>", "<img", "\"'"] {
            assert!(!page.contains(raw), "{raw} is not escaped");
        }
        assert!(page.contains("&lt;b&gt;APP&lt;/b&gt;"));
    }

    #[test]
    fn pages_allow_no_script() {
        let r = html(String::new());
        let csp = r
            .headers()
            .get(header::CONTENT_SECURITY_POLICY)
            .unwrap()
            .to_str()
            .unwrap();
        assert!(csp.contains("default-src 'none'"));
        assert!(!csp.contains("script-src"));
        assert_eq!(r.headers().get(header::X_CONTENT_TYPE_OPTIONS).unwrap(), "nosniff");
    }
}
