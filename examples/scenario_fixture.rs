//! The server side of the cross-language client scenarios
//! (`clients/scenarios/`): the real coordinator service, the real bearer-token
//! interceptor and TLS, wrapped to count the Starts and Finishes that reach it
//! and to lose one Start reply on demand, behind a TCP proxy whose
//! connections can be cut. The Python and TypeScript clients' tests drive it
//! over a small HTTP control port, so every client is judged by the same
//! server-side counts as the Rust client's tests (which use the same
//! `Counting` service in-process).
//!
//! ```sh
//! scenario_fixture serve [--listen 127.0.0.1:0] [--auth-tokens FILE]
//!     [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]
//!     [--backend memory|nats --nats-url URL]
//! scenario_fixture certs DIR
//! ```
//!
//! `serve` prints one JSON line once it listens:
//! `{"grpc":"127.0.0.1:P","proxy":"127.0.0.1:Q","control":"http://127.0.0.1:R"}`,
//! and exits when its standard input closes (so a test that dies never
//! leaves it behind). Control: `POST /lose-next-start-reply`,
//! `GET /finishes/{response_id}`, `GET /starts`, `POST /cut`,
//! `POST /hold-next-watch`, `GET /held-watches`, `POST /release-watches`.
//! Test tooling, not a product: it is an example so the server build never
//! carries it.

#[path = "../tests/common/ca.rs"]
mod ca;
#[path = "../tests/common/counting.rs"]
mod counting;
#[path = "../tests/common/proxy.rs"]
mod proxy;

use std::{io::Read, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use axum::{
    extract::{Path, State},
    http::{header, StatusCode},
    response::IntoResponse,
    routing::{get, post},
    Router,
};
use clap::{Parser, Subcommand, ValueEnum};
use counting::Counting;
use proxy::Proxy;
use respcoord::{
    auth::{Authenticator, Tokens},
    backend::Coordinator,
    grpc::{CoordinatorService, WatchSettings},
    nats::{NatsCoordinator, NatsSettings},
    proto::v1::response_coordinator_server::ResponseCoordinatorServer,
    registry::{CoordConfig, Registry},
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{
    service::interceptor::InterceptedService,
    transport::{server::TcpIncoming, Certificate, Identity, Server, ServerTlsConfig},
};

#[derive(Debug, Parser)]
#[command(about = "The server side of the cross-language client scenarios")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the counting coordinator, its proxy and its control port.
    Serve(Serve),
    /// Write the mutual-TLS scenario's CAs and certificates into DIR.
    Certs { dir: PathBuf },
}

#[derive(Debug, clap::Args)]
struct Serve {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Bearer tokens, in `respcoord serve --auth-tokens`' format.
    #[arg(long)]
    auth_tokens: Option<PathBuf>,
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Backend::Memory)]
    backend: Backend,
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    Memory,
    Nats,
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Certs { dir } => ca::write_mutual_tls_files(&dir).map_err(|e| e.to_string()),
        Command::Serve(serve) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
            .and_then(|runtime| runtime.block_on(run(serve)).map_err(|e| e.to_string())),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("scenario_fixture: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn coordinator(serve: &Serve) -> Result<Coordinator, Failure> {
    let config = CoordConfig::default();
    Ok(match serve.backend {
        Backend::Memory => Registry::new(config).into(),
        Backend::Nats => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let settings = NatsSettings {
                url: serve.nats_url.clone(),
                bucket: format!(
                    "fixture_{}_{}",
                    std::process::id(),
                    nanos % 1_000_000_000_000
                ),
                memory_storage: true,
                request_timeout: Duration::from_secs(5),
                // Scenario buckets empty themselves; the server outlives the run.
                max_age: Duration::from_secs(15 * 60),
                ..NatsSettings::default()
            };
            NatsCoordinator::connect(&settings, config).await?.into()
        }
    })
}

fn tls(serve: &Serve) -> Result<Option<ServerTlsConfig>, Failure> {
    let (Some(cert), Some(key)) = (&serve.tls_cert, &serve.tls_key) else {
        return Ok(None);
    };
    let config = ServerTlsConfig::new().identity(Identity::from_pem(
        std::fs::read(cert)?,
        std::fs::read(key)?,
    ));
    Ok(Some(match &serve.tls_client_ca {
        Some(ca) => config.client_ca_root(Certificate::from_pem(std::fs::read(ca)?)),
        None => config,
    }))
}

struct Control {
    counting: Counting,
    proxy: Proxy,
}

/// `{"count": n}` as JSON.
fn count(n: usize) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        format!(r#"{{"count":{n}}}"#),
    )
}

fn control_routes(control: Arc<Control>) -> Router {
    Router::new()
        .route(
            "/lose-next-start-reply",
            post(|State(c): State<Arc<Control>>| async move {
                c.counting.lose_next_start_reply();
                StatusCode::NO_CONTENT
            }),
        )
        .route(
            "/finishes/{response_id}",
            get(
                |State(c): State<Arc<Control>>, Path(id): Path<u64>| async move {
                    count(c.counting.finishes_of(id))
                },
            ),
        )
        .route(
            "/starts",
            get(|State(c): State<Arc<Control>>| async move { count(c.counting.starts()) }),
        )
        .route(
            "/hold-next-watch",
            post(|State(c): State<Arc<Control>>| async move {
                c.counting.hold_next_watch();
                StatusCode::NO_CONTENT
            }),
        )
        .route(
            "/held-watches",
            get(|State(c): State<Arc<Control>>| async move { count(c.counting.held_watches()) }),
        )
        .route(
            "/release-watches",
            post(|State(c): State<Arc<Control>>| async move {
                c.counting.release_watches();
                StatusCode::NO_CONTENT
            }),
        )
        .route(
            "/cut",
            post(|State(c): State<Arc<Control>>| async move {
                c.proxy.cut();
                StatusCode::NO_CONTENT
            }),
        )
        .with_state(control)
}

async fn run(serve: Serve) -> Result<(), Failure> {
    let tokens = serve.auth_tokens.as_deref().map(Tokens::load).transpose()?;
    let tls = tls(&serve)?;
    let backend = coordinator(&serve).await?;
    let stop = CancellationToken::new();
    let counting = Counting::new(CoordinatorService::new(
        backend.clone(),
        WatchSettings::default(),
        stop.clone(),
    ));
    // The real interceptor, always: with no tokens it records the
    // every-session scope, as the server does.
    let service = InterceptedService::new(
        ResponseCoordinatorServer::new(counting.clone()),
        Authenticator::new(tokens),
    );

    let grpc = TcpListener::bind(serve.listen).await?;
    let grpc_addr = grpc.local_addr()?;
    let proxy = Proxy::start(grpc_addr).await?;
    let proxy_addr = proxy.addr;
    let control = TcpListener::bind("127.0.0.1:0").await?;
    let control_addr = control.local_addr()?;

    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    let expiry = tokio::spawn({
        let backend = backend.clone();
        let stop = stop.clone();
        async move { backend.run(stop.cancelled_owned()).await }
    });
    let server = tokio::spawn(builder.add_service(service).serve_with_incoming_shutdown(
        TcpIncoming::from(grpc).with_nodelay(Some(true)),
        stop.clone().cancelled_owned(),
    ));
    let routes = control_routes(Arc::new(Control { counting, proxy }));
    let control_task = tokio::spawn(async move { axum::serve(control, routes).await });

    // Socket addresses need no JSON escaping.
    println!(
        r#"{{"grpc":"{grpc_addr}","proxy":"{proxy_addr}","control":"http://{control_addr}"}}"#
    );

    // Until the test that spawned us closes our stdin (or dies).
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = [0u8; 256];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        let _ = closed_tx.send(());
    });
    tokio::select! {
        _ = closed_rx => {}
        _ = tokio::signal::ctrl_c() => {}
        result = server => { result??; }
    }
    stop.cancel();
    control_task.abort();
    let _ = tokio::time::timeout(Duration::from_secs(5), expiry).await;
    Ok(())
}
