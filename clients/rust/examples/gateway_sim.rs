//! Two simulated gateways sharing sessions through one respcoord: a client
//! read loop that speaks responses, and a VAD that barges in. Each has its
//! own `Client` (its own connections and shared watch), as two processes
//! would; they share nothing else except, for the summary only, the clock
//! readings that measure how fast a barge-in reaches the other gateway.
//!
//! ```sh
//! cargo run --release -- serve &       # a coordinator on 127.0.0.1:50051
//! cargo run --release -p respcoord-client --example gateway_sim -- \
//!     --endpoint http://127.0.0.1:50051 --sessions 3 --turns 4
//! ```
//!
//! The read loop runs each turn with `Session::run`: the body produces
//! chunks faster than the audio sink plays them, and the sink checks the
//! response's fence before playing each one. When the VAD's Start
//! supersedes the response, the read loop's body is dropped at once, no
//! Finish is sent for it, and the chunks still queued for the sink are
//! dropped by the fence instead of talking over the new response.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use clap::Parser;
use respcoord_client::{
    Client, ClientError, ConnectOptions, Fence, Finished, RunOutcome, Session, Source, StopReason,
    Terminal, DEFAULT_ENDPOINT,
};
use tokio::sync::{mpsc, oneshot};

#[derive(Debug, Parser)]
#[command(about = "Two gateways (read loop and VAD) sharing sessions through respcoord")]
struct Args {
    /// The coordinator: http://host:port (TLS and tokens: see respcoordctl).
    #[arg(long, default_value = DEFAULT_ENDPOINT)]
    endpoint: String,
    /// Sessions (calls) to simulate at once.
    #[arg(long, default_value_t = 3)]
    sessions: usize,
    /// Turns of the read loop per session (the VAD barges in about as often).
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Session id prefix (default: unique per run, since terminated ids stay
    /// refused for the tombstone TTL).
    #[arg(long)]
    prefix: Option<String>,
}

/// When the VAD last called Start, per session: measurement only (two real
/// processes would log timestamps and compare them).
type Clock = Arc<Mutex<HashMap<String, Instant>>>;

#[derive(Default, Debug)]
struct Tally {
    completed: usize,
    barged_in: usize,
    played: usize,
    dropped_by_fence: usize,
    latencies: Vec<Duration>,
}

#[tokio::main]
async fn main() -> Result<(), ClientError> {
    let args = Args::parse();
    let options = ConnectOptions::new(args.endpoint.clone());
    // Two gateways, two connections.
    let reader = Client::connect(options.clone()).await?;
    let vad = Client::connect(options).await?;
    let prefix = args.prefix.clone().unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("sim-{:x}", nanos % 0xffff_ffff)
    });
    let clock: Clock = Arc::default();
    let tally = Arc::new(Mutex::new(Tally::default()));

    let mut tasks = Vec::new();
    for i in 0..args.sessions {
        let id = format!("{prefix}-{i}");
        tasks.push(tokio::spawn(read_loop(
            reader.session(&id)?,
            args.turns,
            Arc::clone(&clock),
            Arc::clone(&tally),
        )));
        tasks.push(tokio::spawn(vad_loop(
            vad.session(&id)?,
            args.turns,
            Arc::clone(&clock),
        )));
    }
    for task in tasks {
        match task.await {
            Ok(result) => result?,
            Err(panic) => std::panic::resume_unwind(panic.into_panic()),
        }
    }
    for i in 0..args.sessions {
        reader
            .session(&format!("{prefix}-{i}"))?
            .shutdown(Source::Client)
            .await?;
    }

    let mut tally = std::mem::take(&mut *tally.lock().unwrap());
    tally.latencies.sort();
    println!(
        "\nsummary: {} read-loop turns: {} completed, {} barged in; {} chunks played, {} late chunks dropped by the fence",
        tally.completed + tally.barged_in,
        tally.completed,
        tally.barged_in,
        tally.played,
        tally.dropped_by_fence
    );
    if !tally.latencies.is_empty() {
        let at =
            |q: f64| tally.latencies[((tally.latencies.len() as f64 - 1.0) * q).round() as usize];
        println!(
            "barge-in propagation (VAD's Start call -> read loop's body stopped), n={}: p50 {:?}, p99 {:?}, max {:?}",
            tally.latencies.len(),
            at(0.5),
            at(0.99),
            tally.latencies[tally.latencies.len() - 1]
        );
    }
    Ok(())
}

/// The client read loop: one response per turn, spoken through a sink that
/// checks the fence before every chunk.
async fn read_loop(
    session: Session,
    turns: usize,
    clock: Clock,
    tally: Arc<Mutex<Tally>>,
) -> Result<(), ClientError> {
    let (to_sink, sink_rx) = mpsc::channel::<Item>(256);
    let sink = tokio::spawn(audio_sink(
        session.id().to_owned(),
        sink_rx,
        Arc::clone(&tally),
    ));
    for turn in 0..turns {
        let to_sink = to_sink.clone();
        let name = session.id().to_owned();
        let outcome = session
            .run(Source::Client, |ctx| async move {
                println!(
                    "[read-loop] {name}: turn {turn}: response {} speaking",
                    ctx.response_id()
                );
                // The model streams 40 chunks, faster than the sink plays them.
                for _ in 0..40 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    if to_sink
                        .send(Item::Chunk(ctx.fence().clone()))
                        .await
                        .is_err()
                    {
                        return Err("sink gone");
                    }
                }
                // Finish once the output is out: the fence closes at Finish.
                let (flushed, done) = oneshot::channel();
                if to_sink.send(Item::Flush(flushed)).await.is_err() {
                    return Err("sink gone");
                }
                let _ = done.await;
                Ok(40)
            })
            .await?;
        let stopped_at = Instant::now();
        match outcome {
            RunOutcome::Completed {
                response_id,
                finished,
                ..
            } => {
                println!(
                    "[read-loop] {}: response {response_id} spoken in full, Finish applied: {:?}",
                    session.id(),
                    finished.map(|f| matches!(f, Finished::Applied(_)))
                );
                tally.lock().unwrap().completed += 1;
            }
            RunOutcome::Failed { error, .. } => println!("[read-loop] failed: {error}"),
            RunOutcome::Stopped {
                response_id,
                reason,
            } => {
                let called = clock.lock().unwrap().get(session.id()).copied();
                let latency = called
                    .filter(|_| reason == StopReason::Superseded)
                    .map(|called| stopped_at.saturating_duration_since(called));
                println!(
                    "[read-loop] {}: response {response_id} stopped ({reason:?}) {}; no Finish sent",
                    session.id(),
                    latency.map_or(String::new(), |l| format!("{l:?} after the VAD's call"))
                );
                let mut tally = tally.lock().unwrap();
                tally.barged_in += 1;
                tally.latencies.extend(latency);
            }
        }
        // The user speaks for a moment before the next turn.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    drop(to_sink);
    let _ = sink.await;
    Ok(())
}

/// What the read loop hands its output path.
enum Item {
    /// One chunk of a response's audio.
    Chunk(Fence),
    /// Acknowledge once everything before it is played or dropped.
    Flush(oneshot::Sender<()>),
}

/// Plays chunks at 20 ms each, only while their response is current.
async fn audio_sink(session: String, mut items: mpsc::Receiver<Item>, tally: Arc<Mutex<Tally>>) {
    let mut dropped_of = None;
    while let Some(item) = items.recv().await {
        let fence = match item {
            Item::Chunk(fence) => fence,
            Item::Flush(done) => {
                let _ = done.send(());
                continue;
            }
        };
        if fence.is_current() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            tally.lock().unwrap().played += 1;
        } else {
            if dropped_of != Some(fence.id()) {
                println!(
                    "[sink]      {session}: dropping late chunks of response {} ({:?})",
                    fence.id(),
                    fence.stop_reason()
                );
                dropped_of = Some(fence.id());
            }
            tally.lock().unwrap().dropped_by_fence += 1;
        }
    }
}

/// The VAD: hears the user barge in now and then, and starts a response of
/// its own, superseding whatever the read loop is saying.
async fn vad_loop(session: Session, turns: usize, clock: Clock) -> Result<(), ClientError> {
    for _ in 0..turns {
        tokio::time::sleep(Duration::from_millis(fastrand::u64(300..1500))).await;
        clock
            .lock()
            .unwrap()
            .insert(session.id().to_owned(), Instant::now());
        let response = session.start(Source::Vad).await?;
        match response.superseded() {
            Some(old) => {
                println!(
                    "[vad]       {}: barge-in: response {} supersedes {old}",
                    session.id(),
                    response.id()
                );
            }
            None => println!(
                "[vad]       {}: speech while nothing was speaking: response {}",
                session.id(),
                response.id()
            ),
        }
        // A short acknowledgement, reported unless superseded in turn.
        tokio::time::sleep(Duration::from_millis(60)).await;
        let _ = response.finish(Terminal::Completed).await?;
    }
    Ok(())
}
