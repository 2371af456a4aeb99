use std::process::ExitCode;

use clap::Parser;
use respcoord::{
    config::{Cli, Command},
    server::{self, ServerConfig},
    telemetry,
};

fn main() -> ExitCode {
    let Command::Serve(args) = Cli::parse().command;
    if let Err(error) = telemetry::init(args.log_format, &args.log) {
        eprintln!("error: --log: {error}");
        return ExitCode::from(2);
    }
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
    runtime.block_on(async {
        let listener = match tokio::net::TcpListener::bind(args.listen).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::error!(listen = %args.listen, %error, "cannot listen");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(listen = %args.listen, "respcoord serving (embedded in-memory coordinator)");
        let config = ServerConfig {
            registry: args.registry_config(),
            watch: args.watch_settings(),
            shutdown_grace: args.shutdown_grace,
        };
        match server::serve(config, listener, shutdown_signal()).await {
            Ok(()) => {
                tracing::info!("stopped");
                ExitCode::SUCCESS
            }
            Err(error) => {
                tracing::error!(%error, "server failed");
                ExitCode::FAILURE
            }
        }
    })
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
