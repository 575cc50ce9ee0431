//! `POST peerreplication/batch`: a peer's replication batch applied item by item with
//! replication semantics, answered with one status per item (409 items carry our copy).

use axum::{
    body::Body,
    http::{HeaderMap, HeaderName, StatusCode},
    response::Response,
};

use super::{
    Api,
    auth::Caller,
    negotiate::{self, ApiError},
};
use crate::{
    codec::{
        Format,
        batch::{self, ItemResponse, ReplicationItem},
    },
    registry::{Command, ReplicationAction, Reply, Writer, instance::Status},
};

/// [`batch::REPLICA_HEADER`], as a header name.
pub const REPLICA_HEADER: HeaderName = HeaderName::from_static(batch::REPLICA_HEADER);

/// Java's marker on single-operation replication calls (`"true"` exactly).
pub const JAVA_REPLICATION_HEADER: HeaderName = HeaderName::from_static("x-netflix-discovery-replication");

pub async fn batch(api: &Api, caller: Caller, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    if !caller.may_replicate() {
        return Err(ApiError::NotAPeer);
    }
    let writer = if headers.contains_key(REPLICA_HEADER) {
        Writer::REPLICA
    } else {
        Writer::JAVA
    };
    let (now, limits) = (api.state.now(), api.input.limits.instance);
    let items = negotiate::decode_body(headers, body, api.max_body, &api.input, false, move |input| {
        batch::decode_list_from(input, now, limits).map_err(|e| ApiError::Unparseable {
            detail: e.message,
            json: true,
        })
    })
    .await?;
    let responses: Vec<ItemResponse> = items.into_iter().map(|item| apply(api, item, writer)).collect();
    Ok(negotiate::document(
        StatusCode::OK,
        batch::encode_response(&responses),
        Format::Json,
    ))
}

fn status_code(code: u16) -> ItemResponse {
    ItemResponse {
        status_code: code,
        entity: None,
    }
}

/// Applies one replicated item and answers it as Java's `PeerReplicationResource` would.
fn apply(api: &Api, item: ReplicationItem, writer: Writer) -> ItemResponse {
    if let Some(e) = item
        .over_limit
        .as_ref()
        .filter(|_| item.action == ReplicationAction::Register)
    {
        // Java reports 200 for every Register item; the instance is not stored.
        api.metrics.limit_refused(e.kind());
        tracing::warn!(error = %e, id = %item.id, "refused a replicated instance over a cap");
        return status_code(200);
    }
    let command = match command(item, writer) {
        Ok(command) => command,
        Err(response) => return response,
    };
    let is_register = matches!(command, Command::Register { .. });
    match api.state.apply(command).reply {
        Reply::Registered | Reply::Ok | Reply::Unchanged => status_code(200),
        Reply::NotFound => status_code(404),
        Reply::Conflict(view) => ItemResponse {
            status_code: 409,
            entity: Some(*view),
        },
        Reply::Refused(message) => {
            tracing::info!(%message, "refused a replicated write");
            status_code(if is_register { 200 } else { 409 })
        }
        Reply::OverLimit(e) => {
            api.metrics.limit_refused(e.kind());
            tracing::warn!(error = %e, "refused a replicated write over a cap");
            status_code(if is_register { 200 } else { 400 })
        }
    }
}

/// The registry command an item asks for, or the answer to an item that cannot be applied.
fn command(item: ReplicationItem, writer: Writer) -> Result<Command, ItemResponse> {
    let exact = |s: Option<&str>| match s {
        None => Ok(None),
        Some(s) => Status::parse_exact(s).map(Some).ok_or(status_code(500)),
    };
    let (app, id, last_dirty_timestamp) = (item.app_name, item.id, item.last_dirty_timestamp);
    Ok(match item.action {
        ReplicationAction::Register => register(item.instance, &id, writer)?,
        ReplicationAction::Heartbeat => Command::Renew {
            overridden_status: exact(item.overridden_status.as_deref())?,
            app,
            id,
            writer,
            last_dirty_timestamp,
        },
        ReplicationAction::Cancel if item.eviction => Command::Evict { app, id },
        ReplicationAction::Cancel => match last_dirty_timestamp {
            Some(last_dirty_timestamp) => Command::CancelCopy {
                app,
                id,
                writer,
                last_dirty_timestamp,
            },
            None => Command::Cancel { app, id, writer },
        },
        ReplicationAction::StatusUpdate => Command::SetStatus {
            status: exact(item.status.as_deref())?.ok_or(status_code(500))?,
            app,
            id,
            last_dirty_timestamp,
            writer,
        },
        ReplicationAction::DeleteStatusOverride => Command::DeleteStatusOverride {
            status: exact(item.status.as_deref())?.unwrap_or(Status::Unknown),
            app,
            id,
            last_dirty_timestamp,
            writer,
        },
    })
}

/// A replicated Register: Java answers 200 to every one, valid or not, and stores only the valid.
fn register(
    instance: Option<crate::registry::instance::InstanceInfo>,
    id: &str,
    writer: Writer,
) -> Result<Command, ItemResponse> {
    let Some(info) = instance else {
        return Err(status_code(500));
    };
    let registration = crate::codec::Registration {
        info,
        data_center: crate::codec::DataCenter::Named,
    };
    if let Err(message) = crate::codec::validate_registration(&registration, &registration.info.app) {
        tracing::warn!(%message, id = %id, "ignored an invalid replicated registration");
        return Err(status_code(200));
    }
    Ok(Command::Register {
        info: registration.info,
        writer,
    })
}
