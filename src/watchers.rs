//! The open-watch counters: how many watches are open (the service enforces
//! `--max-watchers` on them) and how many were ended for falling behind (the
//! metrics read both at scrape time).
//!
//! A leaf module on purpose: the gRPC layer writes these counters and
//! `metrics` reads them, and neither has to import the other for it.

use std::sync::{
    atomic::{AtomicU64, AtomicUsize, Ordering},
    Arc,
};

/// What a watch covers, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchKind {
    Session,
    All,
}

impl WatchKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WatchKind::Session => "session",
            WatchKind::All => "all",
        }
    }
}

/// Open watches and how many were ended for falling behind, shared by the
/// service (which enforces the watcher limit) and the metrics.
#[derive(Debug, Default)]
pub struct WatchStats {
    open: AtomicUsize,
    open_by_kind: [AtomicU64; 2],
    lagged_by_kind: [AtomicU64; 2],
}

impl WatchStats {
    /// A slot for one more watch, unless `max` are open.
    pub fn try_open(self: &Arc<Self>, kind: WatchKind, max: usize) -> Option<WatchSlot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < max).then_some(open + 1)
            })
            .ok()?;
        self.open_by_kind[kind as usize].fetch_add(1, Ordering::Relaxed);
        Some(WatchSlot {
            stats: Arc::clone(self),
            kind,
        })
    }

    /// Watches open now.
    pub fn open(&self, kind: WatchKind) -> u64 {
        self.open_by_kind[kind as usize].load(Ordering::Relaxed)
    }

    /// Watches ended with RESOURCE_EXHAUSTED for falling behind, since boot.
    pub fn lagged(&self, kind: WatchKind) -> u64 {
        self.lagged_by_kind[kind as usize].load(Ordering::Relaxed)
    }
}

/// One open watch; the count drops when it does.
#[derive(Debug)]
pub struct WatchSlot {
    stats: Arc<WatchStats>,
    kind: WatchKind,
}

impl WatchSlot {
    /// Counts this watch as ended for falling behind.
    pub fn count_lagged(&self) {
        self.stats.lagged_by_kind[self.kind as usize].fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        self.stats.open_by_kind[self.kind as usize].fetch_sub(1, Ordering::Relaxed);
        self.stats.open.fetch_sub(1, Ordering::AcqRel);
    }
}
