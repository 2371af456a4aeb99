//! The wake-ups an open watch needs besides its events: its bookmark when it
//! has been quiet for the bookmark interval, and the server's shutdown.
//!
//! A replica holds one watch per live call. A tokio `Sleep` (96 bytes) and a
//! cancellation future (72) in every watch cost more than the watch's own
//! state, so the watches of one server share one table instead: a watch
//! holds a key into it, the table holds each watch's deadline and waker (32
//! bytes a slot), and one task walks it every tick, waking the watches whose
//! bookmark is due, and every watch at shutdown. etcd's watchable store
//! keeps its watchers the same way: a cursor each, woken by one loop.
//!
//! A bookmark comes at most one tick early, never late: the contract
//! promises a quiet stream one at least every bookmark interval.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard, Once, PoisonError, Weak,
    },
    task::Waker,
    time::Duration,
};

use slab::Slab;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// Shards of the table: a watch's poll locks one, uncontended but for the
/// walk, which holds each for a few microseconds a tick.
const SHARDS: usize = 16;

/// Walks per bookmark interval: a bookmark is due after `interval - tick`
/// and sent by `interval`.
const TICKS_PER_INTERVAL: u32 = 8;
const MIN_TICK: Duration = Duration::from_millis(1);
const MAX_TICK: Duration = Duration::from_secs(1);

/// The wake-ups of every watch one server holds open.
pub struct Alarms {
    shards: Box<[Mutex<Slab<Slot>>]>,
    /// Deadlines are milliseconds since this instant.
    epoch: Instant,
    tick: Duration,
    /// How long after its last message a quiet watch's bookmark is due.
    quiet_for: Duration,
    shutdown: CancellationToken,
    next_shard: AtomicUsize,
    walker: Once,
}

struct Slot {
    /// Set while the watch waits; taken by the walk that wakes it.
    waker: Option<Waker>,
    due_ms: u64,
}

impl Alarms {
    /// `shutdown` ends every watch: each is woken when it is cancelled.
    pub fn new(bookmark_interval: Duration, shutdown: CancellationToken) -> Arc<Self> {
        let tick = (bookmark_interval / TICKS_PER_INTERVAL).clamp(MIN_TICK, MAX_TICK);
        Arc::new(Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Slab::new())).collect(),
            epoch: Instant::now(),
            tick,
            quiet_for: bookmark_interval.saturating_sub(tick),
            shutdown,
            next_shard: AtomicUsize::new(0),
            walker: Once::new(),
        })
    }

    /// A new watch's alarm, its bookmark due one interval from now. Starts
    /// the walk with the first watch (it needs the runtime the watch runs on).
    pub(crate) fn alarm(self: &Arc<Self>) -> Alarm {
        self.walker.call_once(|| {
            tokio::spawn(walk(Arc::downgrade(self), self.shutdown.clone(), self.tick));
        });
        let due_ms = self.due_from_now();
        let shard = self.next_shard.fetch_add(1, Ordering::Relaxed) % SHARDS;
        let key = self.lock(shard).insert(Slot {
            waker: None,
            due_ms,
        });
        Alarm {
            alarms: Arc::clone(self),
            shard,
            key,
            due_ms,
        }
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Slab<Slot>> {
        // A slot is a waker and a number: nothing is left half-written.
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn due_from_now(&self) -> u64 {
        let quiet_for = u64::try_from(self.quiet_for.as_millis()).unwrap_or(u64::MAX);
        self.now_ms().saturating_add(quiet_for)
    }

    /// Wakes the waiting watches whose bookmark is due, or all of them.
    fn wake(&self, everyone: bool) {
        let now_ms = self.now_ms();
        let mut due = Vec::new();
        for shard in 0..SHARDS {
            {
                let mut slots = self.lock(shard);
                for (_, slot) in slots.iter_mut() {
                    if everyone || slot.due_ms <= now_ms {
                        due.extend(slot.waker.take());
                    }
                }
            }
            // Woken outside the lock: a woken watch's poll may take it.
            due.drain(..).for_each(Waker::wake);
        }
    }
}

/// The one task of a server that wakes its watches; it ends at shutdown
/// (after waking them all) or when the server is gone.
async fn walk(alarms: Weak<Alarms>, shutdown: CancellationToken, tick: Duration) {
    let mut ticks = tokio::time::interval(tick);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let everyone = tokio::select! {
            _ = ticks.tick() => false,
            () = shutdown.cancelled() => true,
        };
        let Some(alarms) = alarms.upgrade() else {
            return;
        };
        alarms.wake(everyone);
        if everyone {
            return;
        }
    }
}

/// One watch's place in [`Alarms`]; dropping it frees the slot.
pub(crate) struct Alarm {
    alarms: Arc<Alarms>,
    shard: usize,
    key: usize,
    /// A copy of the slot's deadline, read without the lock.
    due_ms: u64,
}

impl Alarm {
    pub(crate) fn shutting_down(&self) -> bool {
        self.alarms.shutdown.is_cancelled()
    }

    /// The watch has been quiet long enough for a bookmark.
    pub(crate) fn bookmark_due(&self) -> bool {
        self.alarms.now_ms() >= self.due_ms
    }

    /// The watch sent something (or had nothing to send when due): its next
    /// bookmark is one interval away.
    pub(crate) fn rearm(&mut self) {
        self.due_ms = self.alarms.due_from_now();
    }

    /// The watch waits: `waker` is woken when its bookmark is due or at
    /// shutdown. True if shutdown began meanwhile (the watch must end now:
    /// the walk that wakes everyone may have passed before `waker` was set).
    pub(crate) fn wait(&self, waker: &Waker) -> bool {
        {
            let mut slots = self.alarms.lock(self.shard);
            if let Some(slot) = slots.get_mut(self.key) {
                slot.due_ms = self.due_ms;
                match &mut slot.waker {
                    Some(kept) => kept.clone_from(waker),
                    empty => *empty = Some(waker.clone()),
                }
            }
        }
        self.shutting_down()
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        self.alarms.lock(self.shard).try_remove(self.key);
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::atomic::AtomicBool,
        task::{Wake, Waker},
    };

    use super::*;

    #[derive(Default)]
    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn flag() -> (Arc<Flag>, Waker) {
        let flag = Arc::new(Flag::default());
        (Arc::clone(&flag), Waker::from(flag))
    }

    async fn settle() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_watch_is_woken_within_its_interval_and_not_before_a_tick_early() {
        let alarms = Alarms::new(Duration::from_millis(800), CancellationToken::new());
        let alarm = alarms.alarm();
        let (woken, waker) = flag();
        assert!(!alarm.wait(&waker));
        // Due 700 ms after it was armed (800 ms less one 100 ms tick).
        tokio::time::advance(Duration::from_millis(650)).await;
        settle().await;
        assert!(!woken.0.load(Ordering::SeqCst));
        assert!(!alarm.bookmark_due());
        tokio::time::advance(Duration::from_millis(150)).await;
        settle().await;
        assert!(woken.0.load(Ordering::SeqCst));
        assert!(alarm.bookmark_due());
    }

    #[tokio::test(start_paused = true)]
    async fn rearming_moves_the_deadline_and_a_busy_watch_is_not_woken() {
        let alarms = Alarms::new(Duration::from_millis(800), CancellationToken::new());
        let mut alarm = alarms.alarm();
        let (woken, waker) = flag();
        for _ in 0..4 {
            tokio::time::advance(Duration::from_millis(400)).await;
            alarm.rearm();
            assert!(!alarm.wait(&waker));
            settle().await;
            assert!(!woken.0.load(Ordering::SeqCst));
        }
        tokio::time::advance(Duration::from_millis(800)).await;
        settle().await;
        assert!(woken.0.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_wakes_every_waiting_watch_and_ends_later_ones() {
        let shutdown = CancellationToken::new();
        let alarms = Alarms::new(Duration::from_secs(10), shutdown.clone());
        let watches: Vec<_> = (0..40).map(|_| (alarms.alarm(), flag())).collect();
        for (alarm, (_, waker)) in &watches {
            assert!(!alarm.wait(waker));
        }
        shutdown.cancel();
        settle().await;
        for (alarm, (woken, _)) in &watches {
            assert!(woken.0.load(Ordering::SeqCst));
            assert!(alarm.shutting_down());
        }
        let late = alarms.alarm();
        assert!(
            late.wait(&flag().1),
            "a watch that waits after shutdown ends"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_alarm_frees_its_slot() {
        let alarms = Alarms::new(Duration::from_secs(10), CancellationToken::new());
        let held: Vec<_> = (0..100).map(|_| alarms.alarm()).collect();
        let count = |alarms: &Alarms| (0..SHARDS).map(|s| alarms.lock(s).len()).sum::<usize>();
        assert_eq!(count(&alarms), 100);
        drop(held);
        assert_eq!(count(&alarms), 0);
    }
}
