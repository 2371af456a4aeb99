//! The live feeds: a Watch relayed as server-sent events. Each feed is one
//! Watch stream of the service, so it counts against `--max-watchers`, and
//! a page that reads slower than its session's events is ended with the
//! watch's RESOURCE_EXHAUSTED (an `error` event) instead of holding up
//! anything: the body is produced only as fast as the socket takes it.

use std::{collections::VecDeque, convert::Infallible};

use axum::{
    extract::State,
    http::HeaderMap,
    response::{sse::Event, Response},
};
use futures_util::{stream, Stream, StreamExt};
use serde::Serialize;

use super::{history, json_event, list, sse, ApiError, ApiQuery, ListQuery, SessionQuery, WebView};
use crate::{
    grpc::watch::WatchStream,
    proto::{
        timeline::{
            Changed, EventJson, ResponseJson, SessionChange, SessionChangeJson, TeardownJson,
            Timeline,
        },
        v1::{self as pb, response_coordinator_server::ResponseCoordinator},
    },
};

/// `GET /api/v1/sessions/feed`: a snapshot of the listing (unless resuming
/// with `after_seq`), then every change of a listed session.
pub async fn sessions(
    State(view): State<WebView>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Response, ApiError> {
    let (snapshot, after_seq) = match query.after_seq {
        Some(seq) => (None, seq),
        None => {
            let listing = list(&view, &headers, &query).await?;
            let event = json_event("snapshot", Some(listing.seq), &listing.json());
            (Some(event), listing.seq)
        }
    };
    let request = view.call(
        &headers,
        pb::WatchRequest {
            session_id: String::new(),
            after_revision: None,
            after_seq: Some(after_seq),
        },
    )?;
    let watch = match view.service.watch(request).await {
        Ok(watch) => watch.into_inner(),
        // A resume point gone (a restarted replica's seqs start afresh):
        // an `error` event, as a session feed says it, so the page reloads.
        Err(status) if status.code() == tonic::Code::OutOfRange => {
            return Ok(sse(stream::iter([Ok(ApiError::status(status).event())])));
        }
        Err(status) => return Err(ApiError::status(status)),
    };
    let prefix = query.prefix;
    let changes = relay(watch, move |event, out| {
        if event.session_id.starts_with(&prefix) {
            let session = SessionChange::after(&event);
            out.push_back(json_event(
                "change",
                Some(event.seq),
                &SessionChangeMessage {
                    event: EventJson::from(&event),
                    session: SessionChangeJson::from(&session),
                },
            ));
        }
    });
    Ok(sse(stream::iter(snapshot.map(Ok)).chain(changes)))
}

#[derive(Serialize)]
struct SessionChangeMessage<'a> {
    event: EventJson<'a>,
    session: SessionChangeJson<'a>,
}

/// `GET /api/v1/session/feed`: the session's snapshot (unless resuming
/// with `after_revision`), then each of its events with the timeline rows
/// it changed.
pub async fn session(
    State(view): State<WebView>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<SessionQuery>,
) -> Result<Response, ApiError> {
    let resume = query.after_revision;
    // A snapshot lists every retained event; a resume sends those after
    // its revision.
    let history = history(&view, &headers, &query.id, resume.unwrap_or(0)).await?;
    let mut first = Vec::new();
    match resume {
        None => first.push(json_event(
            "snapshot",
            Some(history.state.revision),
            &history.json(),
        )),
        Some(after) if after < history.oldest_revision => {
            let error = ApiError::status(tonic::Status::out_of_range(format!(
                "after_revision={after} is no longer retained (resume from {} or later)",
                history.oldest_revision
            )));
            return Ok(sse(stream::iter([Ok(error.event())])));
        }
        Some(_) => {
            for (event, changed) in &history.events {
                first.push(event_message(&history.timeline, event, *changed));
            }
        }
    }
    let mut timeline = history.timeline;
    let events = relay(history.watch, move |event, out| {
        let changed = timeline.apply(&event);
        out.push_back(event_message(&timeline, &event, changed));
    });
    Ok(sse(stream::iter(first.into_iter().map(Ok)).chain(events)))
}

#[derive(Serialize)]
struct EventMessage<'a> {
    event: EventJson<'a>,
    /// The rows the event changed (a supersede's `started` changes two).
    responses: Vec<ResponseJson>,
    session: SessionChangeJson<'a>,
    terminated: Option<TeardownJson>,
}

fn event_message(timeline: &Timeline, event: &pb::LifecycleEvent, changed: Changed) -> Event {
    let session = SessionChange::after(event);
    json_event(
        "event",
        Some(event.revision),
        &EventMessage {
            event: EventJson::from(event),
            responses: timeline
                .changed_rows(changed)
                .map(ResponseJson::from)
                .collect(),
            session: SessionChangeJson::from(&session),
            terminated: timeline.terminated().map(TeardownJson::from),
        },
    )
}

/// A watch as server-sent events: `on_event` turns each lifecycle event
/// into messages; a bookmark becomes a comment; the watch's error (fell
/// behind, shutdown of the history) an `error` event that ends the feed.
fn relay(
    watch: WatchStream,
    on_event: impl FnMut(pb::LifecycleEvent, &mut VecDeque<Event>) + Send + 'static,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    struct Relay<F> {
        watch: WatchStream,
        on_event: F,
        pending: VecDeque<Event>,
        done: bool,
    }
    let relay = Relay {
        watch,
        on_event,
        pending: VecDeque::new(),
        done: false,
    };
    stream::unfold(relay, |mut relay| async move {
        loop {
            if let Some(event) = relay.pending.pop_front() {
                return Some((Ok(event), relay));
            }
            if relay.done {
                return None;
            }
            match relay.watch.next().await {
                Some(Ok(message)) if message.events.is_empty() => {
                    let bookmark = format!("bookmark {}", message.progress_seq);
                    relay.pending.push_back(Event::default().comment(bookmark));
                }
                Some(Ok(message)) => {
                    for event in message.events {
                        (relay.on_event)(event, &mut relay.pending);
                    }
                }
                Some(Err(status)) => {
                    relay.pending.push_back(ApiError::status(status).event());
                    relay.done = true;
                }
                None => relay.done = true,
            }
        }
    })
}
