//! The Eureka REST endpoints: each handler decodes the request, makes one registry call, and
//! encodes the answer with the status codes and quirks Java clients expect.

use std::sync::Arc;

use axum::{
    Extension,
    body::Body,
    extract::{RawQuery, State},
    http::{HeaderMap, Method, StatusCode},
    response::Response,
};

use super::{
    Api,
    auth::Caller,
    negotiate::{self, ApiError, empty},
    peer,
    route::{self, AppPath, InstancePath, Segment},
};
use crate::{
    cache::{Payload, PayloadKey},
    codec::{self, Format, RegistrationError},
    registry::{
        Command, Reply, Writer,
        instance::{Metadata, Status},
        view::InstanceView,
    },
};

/// Who is writing, from the replication headers; a marker is honoured only from a caller that
/// may replicate (see [`Caller`]).
pub fn writer(headers: &HeaderMap, caller: Caller) -> Result<Writer, ApiError> {
    // One pass over the request's few headers: looking both long custom names up in the map
    // hashes each of them byte by byte, which cost a heartbeat more than this (by callgrind's
    // count). The first value of a repeated header counts, as
    // `HeaderMap::get` takes it.
    let (mut replica, mut java) = (false, None);
    for (name, value) in headers {
        if name == peer::REPLICA_HEADER {
            replica = true;
        } else if java.is_none() && name == peer::JAVA_REPLICATION_HEADER {
            java = Some(value);
        }
    }
    let writer = if replica {
        Writer::REPLICA
    } else if java.and_then(|v| v.to_str().ok()) == Some("true") {
        Writer::JAVA
    } else {
        Writer::Client
    };
    if writer.is_replication() && !caller.may_replicate() {
        return Err(ApiError::NotAPeer);
    }
    Ok(writer)
}

/// The caller a request authenticated as (every caller is trusted when auth is off).
fn caller(caller: Option<Extension<Caller>>) -> Caller {
    caller.map(|Extension(c)| c).unwrap_or(Caller::Trusted)
}

/// `GET apps`: the full registry. One of our replicas (its start-up sync, the anti-entropy
/// comparison) gets it without imports: every replica pulls its links itself, and an import
/// copied as a replicated registration would hide the link's entry as if it were local.
pub async fn apps(
    State(api): State<Arc<Api>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if headers.contains_key(peer::REPLICA_HEADER) {
        let format = negotiate::reply_format(&headers)?;
        allow_access(&api)?;
        let mut view = api.state.with_registry(|r, _| r.export_view(&|_| true));
        view.versions_delta = 1;
        return Ok(negotiate::document(
            StatusCode::OK,
            codec::encode_apps(&view, format),
            format,
        ));
    }
    if let Some(reply) = regions_fetch(&api, query.as_deref(), false, &headers).await? {
        return Ok(reply);
    }
    fetch(&api, PayloadKey::Full, &headers, true).await
}

/// `GET apps/delta`: what changed recently (403 when deltas are disabled, as Java).
pub async fn delta(
    State(api): State<Arc<Api>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    negotiate::reply_format(&headers)?;
    if api.state.disable_delta() {
        return Err(ApiError::Forbidden);
    }
    if let Some(reply) = regions_fetch(&api, query.as_deref(), true, &headers).await? {
        return Ok(reply);
    }
    fetch(&api, PayloadKey::Delta, &headers, true).await
}

/// A full or delta fetch with `?regions=` naming links shown only on request: the main view
/// with what they offer, built per request (`None`: no such link named, the cached view
/// answers, as Java ignores regions it does not know).
async fn regions_fetch(
    api: &Api,
    query: Option<&str>,
    delta: bool,
    headers: &HeaderMap,
) -> Result<Option<Response>, ApiError> {
    let Some(regions) = route::query(query).get("regions") else {
        return Ok(None);
    };
    let names: Vec<&str> = regions.split(',').map(str::trim).filter(|n| !n.is_empty()).collect();
    if names.is_empty() {
        return Ok(None);
    }
    let format = negotiate::reply_format(headers)?;
    allow_access(api)?;
    let view = api.state.with_registry(|r, _| {
        let links = r.offering_links(&names);
        match (links.is_empty(), delta) {
            (true, _) => None,
            (false, false) => Some(r.regions_full_view(&links)),
            (false, true) => Some(r.regions_delta_view(&links)),
        }
    });
    let Some(view) = view else {
        return Ok(None);
    };
    let body = tokio::task::spawn_blocking(move || codec::encode_apps(&view, format))
        .await
        .map_err(|e| ApiError::Internal(format!("failed to encode a regions view: {e}")))?;
    let gzip = negotiate::accepts_gzip(headers);
    Ok(Some(
        negotiate::payload_reply(Arc::new(Payload::new(body)), format, gzip).await,
    ))
}

/// `GET apps/{app}`: one application, 404 when it has no instance.
pub async fn app(State(api): State<Arc<Api>>, AppPath(app): AppPath, headers: HeaderMap) -> Result<Response, ApiError> {
    let format = negotiate::reply_format(&headers)?;
    allow_access(&api)?;
    let payload = api.state.payload(PayloadKey::App(app), format).await;
    if payload.empty {
        return Ok(empty(StatusCode::NOT_FOUND));
    }
    Ok(negotiate::payload_reply(payload, format, false).await)
}

/// `GET vips/{vip}`: 200 with an empty document for an unknown VIP, as Java.
pub async fn vip(State(api): State<Arc<Api>>, Segment(vip): Segment, headers: HeaderMap) -> Result<Response, ApiError> {
    fetch(&api, PayloadKey::Vip(vip), &headers, false).await
}

/// `GET svips/{vip}`: as `vips`, by secure VIP address.
pub async fn svip(
    State(api): State<Arc<Api>>,
    Segment(vip): Segment,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    fetch(&api, PayloadKey::Svip(vip), &headers, false).await
}

/// `GET apps/{app}/{id}`.
pub async fn instance(
    State(api): State<Arc<Api>>,
    InstancePath { app, id }: InstancePath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let format = negotiate::reply_format(&headers)?;
    complete(&api)?;
    let view = api.state.with_registry(|r, now| r.instance(&app, &id, now));
    Ok(instance_reply(view, format))
}

/// `GET instances/{id}`: an instance of any application.
pub async fn instance_by_id(
    State(api): State<Arc<Api>>,
    Segment(id): Segment,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let format = negotiate::reply_format(&headers)?;
    complete(&api)?;
    let view = api.state.with_registry(|r, now| r.find_instance(&id, now));
    Ok(instance_reply(view, format))
}

/// `POST apps/{app}`: a registration.
#[tracing::instrument(level = "debug", skip_all, fields(app = %app))]
pub async fn register(
    State(api): State<Arc<Api>>,
    AppPath(app): AppPath,
    auth: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (format, latin1) = negotiate::declared_format(&headers)?;
    let (now, limits, json) = (
        api.state.now(),
        api.input.limits.instance,
        negotiate::json_request(&headers),
    );
    let registration = negotiate::decode_body(&headers, body, api.max_body, &api.input, latin1, move |input| {
        codec::decode_registration_from(input, format, now, limits).map_err(|e| match e {
            RegistrationError::Decode(e) => ApiError::Unparseable {
                detail: e.message,
                json,
            },
            RegistrationError::OverLimit(e) => ApiError::OverLimit(e),
        })
    })
    .await?;
    codec::validate_registration(&registration, &app).map_err(|message| ApiError::Validation {
        message,
        format: negotiate::reply_format(&headers).unwrap_or(Format::Xml),
    })?;
    let writer = writer(&headers, caller(auth))?;
    let command = Command::Register {
        info: registration.info,
        writer,
    };
    reply(api.state.apply(command).reply, &headers)
}

/// `PUT apps/{app}/{id}`: a heartbeat. Most heartbeats do not come through here but through
/// [`super::heartbeat`], which answers the plain ones before routing with [`renew_instance`].
pub async fn renew(
    State(api): State<Arc<Api>>,
    InstancePath { app, id }: InstancePath,
    auth: Option<Extension<Caller>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    renew_instance(&api, app, id, caller(auth), query.as_deref(), &headers)
}

/// A heartbeat for `app` (upper-cased) and `id` from `caller`, with its query string.
#[tracing::instrument(level = "trace", skip_all, fields(app = %app, id = %id))]
pub fn renew_instance(
    api: &Api,
    app: String,
    id: String,
    caller: Caller,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let writer = writer(headers, caller)?;
    let params = route::query(query);
    // Java renews first: an unknown instance is 404 whatever the parameters say.
    let last_dirty_timestamp = match dirty_timestamp(params) {
        Ok(t) => t,
        Err(_) if !api.state.with_registry(|r, _| r.contains(&app, &id)) => {
            return Ok(empty(StatusCode::NOT_FOUND));
        }
        Err(e) => return Err(e),
    };
    // `overriddenstatus` only matters for a peer's heartbeat (Java reads it nowhere else), so a
    // client's query is not searched for it.
    let overridden_status = if writer.is_replication() {
        params
            .get("overriddenstatus")
            .map(|s| parse_status(&s, "overriddenstatus"))
            .transpose()?
    } else {
        None
    };
    let command = Command::Renew {
        app,
        id,
        writer,
        overridden_status,
        last_dirty_timestamp,
    };
    reply(api.state.apply(command).reply, headers)
}

/// `DELETE apps/{app}/{id}`: a cancellation.
#[tracing::instrument(level = "debug", skip_all, fields(app = %app, id = %id))]
pub async fn cancel(
    State(api): State<Arc<Api>>,
    InstancePath { app, id }: InstancePath,
    auth: Option<Extension<Caller>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let writer = writer(&headers, caller(auth))?;
    if crate::mutants::on("keep-cancelled") && api.state.with_registry(|r, _| r.contains(&app, &id)) {
        return reply(Reply::Ok, &headers);
    }
    let command = Command::Cancel { app, id, writer };
    reply(api.state.apply(command).reply, &headers)
}

/// `PUT apps/{app}/{id}/status?value=` sets a status override; `DELETE` removes it (with
/// `value`, the status to fall back to).
pub async fn status_override(
    State(api): State<Arc<Api>>,
    method: Method,
    path: InstancePath,
    auth: Option<Extension<Caller>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let set = method == Method::PUT;
    change_override(&api, path, caller(auth), set, query.as_deref(), &headers)
}

#[tracing::instrument(level = "debug", skip_all, fields(app = %app, id = %id, set))]
fn change_override(
    api: &Api,
    InstancePath { app, id }: InstancePath,
    caller: Caller,
    set: bool,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let writer = writer(headers, caller)?;
    let params = route::query(query);
    // Java looks the instance up before it reads the parameters.
    let Some((current, overridden)) = api.state.with_registry(|r, now| {
        r.instance(&app, &id, now)
            .map(|v| (v.info.status, v.info.overridden_status))
    }) else {
        return Ok(empty(StatusCode::NOT_FOUND));
    };
    let status = match params.get("value") {
        Some(v) => parse_status(&v, "value")?,
        None if set => {
            return Err(ApiError::Invalid(
                "the query parameter `value` (the new status) is required".into(),
            ));
        }
        None => Status::Unknown,
    };
    // Java parses lastDirtyTimestamp only when it is used: when something changes.
    let changes = if set {
        current != status
    } else {
        overridden != Status::Unknown
    };
    let last_dirty_timestamp = match dirty_timestamp(params) {
        Ok(t) => t,
        Err(_) if !changes => None,
        Err(e) => return Err(e),
    };
    let command = if set {
        Command::SetStatus {
            app,
            id,
            status,
            last_dirty_timestamp,
            writer,
        }
    } else {
        Command::DeleteStatusOverride {
            app,
            id,
            status,
            last_dirty_timestamp,
            writer,
        }
    };
    reply(api.state.apply(command).reply, headers)
}

/// `PUT apps/{app}/{id}/metadata?k=v...`: Java takes the first value of a repeated key, and
/// drops a parameter without a name.
#[tracing::instrument(level = "debug", skip_all, fields(app = %app, id = %id))]
pub async fn metadata(
    State(api): State<Arc<Api>>,
    InstancePath { app, id }: InstancePath,
    auth: Option<Extension<Caller>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    writer(&headers, caller(auth))?;
    let mut entries = Metadata::new();
    for (k, v) in route::query(query.as_deref()).pairs().filter(|(k, _)| !k.is_empty()) {
        entries.insert_first(k.into_owned(), v.into_owned());
    }
    reply(update_metadata(&api, app, id, entries).await, &headers)
}

/// `POST peerreplication/batch`: a peer's replicated writes.
pub async fn batch(
    State(api): State<Arc<Api>>,
    auth: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    peer::batch(&api, caller(auth), &headers, body).await
}

/// `PUT asg/{asg}/status`: refused, this is not an AWS registry.
pub async fn asg_status(Segment(asg): Segment) -> Result<Response, ApiError> {
    Err(ApiError::Invalid(format!(
        "cannot set the status of ASG {asg}: ASG status needs an AWS registry, and this one is not"
    )))
}

/// `GET status`: Java's `StatusInfo`.
pub async fn status(State(api): State<Arc<Api>>, headers: HeaderMap) -> Result<Response, ApiError> {
    let format = negotiate::reply_format(&headers)?;
    Ok(server_status(&api, format))
}

/// A registry payload (`apps`, `apps/delta`, `vips/...`) after the access checks; gzipped when
/// `gzip_allowed` and the client asks (Java compresses only the full and delta fetches).
async fn fetch(api: &Api, key: PayloadKey, headers: &HeaderMap, gzip_allowed: bool) -> Result<Response, ApiError> {
    let format = negotiate::reply_format(headers)?;
    allow_access(api)?;
    let payload = api.state.payload(key, format).await;
    let gzip = gzip_allowed && negotiate::accepts_gzip(headers);
    Ok(negotiate::payload_reply(payload, format, gzip).await)
}

fn instance_reply(view: Option<InstanceView>, format: Format) -> Response {
    match view {
        Some(view) => negotiate::document(StatusCode::OK, codec::encode_instance(&view, format), format),
        None => empty(StatusCode::NOT_FOUND),
    }
}

/// Fetches wait for a complete registry (503 until then, so clients try their next server); then
/// Java refuses them (403) after an empty start until the wait time has passed.
fn allow_access(api: &Api) -> Result<(), ApiError> {
    complete(api)?;
    if api.state.allow_access() {
        Ok(())
    } else {
        Err(ApiError::Forbidden)
    }
}

/// Instance lookups wait for a complete registry too.
fn complete(api: &Api) -> Result<(), ApiError> {
    if api.health.is_complete() {
        Ok(())
    } else {
        Err(ApiError::Incomplete)
    }
}

fn parse_status(value: &str, name: &str) -> Result<Status, ApiError> {
    Status::parse_exact(value).ok_or_else(|| {
        ApiError::Invalid(format!(
            "unknown status {value:?} in `{name}`; expected one of UP, DOWN, STARTING, OUT_OF_SERVICE, UNKNOWN"
        ))
    })
}

fn dirty_timestamp(params: route::Query<'_>) -> Result<Option<i64>, ApiError> {
    match params.get("lastDirtyTimestamp").as_deref() {
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
        Reply::OverLimit(e) => return Err(ApiError::OverLimit(e)),
    })
}

/// `PUT apps/{app}/{id}/metadata`: the stored instance is copied and merged without the registry
/// lock (on a blocking thread when it is large), so the lock is held for O(1) per new key; the
/// replaced copy is freed without the lock too.
async fn update_metadata(api: &Api, app: String, id: String, entries: Metadata) -> Reply {
    let state = &api.state;
    if crate::mutants::on("stall-heartbeats") {
        // The old O(registry) update under the lock, as a stall of its own.
        state.with_registry(|_, _| std::thread::sleep(std::time::Duration::from_secs(30)));
    }
    let Some(base) = state.with_registry(|r, _| r.stored(&app, &id)) else {
        return state.apply(Command::UpdateMetadata { app, id, entries }).reply;
    };
    let large = base.text_bytes() > api.input.limits.blocking_threshold;
    let merge = {
        let (base, entries) = (base.clone(), entries.clone());
        move || {
            let mut merged = (*base).clone();
            merged.metadata.merge(&entries);
            Box::new(merged)
        }
    };
    let merged = if large {
        match tokio::task::spawn_blocking(merge).await {
            Ok(merged) => merged,
            Err(_) => return state.apply(Command::UpdateMetadata { app, id, entries }).reply,
        }
    } else {
        merge()
    };
    let command = Command::MergeMetadata {
        app,
        id,
        entries,
        base: base.clone(),
        merged,
    };
    let reply = state.apply(command).reply;
    if large {
        tokio::task::spawn_blocking(move || drop(base));
    }
    reply
}

/// Memory figures for the status document: (total available, in use), from /proc.
fn memory_mb() -> (u64, u64) {
    let kb = |text: &str, key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let total = std::fs::read_to_string("/proc/meminfo")
        .map(|t| kb(&t, "MemTotal:"))
        .unwrap_or(0);
    let used = std::fs::read_to_string("/proc/self/status")
        .map(|t| kb(&t, "VmRSS:"))
        .unwrap_or(0);
    (total / 1024, used / 1024)
}

/// `GET status`: Java's `StatusInfo` (general stats, replica stats and this server's own instance).
fn server_status(api: &Api, format: Format) -> Response {
    let uptime_ms = (api.state.now() - api.started_at).max(0);
    let (total, used) = memory_mb();
    let percent = (used * 100).checked_div(total).unwrap_or(0);
    let general = [
        (
            "num-of-cpus",
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .to_string(),
        ),
        ("total-avail-memory", format!("{total}mb")),
        ("current-memory-usage", format!("{used}mb ({percent}%)")),
        (
            "server-uptime",
            format!("{:02}:{:02}", uptime_ms / 3_600_000, (uptime_ms / 60_000) % 60),
        ),
    ];
    let replicas = api.peer_urls();
    let application = [
        ("registered-replicas", replicas.join(",")),
        ("available-replicas", String::new()),
        (
            "unavailable-replicas",
            replicas.iter().map(|r| format!("{r},")).collect::<String>(),
        ),
    ];
    let me = api.self_instance();
    let info = codec::status::StatusInfo {
        general: &general,
        application: &application,
        instance: &me,
    };
    let body = codec::status::encode(&info, format);
    negotiate::document(StatusCode::OK, body, format)
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderName, HeaderValue};

    use super::*;

    #[test]
    fn the_writer_is_read_from_the_replication_headers() {
        let of = |pairs: &[(&str, &'static str)]| {
            let mut sent = HeaderMap::new();
            for (name, value) in pairs {
                let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
                sent.append(name, HeaderValue::from_static(value));
            }
            writer(&sent, Caller::Trusted).unwrap()
        };
        assert_eq!(of(&[("accept", "application/json")]), Writer::Client);
        assert_eq!(of(&[("x-netflix-discovery-replication", "true")]), Writer::JAVA);
        assert_eq!(of(&[("X-Netflix-Discovery-Replication", "true")]), Writer::JAVA);
        assert_eq!(of(&[("x-netflix-discovery-replication", "false")]), Writer::Client);
        // The first value counts, as `HeaderMap::get` takes it.
        let repeated = [
            ("x-netflix-discovery-replication", "false"),
            ("x-netflix-discovery-replication", "true"),
        ];
        assert_eq!(of(&repeated), Writer::Client);
        // Ours wins over Java's, whatever its value and order.
        let both = [
            ("x-netflix-discovery-replication", "true"),
            ("x-eureka-operator-replica", ""),
        ];
        assert_eq!(of(&both), Writer::REPLICA);
        assert_eq!(of(&[("x-eureka-operator-replica", "x")]), Writer::REPLICA);
    }
}
