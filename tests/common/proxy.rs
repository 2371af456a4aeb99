//! A loopback TCP proxy whose connections can all be cut at once: a broken
//! network path between a client and the coordinator, for watch-resume
//! tests (`tests/client.rs`, `examples/scenario_fixture.rs`).

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
};

use tokio::{net::TcpListener, task::JoinHandle};

pub struct Proxy {
    pub addr: SocketAddr,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let connections = Arc::clone(&connections);
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let connection = tokio::spawn(async move {
                        if let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await {
                            let _ = inbound.set_nodelay(true);
                            let _ = outbound.set_nodelay(true);
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    let mut open = connections.lock().unwrap_or_else(PoisonError::into_inner);
                    // Forget the ones that already ended: the list stays bounded.
                    open.retain(|c| !c.is_finished());
                    open.push(connection);
                }
            }
        });
        Ok(Self {
            addr,
            connections,
            accept,
        })
    }

    /// Drops every open connection (both sockets close).
    pub fn cut(&self) {
        let mut open = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for connection in open.drain(..) {
            connection.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
