//! The NATS backend's call path against a real bucket, where it differs from
//! the shared decision's own tests (`decision/tests.rs`): what it does with
//! a stored entry it cannot read, and with a read a deposed stream leader
//! served (stale). Needs NATS as `watch_tests` does.

use super::{
    entry,
    store::{scripted::Scripted, NatsStore, Stored},
    watch_tests::{coordinator, fresh_bucket, require_nats, scripted_on},
    NatsCoordinator,
};
use crate::{
    error::CoordError,
    ids::SessionId,
    machine::{FinishStatus, Phase, Source},
    registry::CoordConfig,
};

/// Makes the coordinator's next read of `id` return the entry as it was at
/// KV revision `revision` and forget what it wrote, as if a partition had
/// deposed the stream leader that serves its reads.
async fn serve_stale_read(
    c: &NatsCoordinator,
    script: &Scripted<NatsStore>,
    id: &SessionId,
    revision: u64,
) {
    c.inner.cache.take(id);
    let key = entry::key(id);
    let stale = c
        .inner
        .kv
        .entry_for_revision(&key, revision)
        .await
        .unwrap()
        .expect("the revision is still held");
    script.serve_stale_read(&key, Stored::from(stale));
}

async fn kv_revision(c: &NatsCoordinator, id: &SessionId) -> u64 {
    c.inner
        .kv
        .entry(entry::key(id))
        .await
        .unwrap()
        .expect("stored")
        .revision
}

#[tokio::test]
async fn an_answer_that_writes_nothing_is_not_given_from_a_stale_read() {
    require_nats().await;
    let (c, script) = scripted_on(&fresh_bucket(), 8, CoordConfig::default()).await;
    let id = SessionId::parse("stale-read").unwrap();
    let first = c.start(&id, Source::Client, None).await.unwrap();
    let before_second = kv_revision(&c, &id).await;
    let second = c.start(&id, Source::Client, None).await.unwrap();
    assert_eq!(second.superseded, Some(first.response));

    // Read stale (first live), Finish(second) would be a no-op answered
    // applied=false: a gateway would stop a response that is still live.
    serve_stale_read(&c, &script, &id, before_second).await;
    let finished = c
        .finish(&id, Some(second.response), FinishStatus::Completed)
        .await
        .unwrap();
    assert!(script.played(), "the stale read was served");
    assert!(
        finished.result,
        "decided on the acknowledged state, not the stale read"
    );

    // A stale read that would write (cancel the first response, live in it)
    // is refused by compare-and-set and decided again on the latest state,
    // where nothing is live.
    serve_stale_read(&c, &script, &id, before_second).await;
    let cancelled = c
        .cancel(&id, Some(first.response), Source::Client)
        .await
        .unwrap();
    assert!(script.played(), "the stale read was served");
    assert_eq!(cancelled.result, None);
    let state = c.state(&id).await.unwrap();
    assert_eq!(state.phase, Phase::Idle);
    assert_eq!(state.responses_started, 2);
}

#[tokio::test]
async fn an_unreadable_entry_is_data_loss_naming_the_session_and_is_left_alone() {
    require_nats().await;
    let c = coordinator(8, CoordConfig::default()).await;
    let id = SessionId::parse("damaged").unwrap();
    let key = entry::key(&id);
    let garbage = bytes::Bytes::from_static(b"\xff\x00 not a stored session");
    c.inner.kv.put(&key, garbage.clone()).await.unwrap();

    let refused = [
        c.start(&id, Source::Client, None).await.map(|_| ()),
        c.state(&id).await.map(|_| ()),
        c.cancel(&id, None, Source::Client).await.map(|_| ()),
        c.shutdown(&id).await.map(|_| ()),
    ];
    for result in refused {
        let error = result.expect_err("an unreadable entry answers nothing");
        assert!(
            matches!(&error, CoordError::Unreadable { session, .. } if *session == id),
            "{error:?}"
        );
        // Answered DATA_LOSS (grpc::status), not UNAVAILABLE, which
        // clients retry forever.
        assert!(error.to_string().contains("damaged"), "{error}");
    }
    let stored = c.inner.kv.get(&key).await.unwrap();
    assert_eq!(stored, Some(garbage), "nothing overwrote the entry");
}
