//! `respcoordctl timeline`: one session's retained history as a swimlane,
//! one row per response (who started it, when, how long it ran, how it
//! ended and why), and with `--follow` each change as it happens.
//!
//! The rows come from `respcoord_proto::timeline`, the fold the server's web
//! view uses too; this module only reads the history and draws.

use respcoord_client::{pb, Client, ClientError};
use respcoord_proto::timeline::{
    open_retained, Changed, EventJson, ResponseJson, ResponseRow, StateJson, Teardown,
    TeardownJson, Timeline,
};
use serde::Serialize;
use tonic::Streaming;

use crate::{output::Printer, Failure, Output};

/// Longest the retained history may take to arrive: it is already held,
/// so only a session forgotten between the state read and the watch (a
/// watch that then waits for events that never come) takes this long.
const HISTORY_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// Width of the swimlane column, in characters.
const LANE: usize = 32;

/// Prints the session's timeline; with `follow`, keeps printing its changes
/// until the session ends (or the caller stops it).
pub(crate) async fn run(
    client: &Client,
    out: &Printer,
    session: &str,
    follow: bool,
) -> Result<(), Failure> {
    let state = client.get_state(session).await?;
    let (mut stream, oldest_revision) = open_history(client, session).await?;
    let mut timeline = Timeline::new();
    let changes_as_json = follow && out.0 == Output::Json;
    // The retained events, up to the state just read; later ones are live.
    let deadline = tokio::time::Instant::now() + HISTORY_PATIENCE;
    while timeline.last_revision() < state.revision {
        let message = tokio::time::timeout_at(deadline, stream.message())
            .await
            .map_err(|_| {
                ClientError::from(tonic::Status::deadline_exceeded(format!(
                    "the session's history (to revision {}) did not arrive in {HISTORY_PATIENCE:?}",
                    state.revision
                )))
            })??;
        let Some(message) = message else {
            break;
        };
        for event in message.events {
            let changed = timeline.apply(&event);
            if changes_as_json {
                print_change_json(out, &timeline, &event, changed)?;
            }
        }
    }
    match out.0 {
        Output::Json if !follow => out.json(&TimelineJson {
            state: StateJson::from(&state),
            oldest_revision,
            responses: timeline.responses().map(ResponseJson::from).collect(),
            terminated: timeline.terminated().map(TeardownJson::from),
        })?,
        Output::Json => {}
        Output::Text => {
            for line in render(&state, &timeline, oldest_revision) {
                out.line(&line)?;
            }
        }
    }
    if !follow {
        return Ok(());
    }
    while let Some(message) = stream.message().await? {
        for event in message.events {
            let changed = timeline.apply(&event);
            match out.0 {
                Output::Json => print_change_json(out, &timeline, &event, changed)?,
                Output::Text => {
                    for row in timeline.changed_rows(changed) {
                        out.line(&format!("{} {}", clock(event.unix_nanos), row_text(row)))?;
                    }
                    if let Some(teardown) = timeline
                        .terminated()
                        .filter(|t| t.at.revision == event.revision)
                    {
                        out.line(&teardown_text(teardown))?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// A watch of the session from its oldest retained event, and the revision
/// it starts after.
async fn open_history(
    client: &Client,
    session: &str,
) -> Result<(Streaming<pb::WatchResponse>, u64), Failure> {
    let (watch, after) = open_retained(|after| async move {
        let request = pb::WatchRequest {
            session_id: session.to_owned(),
            after_revision: Some(after),
            after_seq: None,
        };
        client.raw().watch(request).await
    })
    .await?;
    Ok((watch.into_inner(), after))
}

#[derive(Serialize)]
struct TimelineJson<'a> {
    state: StateJson<'a>,
    /// The history starts after this revision (0: from the first event).
    oldest_revision: u64,
    responses: Vec<ResponseJson>,
    terminated: Option<TeardownJson>,
}

#[derive(Serialize)]
struct ChangeJson<'a> {
    event: EventJson<'a>,
    responses: Vec<ResponseJson>,
}

/// `--follow -o json`: one object per event, with the rows it changed as
/// the event left them (a supersede's `started` changes two).
fn print_change_json(
    out: &Printer,
    timeline: &Timeline,
    event: &pb::LifecycleEvent,
    changed: Changed,
) -> std::io::Result<()> {
    out.json(&ChangeJson {
        event: EventJson::from(event),
        responses: timeline
            .changed_rows(changed)
            .map(ResponseJson::from)
            .collect(),
    })
}

/// The whole timeline as lines: a header with the state, the table with
/// its swimlane, idle gaps between responses, and the teardown.
pub(crate) fn render(state: &pb::SessionState, timeline: &Timeline, oldest: u64) -> Vec<String> {
    let mut lines = vec![crate::output::state_text(state)];
    if oldest > 0 {
        lines.push(format!(
            "history from revision {} (earlier events are no longer retained)",
            oldest + 1
        ));
    }
    if timeline.responses().len() == 0 {
        lines.push("no responses in the retained history".to_owned());
    } else {
        // Response ids are large numbers: the column fits the longest.
        let id_width = timeline
            .responses()
            .map(|row| row.response_id.to_string().len())
            .max()
            .unwrap_or(1)
            .max(6);
        lines.push(format!(
            "{:>id_width$}  {:<7} {:<12}  {:>9}  {:<LANE$}  outcome",
            "#", "source", "started", "ran", "lane"
        ));
        let window = Window::of(timeline);
        let mut previous_end: Option<i64> = None;
        for row in timeline.responses() {
            if let (Some(end), Some(start)) = (previous_end, row.started) {
                let idle = start.unix_nanos - end;
                if idle > 0 {
                    lines.push(format!("{:>id_width$}  idle {}", "", seconds(idle)));
                }
            }
            previous_end = row.ended.map(|end| end.at.unix_nanos);
            lines.push(format!(
                "{:>id_width$}  {:<7} {:<12}  {:>9}  {}  {}",
                row.response_id,
                short(row.source),
                row.started
                    .map_or_else(|| "?".to_owned(), |s| clock(s.unix_nanos)),
                row.duration_nanos().map_or_else(
                    || if row.is_live() {
                        "live".to_owned()
                    } else {
                        "?".to_owned()
                    },
                    seconds
                ),
                window.lane(row),
                outcome(row)
            ));
        }
    }
    if let Some(teardown) = timeline.terminated() {
        lines.push(teardown_text(teardown));
    }
    lines
}

/// One row for `--follow`.
fn row_text(row: &ResponseRow) -> String {
    format!(
        "response {} ({}): {}",
        row.response_id,
        short(row.source),
        outcome(row)
    )
}

fn teardown_text(teardown: Teardown) -> String {
    format!(
        "session torn down at {}: {}",
        clock(teardown.at.unix_nanos),
        short_reason(teardown.reason)
    )
}

/// How a response ended, and why: "superseded by 3 (vad) after 1.840 s",
/// "cancelled: requested by vad after 0.412 s".
fn outcome(row: &ResponseRow) -> String {
    let Some(end) = row.ended else {
        return match row.cancel_requested {
            Some(_) => "stopping".to_owned(),
            None => "live".to_owned(),
        };
    };
    let ran = row
        .duration_nanos()
        .map(|nanos| format!(" after {}", seconds(nanos)))
        .unwrap_or_default();
    match (end.status, row.superseded_by) {
        (pb::TerminalStatus::Cancelled, Some((by, source))) => {
            format!("superseded by {by} ({}){ran}", short(source))
        }
        (pb::TerminalStatus::Cancelled, None) => {
            format!("cancelled: {}{}{ran}", short_reason(end.reason), by(row))
        }
        (status, _) => format!(
            "{}{ran}",
            respcoord_proto::timeline::short_name(status.as_str_name())
        ),
    }
}

/// Who asked for a cancel, where the event says: " by vad".
fn by(row: &ResponseRow) -> String {
    match row.cancel_source {
        Some(source) if source != pb::Source::Unspecified => format!(" by {}", short(source)),
        _ => String::new(),
    }
}

fn short(source: pb::Source) -> &'static str {
    respcoord_proto::timeline::short_name(source.as_str_name())
}

fn short_reason(reason: pb::CancelReason) -> &'static str {
    respcoord_proto::timeline::short_name(reason.as_str_name())
}

/// Seconds with milliseconds: "1.840 s".
fn seconds(nanos: i64) -> String {
    format!("{:.3} s", nanos as f64 / 1e9)
}

/// The UTC time of day with milliseconds: "12:00:05.002".
fn clock(unix_nanos: i64) -> String {
    let millis = unix_nanos.div_euclid(1_000_000);
    let day_millis = millis.rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day_millis / 3_600_000,
        day_millis / 60_000 % 60,
        day_millis / 1000 % 60,
        day_millis % 1000
    )
}

/// The time the swimlane spans: from the first start seen to the last
/// time an event was seen.
struct Window {
    from: i64,
    to: i64,
}

impl Window {
    fn of(timeline: &Timeline) -> Self {
        let times = timeline.responses().flat_map(|row| {
            [
                row.started,
                row.cancel_requested,
                row.ended.map(|end| end.at),
            ]
            .into_iter()
            .flatten()
            .map(|stamp| stamp.unix_nanos)
        });
        let (from, to) = times.fold((i64::MAX, i64::MIN), |(lo, hi), t| (lo.min(t), hi.max(t)));
        Self { from, to }
    }

    fn column(&self, unix_nanos: i64) -> usize {
        let span = (self.to - self.from).max(1) as f64;
        let at = (unix_nanos - self.from) as f64 / span * (LANE - 1) as f64;
        (at.round() as usize).min(LANE - 1)
    }

    /// The response's span as a bar: `█` while it ran, `>` to the edge for
    /// a live one, `?` where its start is older than the history.
    fn lane(&self, row: &ResponseRow) -> String {
        let start = row.started.map_or(0, |s| self.column(s.unix_nanos));
        let end = match row.ended {
            Some(end) => self.column(end.at.unix_nanos),
            None => LANE - 1,
        };
        (0..LANE)
            .map(|column| match column {
                c if c < start || c > end => ' ',
                c if row.started.is_none() && c == start => '?',
                c if row.is_live() && c == end => '>',
                _ => '█',
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
