use std::{error::Error, process::ExitCode};

/// See `mimalloc` in Cargo.toml: the binaries use mimalloc, the library
/// leaves the choice to whoever links it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use respcoord::{
    backend::Coordinator,
    config::{Backend, Cli, Command, ServeArgs},
    nats::NatsCoordinator,
    registry::Registry,
    server::{self, Listeners, ServeError, ServerConfig},
    telemetry::{self, OtlpSignals},
};

/// Invalid configuration: the same status clap uses for a bad flag.
const BAD_CONFIG: u8 = 2;

/// An error with its causes, `a: b: c`.
fn chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn main() -> ExitCode {
    let Command::Serve(args) = Cli::try_parse_naming_variables(std::env::args_os())
        .unwrap_or_else(|error| error.exit())
        .command;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let signals = OtlpSignals::from_env();
    // The OTLP exporters are tonic clients: build them inside the runtime.
    let telemetry = {
        let _runtime = runtime.enter();
        match telemetry::init(args.log_format, &args.log, signals) {
            Ok(telemetry) => telemetry,
            Err(error) => {
                eprintln!("error: {}", chain(&error));
                return ExitCode::from(BAD_CONFIG);
            }
        }
    };
    if let Err(code) = check_config(&args) {
        return code;
    }
    let tls = args.tls();
    let code = runtime.block_on(async {
        // Before the ports are bound: once a port accepts, SIGTERM is a
        // graceful shutdown, never the default kill.
        let shutdown = shutdown_signal();
        let listeners = match bind(&args).await {
            Ok(listeners) => listeners,
            Err(code) => return code,
        };
        let coordinator = match backend(&args).await {
            Ok(coordinator) => coordinator,
            Err(code) => return code,
        };
        announce(&args, &coordinator, signals);
        let config = ServerConfig {
            registry: args.registry_config(),
            watch: args.watch_settings(),
            shutdown_grace: args.shutdown_grace,
            limits: args.limits(),
            tls,
            auth: args.auth_tokens.clone(),
            otlp_metrics: signals.metrics,
            web_ui: args.web_ui,
        };
        match server::serve_coordinator(coordinator, config, listeners, shutdown).await {
            Ok(()) => {
                tracing::info!("stopped");
                ExitCode::SUCCESS
            }
            Err(error @ ServeError::Metrics(_)) => {
                eprintln!("error: {}", chain(&error));
                ExitCode::from(BAD_CONFIG)
            }
            Err(error) => {
                tracing::error!(error = %chain(&error), "server failed");
                ExitCode::FAILURE
            }
        }
    });
    // Outside the runtime's workers: flushing waits on the exporter.
    telemetry.shutdown();
    code
}

/// Refuses flags that are each valid but do not go together, and TLS files
/// that do not hold a certificate and its key.
fn check_config(args: &ServeArgs) -> Result<(), ExitCode> {
    if let Some(max_age) = args.nats_max_age {
        let floor = args.session_idle_ttl + args.tombstone_ttl;
        if max_age <= floor {
            eprintln!(
                "error: --nats-max-age must exceed --session-idle-ttl plus --tombstone-ttl ({}), or live sessions could age out of the bucket",
                humantime::format_duration(floor)
            );
            return Err(ExitCode::from(BAD_CONFIG));
        }
    }
    if let Some(tls) = &args.tls() {
        if let Err(error) = tls.check() {
            eprintln!("error: --tls-cert/--tls-key: {}", chain(&error));
            return Err(ExitCode::from(BAD_CONFIG));
        }
    }
    Ok(())
}

/// The gRPC port and, when asked for, the metrics port.
async fn bind(args: &ServeArgs) -> Result<Listeners, ExitCode> {
    let grpc = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(listen = %args.listen, %error, "cannot listen");
            return Err(ExitCode::FAILURE);
        }
    };
    let metrics = match args.metrics_listen {
        None => None,
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => Some(listener),
            Err(error) => {
                tracing::error!(metrics_listen = %addr, %error, "cannot listen");
                return Err(ExitCode::FAILURE);
            }
        },
    };
    Ok(Listeners { grpc, metrics })
}

/// The memory registry, or a replica connected to the NATS bucket.
async fn backend(args: &ServeArgs) -> Result<Coordinator, ExitCode> {
    Ok(match args.backend {
        Backend::Memory => Registry::new(args.registry_config()).into(),
        Backend::Nats => {
            let settings = match args.nats_settings() {
                Ok(settings) => settings,
                Err(error) => {
                    tracing::error!(%error, "cannot start the NATS backend");
                    return Err(ExitCode::FAILURE);
                }
            };
            match NatsCoordinator::connect(&settings, args.registry_config()).await {
                Ok(nats) => nats.into(),
                Err(error) => {
                    tracing::error!(error = %chain(&error), "cannot start the NATS backend");
                    return Err(ExitCode::FAILURE);
                }
            }
        }
    })
}

/// Logs what is served and how, and warns about ports that anyone who can
/// reach them may use.
fn announce(args: &ServeArgs, coordinator: &Coordinator, signals: OtlpSignals) {
    let tls = args.tls();
    tracing::info!(
        backend = coordinator.backend_name(),
        listen = %args.listen,
        // Absent, not "None", when there is no metrics port.
        metrics_listen = args.metrics_listen.map(tracing::field::display),
        tls = tls.is_some(),
        mutual_tls = tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        auth_tokens = args.auth_tokens.as_ref().map_or(0, |t| t.len()),
        otlp_traces = signals.traces,
        otlp_metrics = signals.metrics,
        web_ui = args.web_ui,
        "respcoord serving"
    );
    let web_exposed = args
        .metrics_listen
        .filter(|addr| args.web_ui && !addr.ip().is_loopback());
    if let (Some(addr), None) = (web_exposed, &args.auth_tokens) {
        tracing::warn!(
            metrics_listen = %addr,
            "serving the web view without authentication on a non-loopback address: anyone who can reach the metrics port can list and watch every session (--auth-tokens)"
        );
    }
    if args.auth_tokens.is_none() && !args.listen.ip().is_loopback() {
        tracing::warn!(
            listen = %args.listen,
            "serving without authentication on a non-loopback address: anyone who can reach it can start, cancel and shut down sessions (--auth-tokens)"
        );
    }
}

/// Resolves on SIGTERM or Ctrl-C. The handlers are installed when this is
/// called, not when the future is first polled: a signal that arrives
/// between then and the first poll is kept, not the process's death.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let handlers = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let (mut terminate, mut interrupt) = handlers;
            let received = |signal: Option<tokio::signal::unix::Signal>| async move {
                match signal {
                    Some(mut signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = received(terminate.take()) => {}
                () = received(interrupt.take()) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
