//! Expiry across replicas: one expirer at a time, by lease.
//!
//! JetStream's per-message TTLs arrived in nats-server 2.11 and Debian ships
//! 2.9, so expiry does not use them. Instead one replica holds a lease (a key
//! in the bucket, taken and renewed with compare-and-set) and sweeps its
//! mirror for sessions past their deadline. Each candidate is then decided
//! afresh from the bucket by the same pure decision
//! (`decision::decide_expiry`) inside the same compare-and-set path as every
//! call, so a stale mirror, a lease that changed hands mid-sweep, or two
//! expirers at once can at worst repeat a read: a session is never expired
//! twice nor before its TTL.
//!
//! The lease lasts three sweep intervals; a replica that dies is replaced by
//! another within that, so expiry is late by at most a few seconds.
//!
//! Deadlines, "now" and the lease's term are all on the stream's clock
//! (`clock`), so a replica whose wall clock runs ahead neither expires
//! sessions early nor takes a lease that has not lapsed; a replica that has
//! received no stamp yet (only on a bucket without one entry) stays out.

use std::time::Duration;

use async_nats::jetstream::kv::Operation;

use crate::nats::NatsCoordinator;

/// The lease's key (outside the session key space).
const LEASE_KEY: &str = "lease.expirer";

/// Sessions handled per sweep before the lease is renewed again.
const SWEEP_BATCH: usize = 4096;

fn sweep_interval(coordinator: &NatsCoordinator) -> Duration {
    let shortest = coordinator
        .inner
        .config
        .idle_ttl
        .min(coordinator.inner.config.tombstone_ttl);
    (shortest / 10).clamp(Duration::from_millis(50), Duration::from_secs(5))
}

/// Takes or renews the lease; true if this replica holds it now.
async fn hold_lease(coordinator: &NatsCoordinator, lease: Duration) -> bool {
    let inner = &coordinator.inner;
    let Some(now) = inner.clock.now() else {
        return false;
    };
    let until = now.saturating_add(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX));
    let value = format!("{} {until}", inner.replica);
    let current = match inner.kv.entry(LEASE_KEY).await {
        Ok(current) => current,
        Err(_) => return false,
    };
    let expected = match current {
        None => 0,
        Some(entry) if entry.operation != Operation::Put => entry.revision,
        Some(entry) => {
            let text = String::from_utf8_lossy(&entry.value);
            let mut parts = text.split(' ');
            let holder = parts.next().unwrap_or_default();
            let held_until: u64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
            if holder != inner.replica && held_until > now {
                return false;
            }
            entry.revision
        }
    };
    inner
        .kv
        .update(LEASE_KEY, value.into_bytes().into(), expected)
        .await
        .is_ok()
}

pub(super) async fn run(coordinator: NatsCoordinator, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    let interval = sweep_interval(&coordinator);
    let lease = interval * 3;
    let mut holding = false;
    loop {
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(interval) => {}
        }
        let held = hold_lease(&coordinator, lease).await;
        coordinator.inner.observed.lease(held);
        if held != holding {
            tracing::info!(replica = %coordinator.inner.replica, holding = held, "expirer lease");
            holding = held;
        }
        if !held {
            continue;
        }
        let inner = &coordinator.inner;
        let Some(now) = inner.clock.now() else {
            continue;
        };
        let due = inner
            .mirror
            .due(now, inner.ttls.idle, inner.ttls.tombstone, SWEEP_BATCH);
        for id in due {
            if let Err(error) = inner.expire(&id).await {
                tracing::warn!(session_id = %id, %error, "expiry deferred");
            }
        }
    }
}
