//! `GET link/apps`: this registry's export view for another cluster's link puller (the protocol
//! is in [`crate::links::wire`]). Encoded per request: the answer depends on the puller's
//! version and lists, and a poll when nothing changed costs an empty document.

use axum::{
    body::Body,
    extract::{RawQuery, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::Response,
};
use std::sync::Arc;

use super::{
    Api,
    negotiate::{self, ApiError},
};
use crate::{
    cache::gzip,
    codec::{self, Format},
    links::wire,
};

pub async fn apps(
    State(api): State<Arc<Api>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Some(serving) = api.links.clone() else {
        return Err(ApiError::NoRoute("link/apps".into()));
    };
    if let Some(requester) = headers.get(wire::CLUSTER_HEADER).and_then(|v| v.to_str().ok())
        && serving.identity.current().as_deref() == Some(requester)
    {
        return Err(ApiError::Conflict(format!(
            "this link points back at cluster {requester:?} itself: a cluster never imports its own instances"
        )));
    }
    let request = wire::Request::parse(query.as_deref()).map_err(ApiError::Invalid)?;
    if !api.health.is_complete() {
        return Err(ApiError::Incomplete);
    }
    let exported = |app: &str| request.wants(app) && !serving.cluster_local.contains(app);
    let epoch_matches = request.since.as_ref().is_some_and(|(e, _)| *e == serving.epoch);
    let (view, full) = api.state.with_registry(|r, _| {
        let changes = request
            .since
            .as_ref()
            .filter(|_| epoch_matches)
            .and_then(|(_, v)| r.export_changes_since(*v, &exported))
            .filter(|c| c.apps.len() <= serving.max_changed_apps);
        match changes {
            Some(c) => (c, false),
            None => (r.export_view(&exported), true),
        }
    });
    let names = (!full).then(|| wire::encode_names(view.apps.iter().map(|a| a.name.as_str())));
    let body = codec::encode_apps(&view, Format::Json);
    let gzip = negotiate::accepts_gzip(&headers) && body.len() > 1024;
    let body = if gzip {
        gzip::member(&[&gzip::deflate(&body, 1)], gzip::Sum::of(&body)).to_vec()
    } else {
        body
    };
    let mut resp = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(wire::EPOCH_HEADER, &serving.epoch)
        .header(wire::FULL_HEADER, if full { "true" } else { "false" });
    if gzip {
        resp = resp.header(header::CONTENT_ENCODING, "gzip");
    }
    if let Some(names) = names
        && let Ok(v) = HeaderValue::from_str(&names)
    {
        resp = resp.header(wire::APPS_HEADER, v);
    }
    resp.body(Body::from(body))
        .map_err(|e| ApiError::Internal(format!("failed to build the link answer: {e}")))
}
