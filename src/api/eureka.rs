//! The Eureka REST endpoints: each handler decodes the request, makes one registry call, and
//! encodes the answer with the status codes and quirks Java clients expect.

use axum::{
    body::Body,
    http::{HeaderMap, Method, StatusCode},
    response::Response,
};

use super::{
    Api,
    negotiate::{self, ApiError, empty},
    peer,
    route::{self, Route},
};
use crate::{
    cache::Key,
    codec::{self, Format},
    registry::{Command, Reply, Source, instance::Status},
    state::Writer,
};

/// Who is calling, from the replication headers.
pub fn writer(headers: &HeaderMap) -> Writer {
    if headers.contains_key(peer::REPLICA_HEADER) {
        Writer::Replica
    } else if headers.get(peer::JAVA_REPLICATION_HEADER).and_then(|v| v.to_str().ok()) == Some("true") {
        Writer::ForeignPeer
    } else {
        Writer::Client
    }
}

fn source(writer: &Writer) -> Source {
    match writer {
        Writer::Client | Writer::Controller | Writer::Timer => Source::Client,
        Writer::Replica | Writer::ForeignPeer => Source::Peer,
    }
}

/// Serves one Eureka request.
pub async fn handle(
    api: &Api,
    route: Route,
    method: Method,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // HEAD is a GET without a body (hyper drops the body).
    let method = if method == Method::HEAD { Method::GET } else { method };
    if !route.methods().contains(&method) {
        return Err(ApiError::MethodNotAllowed(method, route.methods()));
    }
    let params = route::query(query);
    let state = &api.state;
    match (route, method) {
        (Route::Apps, _) => {
            let format = negotiate::reply_format(headers)?;
            allow_access(api)?;
            let payload = state.payload(Key::Full, format).await;
            Ok(negotiate::payload_reply(
                &payload,
                format,
                negotiate::accepts_gzip(headers),
            ))
        }
        (Route::Delta, _) => {
            let format = negotiate::reply_format(headers)?;
            if state.disable_delta() {
                return Err(ApiError::Forbidden);
            }
            allow_access(api)?;
            let payload = state.payload(Key::Delta, format).await;
            Ok(negotiate::payload_reply(
                &payload,
                format,
                negotiate::accepts_gzip(headers),
            ))
        }
        (Route::App { app }, Method::POST) => register(api, app, headers, body).await,
        (Route::App { app }, _) => {
            let format = negotiate::reply_format(headers)?;
            allow_access(api)?;
            let payload = state.payload(Key::App(app), format).await;
            if payload.empty {
                return Ok(empty(StatusCode::NOT_FOUND));
            }
            Ok(negotiate::payload_reply(&payload, format, false))
        }
        (Route::Vip { vip }, _) => vips(api, Key::Vip(vip), headers).await,
        (Route::Svip { vip }, _) => vips(api, Key::Svip(vip), headers).await,
        (Route::Instance { app, id }, Method::GET) => {
            let format = negotiate::reply_format(headers)?;
            match state.with_registry(|r, now| r.instance(&app, &id, now)) {
                Some(view) => Ok(negotiate::document(
                    StatusCode::OK,
                    codec::encode_instance(&view, format),
                    format,
                )),
                None => Ok(empty(StatusCode::NOT_FOUND)),
            }
        }
        (Route::InstanceById { id }, _) => {
            let format = negotiate::reply_format(headers)?;
            match state.with_registry(|r, now| r.find_instance(&id, now)) {
                Some(view) => Ok(negotiate::document(
                    StatusCode::OK,
                    codec::encode_instance(&view, format),
                    format,
                )),
                None => Ok(empty(StatusCode::NOT_FOUND)),
            }
        }
        (Route::Instance { app, id }, Method::PUT) => {
            let writer = writer(headers);
            let overridden_status = match route::param(&params, "overriddenstatus") {
                Some(s) => Some(parse_status(s, "overriddenstatus")?),
                None => None,
            };
            let command = Command::Renew {
                app,
                id,
                source: source(&writer),
                overridden_status,
                last_dirty_timestamp: dirty_timestamp(&params)?,
            };
            let outcome = state.apply(command, writer);
            reply(outcome.reply, headers)
        }
        (Route::Instance { app, id }, _) => {
            let writer = writer(headers);
            let outcome = state.apply(
                Command::Cancel {
                    app,
                    id,
                    source: source(&writer),
                },
                writer,
            );
            reply(outcome.reply, headers)
        }
        (Route::InstanceStatus { app, id }, Method::PUT) => {
            let writer = writer(headers);
            let value = route::param(&params, "value")
                .ok_or_else(|| ApiError::Invalid("the query parameter `value` (the new status) is required".into()))?;
            let command = Command::SetStatus {
                app,
                id,
                status: parse_status(value, "value")?,
                last_dirty_timestamp: dirty_timestamp(&params)?,
                source: source(&writer),
            };
            reply(state.apply(command, writer).reply, headers)
        }
        (Route::InstanceStatus { app, id }, _) => {
            let writer = writer(headers);
            let status = match route::param(&params, "value") {
                Some(v) => parse_status(v, "value")?,
                None => Status::Unknown,
            };
            let command = Command::DeleteStatusOverride {
                app,
                id,
                status,
                last_dirty_timestamp: dirty_timestamp(&params)?,
                source: source(&writer),
            };
            reply(state.apply(command, writer).reply, headers)
        }
        (Route::InstanceMetadata { app, id }, _) => {
            let entries = params.into_iter().collect();
            let outcome = state.apply(Command::UpdateMetadata { app, id, entries }, writer(headers));
            reply(outcome.reply, headers)
        }
        (Route::Batch, _) => peer::batch(api, headers, body).await,
        (Route::AsgStatus { asg }, _) => Err(ApiError::Invalid(format!(
            "cannot set the status of ASG {asg}: ASG status needs an AWS registry, and this one is not"
        ))),
        (Route::ServerStatus, _) => {
            let format = negotiate::reply_format(headers)?;
            Ok(server_status(api, format))
        }
    }
}

/// `vips/{vip}` and `svips/{vip}`: 200 with an empty document for an unknown VIP, as Java.
async fn vips(api: &Api, key: Key, headers: &HeaderMap) -> Result<Response, ApiError> {
    let format = negotiate::reply_format(headers)?;
    allow_access(api)?;
    let payload = api.state.payload(key, format).await;
    Ok(negotiate::payload_reply(&payload, format, false))
}

/// Java refuses reads (403) after an empty start until the wait time has passed.
fn allow_access(api: &Api) -> Result<(), ApiError> {
    if api.state.with_registry(|r, now| r.allow_access(now)) {
        Ok(())
    } else {
        Err(ApiError::Forbidden)
    }
}

fn parse_status(value: &str, name: &str) -> Result<Status, ApiError> {
    Status::parse_exact(value).ok_or_else(|| {
        ApiError::Invalid(format!(
            "unknown status {value:?} in `{name}`; expected one of UP, DOWN, STARTING, OUT_OF_SERVICE, UNKNOWN"
        ))
    })
}

fn dirty_timestamp(params: &[(String, String)]) -> Result<Option<i64>, ApiError> {
    match route::param(params, "lastDirtyTimestamp") {
        None | Some("") => Ok(None),
        Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
            ApiError::Invalid(format!(
                "lastDirtyTimestamp must be a number of milliseconds, got {v:?}"
            ))
        }),
    }
}

/// A registry reply as HTTP: bodies only where Java sends one.
fn reply(reply: Reply, headers: &HeaderMap) -> Result<Response, ApiError> {
    Ok(match reply {
        Reply::Registered => empty(StatusCode::NO_CONTENT),
        Reply::Ok | Reply::Unchanged => empty(StatusCode::OK),
        Reply::NotFound => empty(StatusCode::NOT_FOUND),
        Reply::Conflict(view) => {
            let format = negotiate::reply_format(headers).unwrap_or(Format::Json);
            negotiate::document(StatusCode::CONFLICT, codec::encode_instance(&view, format), format)
        }
        Reply::Refused(message) => return Err(ApiError::Conflict(message)),
    })
}

async fn register(api: &Api, app: String, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let body = negotiate::read_body(headers, body, api.max_body).await?;
    let (format, converted) = negotiate::body_format(headers, &body)?;
    let bytes = converted.as_deref().unwrap_or(&body);
    let registration =
        codec::decode_registration(bytes, format, api.state.now()).map_err(|e| ApiError::Unparseable {
            detail: e.message,
            json: negotiate::json_request(headers),
        })?;
    codec::validate_registration(&registration, &app).map_err(ApiError::Invalid)?;
    let writer = writer(headers);
    let command = Command::Register {
        info: registration.info,
        source: source(&writer),
    };
    reply(api.state.apply(command, writer).reply, headers)
}

/// `GET status`: a `StatusInfo`-like summary of this server.
fn server_status(api: &Api, format: Format) -> Response {
    let stats = api.state.with_registry(|r, now| r.stats(now));
    let uptime_ms = api.state.now() - api.started_at;
    let pairs = [
        ("environment", api.environment.clone()),
        (
            "num-of-cpus",
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .to_string(),
        ),
        (
            "server-uptime",
            format!("{:02}:{:02}", uptime_ms / 3_600_000, (uptime_ms / 60_000) % 60),
        ),
        ("registered-replicas", api.peer_urls().join(",")),
        ("instances", stats.instances.to_string()),
        ("renews-last-min", stats.renews_last_min.to_string()),
        ("renews-threshold", stats.renews_threshold.to_string()),
        ("self-preservation-active", stats.self_preservation_active.to_string()),
    ];
    let body = match format {
        Format::Json => {
            let map: serde_json::Map<String, serde_json::Value> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.clone())))
                .collect();
            serde_json::json!({"statusInfo": {"generalStats": map, "healthy": true}})
                .to_string()
                .into_bytes()
        }
        Format::Xml => {
            let mut out = String::from("<statusInfo><generalStats>");
            for (k, v) in &pairs {
                let v = v.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
                out.push_str(&format!("<entry><string>{k}</string><string>{v}</string></entry>"));
            }
            out.push_str("</generalStats><healthy>true</healthy></statusInfo>");
            out.into_bytes()
        }
    };
    negotiate::document(StatusCode::OK, body, format)
}
