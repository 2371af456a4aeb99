//! One watch-all recorder per replica: every event the replica's watch
//! delivers, in the history's terms. A stream the server ends is reopened
//! after the last seq delivered (or bookmarked); if the replica cannot
//! resume there (OUT_OF_RANGE: it restarted, or its follower lost events and
//! ended its watches), the recording is marked incomplete and goes on from
//! the present as a new segment: the contract promises no gap across a
//! resume, not across a fresh watch, so each segment is checked on its own.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use respcoord::proto::v1::{self as pb, lifecycle_event::Kind};
use respcoord_client::CancellationToken;
use tonic::{Code, Status};

use crate::{
    cluster::RawClient,
    history::{EventKind, WatchedEvent},
    watch_check::Recording,
    workload::raw_client,
};

/// A lifecycle event in the history's terms.
pub fn watched(event: &pb::LifecycleEvent) -> Option<WatchedEvent> {
    let kind = match event.kind.as_ref()? {
        Kind::Started(s) => EventKind::Started {
            response: s.response_id,
        },
        Kind::CancelRequested(c) => EventKind::CancelRequested {
            response: c.response_id,
        },
        Kind::Ended(e) => EventKind::Ended {
            response: e.response_id,
        },
        Kind::Terminated(_) => EventKind::Terminated,
    };
    Some(WatchedEvent {
        session: event.session_id.clone(),
        revision: event.revision,
        seq: event.seq,
        kind,
    })
}

#[derive(Default)]
struct Rec {
    /// Uninterrupted stretches of the watch, oldest first (never empty).
    segments: Vec<Vec<WatchedEvent>>,
    complete: bool,
    /// Why the watch was reopened, each time.
    reopened: Vec<String>,
    /// Every event at or below this seq has been delivered.
    position: u64,
}

/// One replica's watch-all, recorded from before the load until stopped.
pub struct WatchRecorder {
    replica: usize,
    rec: Arc<Mutex<Rec>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl WatchRecorder {
    /// Opens the watch on `endpoint` (replica `replica`) and returns once it
    /// is open, so every event after this call is recorded.
    pub async fn open(replica: usize, endpoint: &str) -> Result<Self, Status> {
        let mut client = raw_client(endpoint);
        let first = client
            .watch(pb::WatchRequest::default())
            .await?
            .into_inner();
        let rec = Arc::new(Mutex::new(Rec {
            segments: vec![Vec::new()],
            complete: true,
            ..Rec::default()
        }));
        let stop = CancellationToken::new();
        let task = tokio::spawn(record(client, first, Arc::clone(&rec), stop.clone()));
        Ok(Self {
            replica,
            rec,
            stop,
            task,
        })
    }

    /// Whether the recording holds `session`'s event of `kind`.
    pub fn saw(&self, session: &str, kind: EventKind) -> bool {
        let rec = self.rec.lock().unwrap_or_else(PoisonError::into_inner);
        rec.segments
            .iter()
            .flatten()
            .any(|e| e.session == session && e.kind == kind)
    }

    pub fn replica(&self) -> usize {
        self.replica
    }

    /// Stops recording: one recording per segment, and why the watch was
    /// reopened.
    pub async fn stop(self) -> (Vec<Recording>, Vec<String>) {
        self.stop.cancel();
        let _ = self.task.await;
        let rec = std::mem::take(&mut *self.rec.lock().unwrap_or_else(PoisonError::into_inner));
        let recordings = (rec.segments.into_iter())
            .map(|events| Recording {
                replica: self.replica,
                events,
                complete: rec.complete,
            })
            .collect();
        (recordings, rec.reopened)
    }
}

async fn record(
    mut client: RawClient,
    first: tonic::Streaming<pb::WatchResponse>,
    rec: Arc<Mutex<Rec>>,
    stop: CancellationToken,
) {
    let lock = || rec.lock().unwrap_or_else(PoisonError::into_inner);
    let mut stream = Some(first);
    loop {
        let Some(mut open) = stream.take() else {
            // Reopen after the last position: gap-free, or OUT_OF_RANGE
            // (the replica restarted, or we fell out of its window).
            let after = lock().position;
            let request = pb::WatchRequest {
                session_id: String::new(),
                after_revision: None,
                after_seq: Some(after),
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                reply = client.watch(request) => match reply {
                    Ok(reply) => stream = Some(reply.into_inner()),
                    Err(status) if status.code() == Code::OutOfRange => {
                        {
                            let mut rec = lock();
                            rec.complete = false;
                            rec.segments.push(Vec::new());
                            rec.reopened.push(format!(
                                "after seq {after}: OUT_OF_RANGE; a new segment from now"
                            ));
                        }
                        if let Ok(reply) = client.watch(pb::WatchRequest::default()).await {
                            stream = Some(reply.into_inner());
                        }
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            continue;
        };
        let why = loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                message = open.message() => match message {
                    Ok(Some(message)) => {
                        let mut rec = lock();
                        for event in &message.events {
                            rec.position = rec.position.max(event.seq);
                            if let Some(event) = watched(event) {
                                if let Some(segment) = rec.segments.last_mut() {
                                    segment.push(event);
                                }
                            }
                        }
                        rec.position = rec.position.max(message.progress_seq);
                    }
                    Ok(None) => break "the stream ended".to_owned(),
                    Err(status) => break format!("{:?}: {}", status.code(), status.message()),
                }
            }
        };
        {
            let mut rec = lock();
            let position = rec.position;
            rec.reopened.push(format!("{why} (at seq {position})"));
        }
    }
}
