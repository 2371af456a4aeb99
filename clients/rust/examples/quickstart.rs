//! The quickstart: two gateways on one call. The read loop starts a
//! response, the VAD barges in, the read loop's fence turns false (its late
//! audio must be dropped), and the VAD's response finishes.
//!
//! ```sh
//! cargo run --release -- serve &      # a coordinator on 127.0.0.1:50051
//! cargo run -p respcoord-client --example quickstart [-- http://127.0.0.1:50051]
//! ```
//!
//! The test command runs this file, unchanged, as the `main.rs` of a
//! throw-away crate that depends on `respcoord-client` by path.

use respcoord_client::{Client, ConnectOptions, Finished, Source, StopReason, Terminal};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:50051".to_owned());
    // Two gateway processes would each have their own client.
    let read_loop = Client::connect(ConnectOptions::new(endpoint.as_str())).await?;
    let vad = Client::connect(ConnectOptions::new(endpoint.as_str())).await?;
    let call = format!("quickstart-{}", std::process::id());

    let speaking = read_loop.session(&call)?.start(Source::Client).await?;
    let fence = speaking.fence(); // cheap and cloneable: check it before every chunk
    println!(
        "read loop: response {} started; fence {}",
        speaking.id(),
        fence.is_current()
    );

    // The user talks over the bot: the VAD starts a response of its own.
    let barge_in = vad.session(&call)?.start(Source::Vad).await?;
    println!("vad: response {} started", barge_in.id());

    // The read loop hears it through its client's watch, whichever process sent it.
    let reason = speaking.stopped().await;
    assert_eq!(reason, StopReason::Superseded);
    assert!(
        !fence.is_current(),
        "the fence is false once the response stopped"
    );
    println!(
        "read loop: response {} stopped ({reason:?}); fence {}",
        speaking.id(),
        fence.is_current()
    );

    match barge_in.finish(Terminal::Completed).await? {
        Finished::Applied(state) => println!("vad: finished; the session is {:?}", state.phase()),
        other => {
            return Err(format!("the live response's Finish was not applied: {other:?}").into())
        }
    }
    Ok(())
}
