//! The do-it-yourself baseline a gateway author would reach for instead of
//! respcoord: M3's Start as one Redis Lua script (refuse after teardown,
//! supersede the live response, mint the next id, bump the revision) with
//! its events XADDed to a per-session stream, called with EVALSHA by the
//! same closed-loop workers as the barge-in workload. It has none of
//! respcoord's contract (no request-id replay, fencing, watches with resume,
//! expiry), so it is a lower bound on the cost of coordination, not a
//! competitor.
//!
//! The client speaks RESP2 over one TCP connection per worker (Redis
//! answers one connection's commands in order, so one call in flight each):
//! a few dozen lines, where a Redis client crate would add its dependency
//! tree to every build of this package for one benchmark.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
};

use super::load::{Plan, Rng, Sample};

/// `KEYS[1]` the session's hash, `KEYS[2]` its event stream; `ARGV[1]` the source.
/// Returns {response id, superseded id or 0, revision}.
const START_SCRIPT: &str = r"
if redis.call('HGET', KEYS[1], 'terminated') then
  return redis.error_reply('FAILED_PRECONDITION session terminated')
end
local live = redis.call('HGET', KEYS[1], 'live')
local revision = redis.call('HINCRBY', KEYS[1], 'revision', 1)
local id = redis.call('HINCRBY', KEYS[1], 'next_id', 1)
local superseded = 0
if live and live ~= '0' then
  superseded = tonumber(live)
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', 64, '*', 'kind', 'ended', 'response', live,
    'status', 'superseded', 'revision', revision)
  revision = redis.call('HINCRBY', KEYS[1], 'revision', 1)
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 64, '*', 'kind', 'started', 'response', id,
  'source', ARGV[1], 'revision', revision)
redis.call('HSET', KEYS[1], 'live', id)
return {id, superseded, revision}
";

/// The longest bulk reply read (SCRIPT LOAD's sha1 is 40 bytes).
const MAX_BULK: usize = 64 * 1024;

/// A RESP2 reply, as much of it as the baseline reads.
#[derive(Debug)]
enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

struct Connection {
    reader: BufReader<tokio::io::ReadHalf<TcpStream>>,
    writer: tokio::io::WriteHalf<TcpStream>,
    buffer: Vec<u8>,
}

impl Connection {
    async fn open(addr: &str) -> Result<Self, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("redis at {addr}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (reader, writer) = tokio::io::split(stream);
        Ok(Connection {
            reader: BufReader::new(reader),
            writer,
            buffer: Vec::with_capacity(256),
        })
    }

    async fn call(&mut self, args: &[&[u8]]) -> Result<Reply, String> {
        self.buffer.clear();
        self.buffer
            .extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for arg in args {
            self.buffer
                .extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            self.buffer.extend_from_slice(arg);
            self.buffer.extend_from_slice(b"\r\n");
        }
        self.writer
            .write_all(&self.buffer)
            .await
            .map_err(|e| e.to_string())?;
        read_reply(&mut self.reader).await
    }
}

async fn read_line(
    reader: &mut BufReader<tokio::io::ReadHalf<TcpStream>>,
) -> Result<String, String> {
    let mut line = String::new();
    let read = reader
        .read_line(&mut line)
        .await
        .map_err(|e| e.to_string())?;
    if read == 0 {
        return Err("redis closed the connection".into());
    }
    Ok(line.trim_end_matches("\r\n").to_owned())
}

/// Reads one reply; arrays nest, so the recursion is boxed.
fn read_reply(
    reader: &mut BufReader<tokio::io::ReadHalf<TcpStream>>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Reply, String>> + Send + '_>> {
    Box::pin(async move {
        let line = read_line(reader).await?;
        let (kind, rest) = line.split_at(line.len().min(1));
        let number = || {
            rest.parse::<i64>()
                .map_err(|_| format!("redis sent {line:?}"))
        };
        match kind {
            "+" => Ok(Reply::Simple(rest.to_owned())),
            "-" => Ok(Reply::Error(rest.to_owned())),
            ":" => Ok(Reply::Integer(number()?)),
            "$" => {
                let Ok(len) = usize::try_from(number()?) else {
                    return Ok(Reply::Bulk(None));
                };
                // The baseline's replies are a few bytes: a length beyond
                // this is a broken stream, not something to allocate.
                if len > MAX_BULK {
                    return Err(format!("redis sent a {len}-byte bulk reply"));
                }
                let mut data = vec![0; len + 2];
                reader
                    .read_exact(&mut data)
                    .await
                    .map_err(|e| e.to_string())?;
                data.truncate(len);
                Ok(Reply::Bulk(Some(data)))
            }
            "*" => {
                let count = usize::try_from(number()?).unwrap_or(0);
                if count > MAX_BULK {
                    return Err(format!("redis sent a {count}-item array"));
                }
                let mut items = Vec::with_capacity(count.min(16));
                for _ in 0..count {
                    items.push(read_reply(reader).await?);
                }
                Ok(Reply::Array(items))
            }
            _ => Err(format!("redis sent {line:?}")),
        }
    })
}

/// Whether a Redis answers at `addr` (the benchmark skips it, saying so,
/// where none does).
pub async fn available(addr: &str) -> Result<(), String> {
    let mut connection = tokio::time::timeout(Duration::from_secs(1), Connection::open(addr))
        .await
        .map_err(|_| format!("redis at {addr}: no answer within 1 s"))??;
    match connection.call(&[b"PING"]).await? {
        Reply::Simple(pong) if pong == "PONG" => Ok(()),
        other => Err(format!("redis at {addr}: PING answered {other:?}")),
    }
}

/// The barge-in load's Starts as the Lua script, `workers` connections with
/// one call in flight each, recorded like the gRPC loads.
pub async fn run(addr: String, plan: Arc<Plan>, workers: usize) -> Result<Sample, String> {
    let mut setup = Connection::open(&addr).await?;
    let sha = match setup
        .call(&[b"SCRIPT", b"LOAD", START_SCRIPT.as_bytes()])
        .await?
    {
        Reply::Bulk(Some(sha)) => sha,
        other => return Err(format!("SCRIPT LOAD answered {other:?}")),
    };
    let sha = Arc::new(sha);
    let measure_from = Instant::now() + plan.warmup;
    let until = measure_from + plan.duration;
    let mut tasks = Vec::new();
    for index in 0..workers.max(1) {
        let connection = Connection::open(&addr).await?;
        let plan = Arc::clone(&plan);
        let sha = Arc::clone(&sha);
        tasks.push(tokio::spawn(async move {
            worker(connection, plan, sha, index, measure_from, until).await
        }));
    }
    let mut load = Sample {
        window: plan.duration,
        ..Sample::default()
    };
    for task in tasks {
        let sample = task.await.map_err(|e| e.to_string())??;
        load.merge(Sample {
            window: Duration::ZERO,
            ..sample
        });
    }
    // The run's keys, so rounds and reruns start from nothing.
    let mut keys: Vec<Vec<u8>> = Vec::new();
    for session in plan.hot.iter() {
        keys.push(format!("respcoord-bench:{session}").into_bytes());
        keys.push(format!("respcoord-bench:{session}:events").into_bytes());
    }
    let mut del: Vec<&[u8]> = vec![b"DEL"];
    del.extend(keys.iter().map(Vec::as_slice));
    setup.call(&del).await?;
    Ok(load)
}

async fn worker(
    mut connection: Connection,
    plan: Arc<Plan>,
    sha: Arc<Vec<u8>>,
    index: usize,
    measure_from: Instant,
    until: Instant,
) -> Result<Sample, String> {
    let mut sample = Sample::default();
    let mut rng = Rng::seeded(index);
    let keys: Vec<(Vec<u8>, Vec<u8>)> = plan
        .hot
        .iter()
        .map(|session| {
            (
                format!("respcoord-bench:{session}").into_bytes(),
                format!("respcoord-bench:{session}:events").into_bytes(),
            )
        })
        .collect();
    while Instant::now() < until {
        let (hash, events) = &keys[rng.below(keys.len())];
        let began = Instant::now();
        let reply = connection
            .call(&[b"EVALSHA", &sha, b"2", hash, events, b"vad"])
            .await?;
        let done = Instant::now();
        if began < measure_from || done > until {
            continue;
        }
        let answer = match reply {
            Reply::Array(items) => match items.as_slice() {
                [Reply::Integer(id), Reply::Integer(_), Reply::Integer(revision)]
                    if *id > 0 && *revision > 0 =>
                {
                    Ok(())
                }
                _ => Err(format!("EVALSHA answered {items:?}")),
            },
            Reply::Error(message) => Err(message),
            other => Err(format!("EVALSHA answered {other:?}")),
        };
        match answer {
            Ok(()) => {
                sample.calls += 1;
                sample
                    .latencies
                    .push(u64::try_from((done - began).as_nanos()).unwrap_or(u64::MAX));
            }
            Err(error) => {
                sample.errors += 1;
                sample.first_error.get_or_insert(error);
            }
        }
    }
    Ok(sample)
}
