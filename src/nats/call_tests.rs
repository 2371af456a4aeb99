//! The NATS backend's call path against a real bucket, where it differs from
//! the shared decision's own tests (`decision/tests.rs`): what it does with
//! a stored entry it cannot read. Needs NATS as `watch_tests` does.

use super::{entry, watch_tests::coordinator, watch_tests::nats_available};
use crate::{error::CoordError, ids::SessionId, machine::Source, registry::RegistryConfig};

#[tokio::test]
async fn an_unreadable_entry_is_data_loss_naming_the_session_and_is_left_alone() {
    if !nats_available().await {
        return;
    }
    let c = coordinator(8, RegistryConfig::default()).await;
    let id = SessionId::parse("damaged").unwrap();
    let key = entry::key(&id);
    let garbage = bytes::Bytes::from_static(b"\xff\x00 not a stored session");
    c.inner.kv.put(&key, garbage.clone()).await.unwrap();

    let refused = [
        c.start(&id, Source::Client, None).await.map(|_| ()),
        c.state(&id).await.map(|_| ()),
        c.cancel(&id, None).await.map(|_| ()),
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
