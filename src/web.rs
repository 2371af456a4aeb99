//! The read-only web view (docs/web-ui.md, `--web-ui`): the live sessions
//! and one session's responses as a timeline, in a browser, following live.
//!
//! A second face of the gRPC service, not a second service: every request
//! is the same call a gateway or `respcoordctl` makes (ListSessions,
//! GetState, Watch), passed through the same [`Authenticator`] and answered
//! by the same [`CoordinatorService`], so validation, token scopes, the
//! watcher limit and the slow-watcher bound are the ones the API has. This
//! module only turns the answers into JSON and server-sent events, and a
//! [`Status`] into an HTTP status (in [`ApiError`], in one place). Rows of
//! the timeline come from `respcoord_proto::timeline`, the fold
//! `respcoordctl timeline` prints.
//!
//! Served on the metrics listener (HTTP/1.1), never the gRPC port: the view
//! is for people, reached over a port-forward, and keeps its routes off the
//! gateways' call path. Static assets are compiled in (`web/assets`): no
//! build step, no third-party requests.

mod feed;

use std::{collections::VecDeque, convert::Infallible, sync::Arc};

use axum::{
    extract::{Query, State},
    http::{header, HeaderMap, HeaderValue, StatusCode},
    response::{
        sse::{Event, KeepAlive, Sse},
        IntoResponse, Response,
    },
    routing::get,
    Router,
};
use serde::{Deserialize, Serialize};
use tonic::{metadata::MetadataValue, service::Interceptor, Code, Request, Status};

use crate::{
    auth::Authenticator,
    grpc::CoordinatorService,
    proto::{
        timeline::{
            open_retained, Changed, EventJson, ResponseJson, StateJson, TeardownJson, Timeline,
        },
        v1::{self as pb, response_coordinator_server::ResponseCoordinator},
    },
};

/// Sessions shown by one listing at most.
const MAX_LIST: usize = 1000;
/// Sessions a listing reads at most while filtering by prefix: past it the
/// answer says `truncated` rather than scanning a million sessions.
const MAX_SCAN: usize = 20_000;
/// Longest a session's retained history may take to arrive. It is already
/// held (memory) or stored (NATS), so only a session forgotten between the
/// state read and the watch (whose watch then waits for events that never
/// come) or a store in trouble takes this long.
const HISTORY_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// What the web view's handlers share.
#[derive(Clone)]
pub struct WebView {
    service: Arc<CoordinatorService>,
    auth: Authenticator,
}

impl WebView {
    pub fn new(service: Arc<CoordinatorService>, auth: Authenticator) -> Self {
        Self { service, auth }
    }

    /// `message` as a call from the holder of the request's bearer token:
    /// authenticated exactly as a gRPC call is.
    fn call<T>(&self, headers: &HeaderMap, message: T) -> Result<Request<T>, ApiError> {
        let mut request = Request::new(());
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let value = MetadataValue::try_from(value.as_bytes()).map_err(|_| {
                ApiError::status(Status::unauthenticated("malformed authorization"))
            })?;
            request.metadata_mut().insert("authorization", value);
        }
        let request = self.auth.clone().call(request).map_err(ApiError::status)?;
        let (metadata, extensions, ()) = request.into_parts();
        Ok(Request::from_parts(metadata, extensions, message))
    }
}

/// The routes: the page under `/ui/` (and `/`, which sends a browser
/// there), the API under `/api/v1/`.
pub fn router(view: WebView) -> Router {
    Router::new()
        .route("/", get(|| async { axum::response::Redirect::to("/ui/") }))
        .route(
            "/ui",
            get(|| async { axum::response::Redirect::permanent("/ui/") }),
        )
        .route(
            "/ui/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
        .route("/api/v1/sessions", get(sessions))
        .route("/api/v1/sessions/feed", get(feed::sessions))
        .route("/api/v1/session", get(session))
        .route("/api/v1/session/feed", get(feed::session))
        .with_state(view)
}

const INDEX: &str = include_str!("web/assets/index.html");
const APP_JS: &str = include_str!("web/assets/app.js");
const APP_CSS: &str = include_str!("web/assets/app.css");

/// A compiled-in asset. The policy allows only this origin's scripts and
/// requests: the page never reaches a third party.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
            ),
        ],
        body,
    )
        .into_response()
}

/// An API failure: an HTTP status and a message naming what was wrong.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    /// The gRPC code, for the feeds' `error` event.
    code: Code,
    message: String,
}

impl ApiError {
    /// The one mapping from the service's answers to HTTP.
    fn status(status: Status) -> Self {
        let http = match status.code() {
            Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::FailedPrecondition => StatusCode::CONFLICT,
            Code::ResourceExhausted | Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self {
            status: http,
            code: status.code(),
            message: status.message().to_owned(),
        }
    }

    fn invalid(message: impl Into<String>) -> Self {
        Self::status(Status::invalid_argument(message))
    }

    /// The feeds' `error` event: the code as the page reads it.
    fn event(&self) -> Event {
        let code = match self.code {
            Code::ResourceExhausted => "resource_exhausted",
            Code::OutOfRange => "out_of_range",
            Code::Unavailable => "unavailable",
            _ => "error",
        };
        json_event(
            "error",
            None,
            &ErrorJson {
                code,
                message: &self.message,
            },
        )
    }
}

#[derive(Serialize)]
struct ErrorJson<'a> {
    code: &'static str,
    message: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message });
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// A query string, refused as the API refuses anything else: 400 with
/// `{"error": ...}` naming the parameter (axum's own `Query` answers
/// `text/plain`).
pub struct ApiQuery<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiQuery<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(query)) => Ok(ApiQuery(query)),
            Err(rejection) => Err(ApiError::invalid(query_error(&rejection.body_text()))),
        }
    }
}

/// axum's "Failed to deserialize query string: limit: invalid digit found
/// in string" as "query: limit: invalid digit found in string".
fn query_error(text: &str) -> String {
    let detail = text
        .strip_prefix("Failed to deserialize query string: ")
        .unwrap_or(text);
    format!("query: {detail}")
}

/// One server-sent event with a JSON body.
fn json_event(name: &'static str, id: Option<u64>, data: &impl Serialize) -> Event {
    let event = Event::default().event(name);
    let event = match id {
        Some(id) => event.id(id.to_string()),
        None => event,
    };
    // Serializing our own JSON views cannot fail; say so if it ever does.
    event.json_data(data).unwrap_or_else(|error| {
        Event::default()
            .event("error")
            .data(format!("{{\"code\":\"error\",\"message\":\"{error}\"}}"))
    })
}

/// An event stream, kept alive by a comment when quiet.
fn sse(
    events: impl futures_util::Stream<Item = Result<Event, Infallible>> + Send + 'static,
) -> Response {
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

// ---- the listing ----

#[derive(Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    prefix: String,
    limit: Option<usize>,
    after_seq: Option<u64>,
}

impl ListQuery {
    fn limit(&self) -> Result<usize, ApiError> {
        match self.limit {
            None => Ok(200),
            Some(n @ 1..=MAX_LIST) => Ok(n),
            Some(n) => Err(ApiError::invalid(format!(
                "limit={n}: must be 1 to {MAX_LIST}"
            ))),
        }
    }
}

#[derive(Serialize)]
struct ListJson<'a> {
    /// A string: 64-bit, like the ids (docs/web-ui.md).
    #[serde(serialize_with = "crate::proto::timeline::id_text")]
    seq: u64,
    sessions: Vec<StateJson<'a>>,
    truncated: bool,
}

/// The sessions in scope whose id starts with `prefix`, and the seq a
/// watch-all resumes from.
struct Listing {
    seq: u64,
    sessions: Vec<pb::SessionState>,
    truncated: bool,
}

impl Listing {
    fn json(&self) -> ListJson<'_> {
        ListJson {
            seq: self.seq,
            sessions: self.sessions.iter().map(StateJson::from).collect(),
            truncated: self.truncated,
        }
    }
}

async fn list(view: &WebView, headers: &HeaderMap, query: &ListQuery) -> Result<Listing, ApiError> {
    let limit = query.limit()?;
    let mut listing = Listing {
        seq: 0,
        sessions: Vec::new(),
        truncated: false,
    };
    let mut token = String::new();
    let mut scanned = 0;
    loop {
        let request = view.call(
            headers,
            pb::ListSessionsRequest {
                page_size: 1000,
                page_token: token,
            },
        )?;
        let page = view
            .service
            .list_sessions(request)
            .await
            .map_err(ApiError::status)?
            .into_inner();
        if scanned == 0 {
            listing.seq = page.seq;
        }
        scanned += page.sessions.len();
        for state in page.sessions {
            if state.session_id.starts_with(&query.prefix) {
                if listing.sessions.len() == limit {
                    listing.truncated = true;
                    return Ok(listing);
                }
                listing.sessions.push(state);
            }
        }
        if page.next_page_token.is_empty() {
            return Ok(listing);
        }
        if scanned >= MAX_SCAN {
            listing.truncated = true;
            return Ok(listing);
        }
        token = page.next_page_token;
    }
}

async fn sessions(
    State(view): State<WebView>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Response, ApiError> {
    let listing = list(&view, &headers, &query).await?;
    Ok(axum::Json(listing.json()).into_response())
}

// ---- one session ----

#[derive(Deserialize)]
pub struct SessionQuery {
    id: String,
    after_revision: Option<u64>,
}

/// A session's state and its retained history, folded into responses; and
/// the watch that delivered it, still open for what comes next.
struct History {
    state: pb::SessionState,
    /// The history starts after this revision.
    oldest_revision: u64,
    /// The retained events past `keep_after`, each with the rows it changed.
    events: VecDeque<(pb::LifecycleEvent, Changed)>,
    timeline: Timeline,
    watch: crate::grpc::watch::WatchStream,
}

#[derive(Serialize)]
struct SessionJson<'a> {
    state: StateJson<'a>,
    oldest_revision: u64,
    events: Vec<EventJson<'a>>,
    responses: Vec<ResponseJson>,
    terminated: Option<TeardownJson>,
}

impl History {
    fn json(&self) -> SessionJson<'_> {
        SessionJson {
            state: StateJson::from(&self.state),
            oldest_revision: self.oldest_revision,
            events: self
                .events
                .iter()
                .map(|(event, _)| EventJson::from(event))
                .collect(),
            responses: self.timeline.responses().map(ResponseJson::from).collect(),
            terminated: self.timeline.terminated().map(TeardownJson::from),
        }
    }
}

/// Reads the session's state, then watches it from its oldest retained
/// event (where an OUT_OF_RANGE answer says the history now starts) up to
/// that state. Events past `keep_after` are kept for the caller to send.
async fn history(
    view: &WebView,
    headers: &HeaderMap,
    id: &str,
    keep_after: u64,
) -> Result<History, ApiError> {
    let request = view.call(
        headers,
        pb::GetStateRequest {
            session_id: id.to_owned(),
        },
    )?;
    let state = view
        .service
        .get_state(request)
        .await
        .map_err(ApiError::status)?
        .into_inner()
        .state
        .unwrap_or_default();
    let (watch, oldest_revision) = open_retained(|after| async move {
        let request = view
            .call(
                headers,
                pb::WatchRequest {
                    session_id: id.to_owned(),
                    after_revision: Some(after),
                    after_seq: None,
                },
            )
            .map_err(|error| Status::new(error.code, error.message))?;
        view.service.watch(request).await
    })
    .await
    .map_err(ApiError::status)?;
    let mut watch = watch.into_inner();
    let mut timeline = Timeline::new();
    let mut events = VecDeque::new();
    let deadline = tokio::time::Instant::now() + HISTORY_PATIENCE;
    while timeline.last_revision() < state.revision {
        use futures_util::StreamExt;
        let next = tokio::time::timeout_at(deadline, watch.next())
            .await
            .map_err(|_| {
                ApiError::status(Status::unavailable(format!(
                    "the session's history (to revision {}) did not arrive in {HISTORY_PATIENCE:?}; try again",
                    state.revision
                )))
            })?;
        match next {
            Some(Ok(message)) => {
                for event in message.events {
                    let changed = timeline.apply(&event);
                    if event.revision > keep_after {
                        events.push_back((event, changed));
                    }
                }
            }
            Some(Err(status)) => return Err(ApiError::status(status)),
            None => break,
        }
    }
    Ok(History {
        state,
        oldest_revision,
        events,
        timeline,
        watch,
    })
}

async fn session(
    State(view): State<WebView>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<SessionQuery>,
) -> Result<Response, ApiError> {
    let history = history(&view, &headers, &query.id, 0).await?;
    Ok(axum::Json(history.json()).into_response())
}

#[cfg(test)]
mod tests;
