//! Which Eureka endpoint a path names: both `/eureka/v2/...` (Netflix) and `/eureka/...` (Spring),
//! one trailing slash tolerated, segments percent-decoded, application names upper-cased.

use axum::http::Method;
use percent_encoding::percent_decode_str;

/// A Eureka endpoint, with its decoded path parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// `apps`
    Apps,
    /// `apps/delta`
    Delta,
    /// `apps/{app}`
    App { app: String },
    /// `apps/{app}/{id}`
    Instance { app: String, id: String },
    /// `apps/{app}/{id}/status`
    InstanceStatus { app: String, id: String },
    /// `apps/{app}/{id}/metadata`
    InstanceMetadata { app: String, id: String },
    /// `instances/{id}`
    InstanceById { id: String },
    /// `vips/{vip}`
    Vip { vip: String },
    /// `svips/{vip}`
    Svip { vip: String },
    /// `peerreplication/batch`
    Batch,
    /// `asg/{asg}/status`
    AsgStatus { asg: String },
    /// `status`
    ServerStatus,
}

impl Route {
    /// A bounded label for metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Route::Apps => "apps",
            Route::Delta => "apps_delta",
            Route::App { .. } => "app",
            Route::Instance { .. } => "instance",
            Route::InstanceStatus { .. } => "instance_status",
            Route::InstanceMetadata { .. } => "instance_metadata",
            Route::InstanceById { .. } => "instances",
            Route::Vip { .. } => "vips",
            Route::Svip { .. } => "svips",
            Route::Batch => "peer_batch",
            Route::AsgStatus { .. } => "asg_status",
            Route::ServerStatus => "status",
        }
    }

    /// The methods the endpoint answers.
    pub fn methods(&self) -> &'static [Method] {
        const GET: &[Method] = &[Method::GET];
        match self {
            Route::Apps | Route::Delta | Route::InstanceById { .. } | Route::Vip { .. } | Route::Svip { .. } => GET,
            Route::ServerStatus => GET,
            Route::App { .. } => &[Method::GET, Method::POST],
            Route::Instance { .. } => &[Method::GET, Method::PUT, Method::DELETE],
            Route::InstanceStatus { .. } => &[Method::PUT, Method::DELETE],
            Route::InstanceMetadata { .. } | Route::AsgStatus { .. } => &[Method::PUT],
            Route::Batch => &[Method::POST],
        }
    }
}

/// The Eureka API prefixes, longest first.
const PREFIXES: [&str; 2] = ["/eureka/v2/", "/eureka/"];

fn decode(segment: &str) -> Option<String> {
    let s = percent_decode_str(segment).decode_utf8().ok()?.into_owned();
    (!s.is_empty()).then_some(s)
}

/// Parses a raw (percent-encoded) request path. `None` when it names no Eureka endpoint.
pub fn parse(path: &str) -> Option<Route> {
    let rest = PREFIXES.iter().find_map(|p| path.strip_prefix(p))?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return None;
    }
    let raw: Vec<&str> = rest.split('/').collect();
    let seg: Vec<String> = raw.iter().map(|s| decode(s)).collect::<Option<_>>()?;
    let s: Vec<&str> = seg.iter().map(String::as_str).collect();
    let upper = |a: &str| a.to_ascii_uppercase();
    Some(match s.as_slice() {
        ["apps"] => Route::Apps,
        ["apps", "delta"] => Route::Delta,
        ["apps", app] => Route::App { app: upper(app) },
        ["apps", app, id] => Route::Instance {
            app: upper(app),
            id: id.to_string(),
        },
        ["apps", app, id, "status"] => Route::InstanceStatus {
            app: upper(app),
            id: id.to_string(),
        },
        ["apps", app, id, "metadata"] => Route::InstanceMetadata {
            app: upper(app),
            id: id.to_string(),
        },
        ["instances", id] => Route::InstanceById { id: id.to_string() },
        ["vips", vip] => Route::Vip { vip: vip.to_string() },
        ["svips", vip] => Route::Svip { vip: vip.to_string() },
        ["peerreplication", "batch"] => Route::Batch,
        ["asg", asg, "status"] => Route::AsgStatus { asg: asg.to_string() },
        ["status"] => Route::ServerStatus,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_prefixes_and_trailing_slashes() {
        for p in ["/eureka/apps", "/eureka/apps/", "/eureka/v2/apps", "/eureka/v2/apps/"] {
            assert_eq!(parse(p), Some(Route::Apps), "{p}");
        }
        assert_eq!(parse("/eureka/v2/apps/delta"), Some(Route::Delta));
        assert_eq!(parse("/eureka/peerreplication/batch/"), Some(Route::Batch));
        assert_eq!(parse("/eureka/v2/status"), Some(Route::ServerStatus));
        for p in [
            "/eureka",
            "/eureka/",
            "/eureka/v2/",
            "/apps",
            "/eureka/apps//x",
            "/eureka/v1/apps",
            "/eureka/nope",
        ] {
            assert_eq!(parse(p), None, "{p}");
        }
    }

    #[test]
    fn app_names_are_upper_cased_and_ids_decoded() {
        assert_eq!(
            parse("/eureka/apps/order-service"),
            Some(Route::App {
                app: "ORDER-SERVICE".into()
            })
        );
        assert_eq!(
            parse("/eureka/v2/apps/Orders/host%3Aorders%3A8080/status"),
            Some(Route::InstanceStatus {
                app: "ORDERS".into(),
                id: "host:orders:8080".into()
            })
        );
        assert_eq!(
            parse("/eureka/apps/ORDERS/host:orders:8080"),
            Some(Route::Instance {
                app: "ORDERS".into(),
                id: "host:orders:8080".into()
            })
        );
        assert_eq!(
            parse("/eureka/instances/a%2Fb"),
            Some(Route::InstanceById { id: "a/b".into() })
        );
        assert_eq!(
            parse("/eureka/vips/My-Vip"),
            Some(Route::Vip { vip: "My-Vip".into() }),
            "VIPs keep their case"
        );
        assert_eq!(parse("/eureka/apps/%FF"), None, "not UTF-8");
    }

    #[test]
    fn methods_per_route() {
        assert_eq!(parse("/eureka/apps/X").unwrap().methods(), &[Method::GET, Method::POST]);
        assert!(Route::Batch.methods().contains(&Method::POST));
    }
}

/// Query parameters (`a=b&c=d`), decoded, in order; `+` is a space.
pub fn query(q: Option<&str>) -> Vec<(String, String)> {
    let Some(q) = q else { return Vec::new() };
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let dec = |s: &str| {
                percent_decode_str(&s.replace('+', " "))
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (dec(k), dec(v))
        })
        .collect()
}

/// The first value of `name`.
pub fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod query_tests {
    use super::*;

    #[test]
    fn decodes_pairs_in_order() {
        let q = query(Some("status=UP&lastDirtyTimestamp=12&x=a%20b+c&flag&x=2"));
        assert_eq!(param(&q, "status"), Some("UP"));
        assert_eq!(param(&q, "lastDirtyTimestamp"), Some("12"));
        assert_eq!(param(&q, "x"), Some("a b c"), "first value wins");
        assert_eq!(param(&q, "flag"), Some(""));
        assert!(query(None).is_empty());
    }
}
