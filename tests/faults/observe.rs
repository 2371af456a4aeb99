//! What the test asks of the NATS cluster about itself, over its own links
//! to the nodes: the bucket stream's leader as a node sees it, the
//! JetStream meta leader (`/jsz`), which node each replica's connection is
//! on (`/connz`), and a stream leader stepdown.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use crate::{
    cluster::{Cluster, MONITOR_PORT, NODES},
    netns::Host,
};

impl Cluster {
    /// The bucket's stream as node `via` sees it (over the test's own link
    /// to it): its leader's index and how many followers are current.
    pub async fn stream_view(&self, via: usize) -> Option<(Option<usize>, usize)> {
        let url = self.nats_url(Host::Test, via);
        let bucket = self.bucket.clone();
        let ask = async move {
            let client = async_nats::ConnectOptions::new()
                .connection_timeout(Duration::from_secs(1))
                .request_timeout(Some(Duration::from_secs(1)))
                .connect(url)
                .await
                .ok()?;
            let js = async_nats::jetstream::new(client);
            let mut stream = js.get_stream(format!("KV_{bucket}")).await.ok()?;
            let info = stream.info().await.ok()?;
            let cluster = info.cluster.clone()?;
            let leader = cluster
                .leader
                .as_deref()
                .and_then(|name| name.strip_prefix('n'))
                .and_then(|i| i.parse::<usize>().ok());
            let current = cluster.replicas.iter().filter(|p| p.current).count();
            Some((leader, current))
        };
        tokio::time::timeout(Duration::from_secs(3), ask)
            .await
            .ok()
            .flatten()
    }

    /// The JetStream meta leader as node `via` sees it (its `/jsz`).
    pub async fn meta_leader(&self, via: usize) -> Option<usize> {
        let addr = SocketAddr::from((self.net.addr(Host::Test, Host::Nats(via)), MONITOR_PORT));
        let body = http_get(addr, "/jsz").await?;
        let compact: String = body.split_whitespace().collect();
        let meta = &compact[compact.find("\"meta_cluster\"")?..];
        let leader = &meta[meta.find("\"leader\":\"")? + "\"leader\":\"".len()..];
        let name = &leader[..leader.find('"')?];
        name.strip_prefix('n')?.parse().ok()
    }

    /// Asks the bucket's stream leader to step down (through node `via`), so
    /// the stream elects another among its current followers.
    pub async fn stream_leader_stepdown(&self, via: usize) -> Result<(), String> {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(1))
            .request_timeout(Some(Duration::from_secs(2)))
            .connect(self.nats_url(Host::Test, via))
            .await
            .map_err(|e| e.to_string())?;
        let subject = format!("$JS.API.STREAM.LEADER.STEPDOWN.KV_{}", self.bucket);
        let reply = client
            .request(subject, bytes::Bytes::new())
            .await
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&reply.payload);
        if text.contains("\"success\":true") {
            Ok(())
        } else {
            Err(text.into_owned())
        }
    }

    /// The stream leader once both followers are current, asked through
    /// node `via`; `None` if there was none within `patience`.
    pub async fn settled_leader(&self, via: usize, patience: Duration) -> Option<usize> {
        let deadline = Instant::now() + patience;
        loop {
            if let Some((Some(leader), current)) = self.stream_view(via).await {
                if current == NODES - 1 {
                    return Some(leader);
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Which node each replica's NATS connection is on, from the nodes'
    /// `/connz` (a replica's connection comes from its address on that link).
    pub async fn connections(&self) -> Vec<Vec<usize>> {
        let mut on = vec![Vec::new(); self.replicas()];
        for i in 0..NODES {
            let addr = SocketAddr::from((self.net.addr(Host::Test, Host::Nats(i)), MONITOR_PORT));
            let Some(body) = http_get(addr, "/connz?limit=1024").await else {
                continue;
            };
            for (r, nodes) in on.iter_mut().enumerate() {
                let ip = self.net.addr(Host::Nats(i), Host::Replica(r));
                if body.contains(&format!("\"{ip}\"")) {
                    nodes.push(i);
                }
            }
        }
        on
    }
}

/// A plain HTTP/1.0 GET's body, or `None` if the server did not answer in
/// time.
async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let get = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        Some(String::from_utf8_lossy(&response).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), get)
        .await
        .ok()
        .flatten()
}
