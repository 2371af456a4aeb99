//! Expiry across replicas: one expirer at a time, by lease.
//!
//! JetStream's per-message TTLs arrived in nats-server 2.11 and respcoord
//! supports 2.10, so expiry does not use them. Instead one replica holds a
//! lease (a key in the bucket, taken and renewed with compare-and-set) and
//! sweeps its mirror for sessions past their deadline. Each candidate is then decided
//! afresh from the bucket by the same pure decision
//! (`decision::decide_expiry`) inside the same compare-and-set path as every
//! call, so a stale mirror, a lease that changed hands mid-sweep, or two
//! expirers at once can at worst repeat a read: a session is never expired
//! twice nor before its TTL.
//!
//! The lease lasts `timings::LEASE_SWEEPS` (3) sweep intervals; a replica
//! that dies is replaced by another within that, so expiry is late by at
//! most a few seconds.
//!
//! Deadlines, "now" and the lease's term are all on the stream's clock
//! (`clock`), so a replica whose wall clock runs ahead neither expires
//! sessions early nor takes a lease that has not lapsed; a replica that has
//! received no stamp yet (only on a bucket without one entry) stays out.

use std::time::Duration;

use async_nats::jetstream::kv::Operation;

use super::{
    call::{Read, Step},
    clock::UnixMillis,
    entry, timings, Inner, NatsCoordinator,
};
use crate::{
    decision::{self, Decision, Expired, ExpiryDecision, Stamp},
    error::CoordError,
    ids::{ResponseId, SessionId},
    session::Session,
    shared::Clock,
};

/// The lease's key (outside the session key space).
const LEASE_KEY: &str = "lease.expirer";

/// Takes or renews the lease; true if this replica holds it now.
async fn hold_lease(coordinator: &NatsCoordinator, lease: Duration) -> bool {
    let inner = &coordinator.inner;
    let Some(now) = inner.view.clock.now() else {
        return false;
    };
    let until = now.saturating_add(lease);
    let value = format!("{} {}", inner.replica, until.millis());
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
            let held_until =
                UnixMillis::new(parts.next().and_then(|p| p.parse().ok()).unwrap_or(0));
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
    let config = &coordinator.inner.rules.config;
    let interval = timings::sweep_interval(config.idle_ttl, config.tombstone_ttl);
    let lease = interval * timings::LEASE_SWEEPS;
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
        let Some(now) = inner.view.clock.now() else {
            continue;
        };
        let due = inner.view.mirror.due(
            now.millis(),
            inner.rules.ttls.idle,
            inner.rules.ttls.tombstone,
            timings::SWEEP_BATCH,
        );
        for id in due {
            if let Err(error) = inner.expire(&id).await {
                tracing::warn!(session_id = %id, %error, "expiry deferred");
            }
        }
    }
}

impl Inner {
    /// Expires or forgets `id` if, read fresh from the bucket, it is due
    /// (the shared expiry decision, `decision::decide_expiry`), through the
    /// same compare-and-set path as every call.
    pub(super) async fn expire(&self, id: &SessionId) -> Result<(), CoordError> {
        let _serialized = self.locks.lock(id).await;
        let expired = self
            .compare_and_set(id, None, self.patience(), |read| {
                self.decide_expiry(id, read)
            })
            .await?;
        if let Some(decision) = expired {
            self.count(&decision::EXPIRY, &decision);
        }
        Ok(())
    }

    /// One attempt of expiry on what was read: nothing to do, forget the
    /// tombstone, or write the expiry's teardown (its decision).
    fn decide_expiry(&self, id: &SessionId, read: Read) -> Step<Option<Decision>> {
        let entry = match read {
            Read::Live { entry, .. } => entry,
            Read::Absent { .. } => return Step::Stands(Ok(None)),
        };
        let now = self.now().millis();
        let mut session = Session::from_persisted(entry.persisted);
        session.remember_live_since(entry.unix_nanos);
        let ready = match decision::decide_expiry(&mut session, id, now, self.rules.ttls) {
            ExpiryDecision::NotDue { .. } => return Step::Stands(Ok(None)),
            ExpiryDecision::Forget => return Step::Purge(Ok(None)),
            ExpiryDecision::Expire(ready) => ready,
        };
        let nanos = Clock::unix_nanos();
        let stamp = Stamp {
            first_seq: 0,
            unix_nanos: nanos,
            // A teardown starts nothing.
            new_response: ResponseId::MIN,
        };
        let Expired { decision, .. } = ready.apply(stamp, 0);
        let expired =
            entry::Entry::written(session.persisted(), entry.last_response, &decision, nanos);
        Step::Write {
            entry: expired,
            cache: false,
            answer: Ok(Some(decision)),
        }
    }
}
