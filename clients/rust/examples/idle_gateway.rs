//! A gateway that holds one live response and does nothing else, for
//! `respcoord-bench gateways` (what an idle gateway pays for the rest of
//! the deployment's traffic):
//!
//! ```sh
//! idle_gateway ENDPOINT SESSION
//! ```
//!
//! Prints `ready` once the response is live; exits when its standard input
//! closes (or with status 3 if the response is stopped meanwhile).

use std::io::{BufRead, Write};

use respcoord_client::{Client, ConnectOptions, Source};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(endpoint), Some(session)) = (args.next(), args.next()) else {
        return Err("usage: idle_gateway ENDPOINT SESSION".into());
    };
    let client = Client::connect(ConnectOptions::new(endpoint)).await?;
    let response = client.session(&session)?.start(Source::Client).await?;
    println!("ready");
    std::io::stdout().flush()?;
    let stdin_closed = tokio::task::spawn_blocking(|| for _ in std::io::stdin().lock().lines() {});
    tokio::select! {
        _ = stdin_closed => Ok(()),
        reason = response.stopped() => {
            eprintln!("idle_gateway: the response was stopped: {reason:?}");
            std::process::exit(3)
        }
    }
}
