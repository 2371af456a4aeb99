//! `respcoordctl`: the operator's command line for respcoord, in the spirit
//! of etcdctl and kubectl. Readable lines by default, `--output json` for
//! scripts (one JSON document per command; one object per line for `watch`).
//!
//! Exit codes (also in `--help`):
//!
//! | code | meaning |
//! |---|---|
//! | 0 | ok (including Cancel or Shutdown that found nothing to cancel) |
//! | 1 | transport failure, coordinator unavailable, deadline exceeded, internal error |
//! | 2 | usage: bad flags or arguments, INVALID_ARGUMENT, unreadable TLS/token files |
//! | 3 | NOT_FOUND: no such session |
//! | 4 | FAILED_PRECONDITION: the session is terminated |
//! | 5 | RESOURCE_EXHAUSTED: session limit, or the watch fell behind |
//! | 6 | OUT_OF_RANGE: the watch's resume point is no longer retained |
//! | 7 | UNAUTHENTICATED or PERMISSION_DENIED |
//! | 8 | Finish was stale (`applied=false`): the response is not the live one, nothing changed |
//!
//! Ids in `-o json` are strings (`"response_id": "1796642205476522484"`):
//! 64-bit values past 2^53, which jq and JavaScript round as numbers. Every
//! id argument takes them as printed, bare or still in jq's quotes.

use std::{io, process::ExitCode};

use clap::{Parser, Subcommand, ValueEnum};
use respcoord_client::{new_request_id, pb, Client, ClientError, Source};
use tonic::Code;

mod connect;
mod output;
mod timeline;

use connect::ConnectArgs;

use output::{ListOut, Printer};
use respcoord_proto::timeline::StateJson;

const EXIT_CODES: &str = "\
Exit codes:
  0  ok (also cancel or shutdown that found nothing to cancel)
  1  transport failure, unavailable, deadline exceeded, internal error
  2  usage: bad flags or arguments, INVALID_ARGUMENT, unreadable TLS/token files
  3  NOT_FOUND: no such session
  4  FAILED_PRECONDITION: the session is terminated
  5  RESOURCE_EXHAUSTED: session limit, or the watch fell behind
  6  OUT_OF_RANGE: the watch's resume point is no longer retained
  7  UNAUTHENTICATED or PERMISSION_DENIED
  8  finish was stale (applied=false): that response is not the live one,
     nothing changed (it was superseded, cancelled or already finished)

Ids in -o json are strings (\"response_id\": \"1796642205476522484\"): they are
64-bit, past what jq and JavaScript keep exactly as numbers. Id arguments
take them as printed, with or without the quotes.

Every flag has an environment variable (RESPCOORDCTL_ENDPOINT, ...); the
bearer token comes from --token-file or RESPCOORDCTL_TOKEN.";

#[derive(Debug, Parser)]
#[command(
    name = "respcoordctl",
    version,
    about = "Inspect and drive a respcoord response coordinator",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(flatten)]
    connect: ConnectArgs,

    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Text,
          env = "RESPCOORDCTL_OUTPUT", global = true)]
    output: Output,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Text,
    Json,
}

/// Who asked, recorded on the event for observability (it never changes
/// what a call does).
#[derive(Debug, Clone, Copy, ValueEnum)]
enum SourceArg {
    /// The caller's own request (an API client, an operator).
    Client,
    /// Voice activity detection: the user started talking (barge-in).
    Vad,
    /// Not said.
    Unspecified,
}

impl From<SourceArg> for Source {
    fn from(source: SourceArg) -> Self {
        match source {
            SourceArg::Client => Source::Client,
            SourceArg::Vad => Source::Vad,
            SourceArg::Unspecified => Source::Unspecified,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StatusArg {
    /// The response ran to its end.
    Completed,
    /// The response failed (an upstream error, a crash).
    Failed,
}

/// An id or seq as `-o json` prints it: decimal digits, bare or still in
/// the double quotes jq prints without `-r`.
fn id_arg(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits = trimmed
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap_or(trimmed);
    digits.parse::<u64>().map_err(|_| {
        format!("{text:?} is not an id: expected decimal digits, as `-o json` prints them")
    })
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show one session's state.
    Get {
        /// The session id, as the gateway named it (e.g. call-42).
        session: String,
    },
    /// List every session (all pages).
    List {
        /// Sessions per ListSessions call (at most 1000).
        #[arg(long, default_value_t = 1000)]
        page_size: u32,
        /// Stop after this many sessions.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Stream events of one session, or of every session without SESSION.
    /// A session watch ends when the session terminates.
    Watch {
        /// The session to watch; without it, every session's events in seq
        /// order.
        session: Option<String>,
        /// Session watch: replay retained events after this revision first.
        #[arg(long, conflicts_with_all = ["after_seq", "from_start"], value_parser = id_arg)]
        after_revision: Option<u64>,
        /// Watch-all: replay retained events after this seq first.
        #[arg(long, conflicts_with = "from_start", value_parser = id_arg)]
        after_seq: Option<u64>,
        /// Replay from the first retained event (revision/seq 0).
        #[arg(long)]
        from_start: bool,
        /// Also print bookmarks (progress_seq heartbeats).
        #[arg(long)]
        bookmarks: bool,
        /// Exit after this many events.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// One session's responses as a timeline: who started each, when, how
    /// it ended and why (superseded by which Start, cancelled by whom, shut
    /// down).
    Timeline {
        /// The session id.
        session: String,
        /// Keep printing each change until the session ends.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Start a response (superseding the live one).
    Start {
        /// The session id, as the gateway names it (e.g. call-42); the
        /// session is created by its first Start.
        session: String,
        /// Who asks for the response: recorded on its `started` event and
        /// the session's state, and as who cancelled the response it
        /// supersedes.
        #[arg(long, value_enum, default_value_t = SourceArg::Client)]
        source: SourceArg,
        /// Idempotency key; repeating it replays instead of starting again
        /// (default: a fresh one, printed).
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Report a response's terminal. Exits 8 if that response is not the
    /// live one (stale: superseded, cancelled or already finished).
    Finish {
        /// The session id.
        session: String,
        /// The response that ended, as `start` printed it.
        #[arg(value_parser = id_arg)]
        response_id: u64,
        /// How it ended.
        #[arg(long, value_enum, default_value_t = StatusArg::Completed)]
        status: StatusArg,
    },
    /// Cancel the live response (or only --if-response-id).
    Cancel {
        /// The session id.
        session: String,
        /// Cancel only if this response is the live one.
        #[arg(long, value_parser = id_arg)]
        if_response_id: Option<u64>,
        /// Who asks for the cancel: recorded on the `cancel_requested` event
        /// (`watch`, `timeline` show it).
        #[arg(long, value_enum, default_value_t = SourceArg::Client)]
        source: SourceArg,
    },
    /// Tear a session down (idempotent); later Starts are refused.
    Shutdown {
        /// The session id (an unknown one is created terminated, so a later
        /// Start is refused).
        session: String,
        /// Who asks for the teardown: recorded on the `cancel_requested` of
        /// the live response.
        #[arg(long, value_enum, default_value_t = SourceArg::Client)]
        source: SourceArg,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("respcoordctl: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(Done::Ok) => ExitCode::SUCCESS,
        Ok(Done::Stale) => ExitCode::from(EXIT_STALE),
        Err(Failure::Client(error)) => {
            eprintln!("respcoordctl: {error}");
            if let Some(hint) = hint(&error) {
                eprintln!("respcoordctl: {hint}");
            }
            ExitCode::from(exit_code(error.code()))
        }
        // stdout went away (`| head`): nothing left to say.
        Err(Failure::Output(error)) if error.kind() == io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(Failure::Output(error)) => {
            eprintln!("respcoordctl: writing output: {error}");
            ExitCode::from(1)
        }
    }
}

/// The exit code of a Finish that changed nothing: the response it names
/// is not the live one. Distinct from every error's, so a script can tell
/// "my response was already stopped" from a failure.
const EXIT_STALE: u8 = 8;

/// How a command that got its answer ends.
enum Done {
    Ok,
    /// Finish `applied=false`.
    Stale,
}

/// What to do about an error, where respcoordctl knows more than the
/// server could say.
fn hint(error: &ClientError) -> Option<String> {
    match error.code() {
        Code::Unauthenticated => Some(format!(
            "respcoordctl sends the bearer token read from --token-file FILE \
             (or RESPCOORDCTL_TOKEN_FILE), else the token in the {} variable",
            connect::TOKEN_ENV
        )),
        _ => None,
    }
}

/// The documented exit code of a gRPC code.
fn exit_code(code: Code) -> u8 {
    match code {
        Code::Ok => 0,
        Code::InvalidArgument => 2,
        Code::NotFound => 3,
        Code::FailedPrecondition => 4,
        Code::ResourceExhausted => 5,
        Code::OutOfRange => 6,
        Code::Unauthenticated | Code::PermissionDenied => 7,
        _ => 1,
    }
}

enum Failure {
    Client(ClientError),
    Output(io::Error),
}

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Self {
        Failure::Client(error)
    }
}

impl From<tonic::Status> for Failure {
    fn from(status: tonic::Status) -> Self {
        Failure::Client(status.into())
    }
}

impl From<io::Error> for Failure {
    fn from(error: io::Error) -> Self {
        Failure::Output(error)
    }
}

async fn run(cli: Cli) -> Result<Done, Failure> {
    let options = cli.connect.options()?;
    let client = Client::connect(options).await?;
    let out = Printer(cli.output);
    match cli.command {
        Command::Get { session } => {
            let state = client.get_state(&session).await?;
            out.state(&state)?;
        }
        Command::List { page_size, limit } => list(&client, &out, page_size, limit).await?,
        Command::Watch {
            session,
            after_revision,
            after_seq,
            from_start,
            bookmarks,
            limit,
        } => {
            let mut request = pb::WatchRequest {
                session_id: session.unwrap_or_default(),
                after_revision,
                after_seq,
            };
            if from_start {
                if request.session_id.is_empty() {
                    request.after_seq = Some(0);
                } else {
                    request.after_revision = Some(0);
                }
            }
            watch(&client, &out, request, bookmarks, limit).await?;
        }
        Command::Timeline { session, follow } => {
            timeline::run(&client, &out, &session, follow).await?;
        }
        Command::Start {
            session,
            source,
            request_id,
        } => {
            let request_id = request_id.unwrap_or_else(new_request_id);
            let reply = client
                .start_call(&session, source.into(), Some(&request_id))
                .await?;
            out.started(&reply, &request_id)?;
        }
        Command::Finish {
            session,
            response_id,
            status,
        } => {
            let status = match status {
                StatusArg::Completed => pb::TerminalStatus::Completed,
                StatusArg::Failed => pb::TerminalStatus::Failed,
            };
            let (reply, _) = client.finish_call(&session, response_id, status).await?;
            out.finished(&reply, response_id)?;
            if !reply.applied {
                return Ok(Done::Stale);
            }
        }
        Command::Cancel {
            session,
            if_response_id,
            source,
        } => {
            let reply = client
                .cancel_call(&session, source.into(), if_response_id)
                .await?;
            out.cancelled("cancel", reply.cancelled_response_id, reply.state.as_ref())?;
        }
        Command::Shutdown { session, source } => {
            let reply = client.shutdown_call(&session, source.into()).await?;
            out.cancelled(
                "shutdown",
                reply.cancelled_response_id,
                reply.state.as_ref(),
            )?;
        }
    }
    Ok(Done::Ok)
}

async fn list(
    client: &Client,
    out: &Printer,
    page_size: u32,
    limit: Option<usize>,
) -> Result<(), Failure> {
    let limit = limit.unwrap_or(usize::MAX);
    let mut sessions = Vec::new();
    let mut seq = None;
    let mut token = String::new();
    loop {
        let page = client.list_page(page_size, token).await?;
        seq.get_or_insert(page.seq);
        for state in page.sessions {
            if sessions.len() == limit {
                break;
            }
            if out.0 == Output::Text {
                out.state(&state)?;
            }
            sessions.push(state);
        }
        if page.next_page_token.is_empty() || sessions.len() == limit {
            break;
        }
        token = page.next_page_token;
    }
    if out.0 == Output::Json {
        out.json(&ListOut {
            seq: seq.unwrap_or_default(),
            sessions: sessions.iter().map(StateJson::from).collect(),
        })?;
    }
    Ok(())
}

async fn watch(
    client: &Client,
    out: &Printer,
    request: pb::WatchRequest,
    bookmarks: bool,
    limit: Option<usize>,
) -> Result<(), Failure> {
    let mut stream = client.raw().watch(request).await?.into_inner();
    let mut left = limit.unwrap_or(usize::MAX);
    if left == 0 {
        return Ok(());
    }
    while let Some(message) = stream.message().await? {
        if message.events.is_empty() {
            if bookmarks {
                out.bookmark(message.progress_seq)?;
            }
            continue;
        }
        for event in &message.events {
            out.event(event)?;
            left -= 1;
            if left == 0 {
                return Ok(());
            }
        }
    }
    Ok(())
}

// ---- output ----

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_the_documented_ones() {
        assert_eq!(exit_code(Code::Unavailable), 1);
        assert_eq!(exit_code(Code::DeadlineExceeded), 1);
        assert_eq!(exit_code(Code::InvalidArgument), 2);
        assert_eq!(exit_code(Code::NotFound), 3);
        assert_eq!(exit_code(Code::FailedPrecondition), 4);
        assert_eq!(exit_code(Code::ResourceExhausted), 5);
        assert_eq!(exit_code(Code::OutOfRange), 6);
        assert_eq!(exit_code(Code::Unauthenticated), 7);
    }

    #[test]
    fn ids_go_in_as_printed() {
        assert_eq!(id_arg("1796642205476522484"), Ok(1_796_642_205_476_522_484));
        assert_eq!(
            id_arg("\"1796642205476522484\""),
            Ok(1_796_642_205_476_522_484)
        );
        assert_eq!(id_arg(" 42\n"), Ok(42));
        for bad in ["1.796642205476522e18", "-1", "\"42", "", "0x2a"] {
            assert!(id_arg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cli_parses() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
