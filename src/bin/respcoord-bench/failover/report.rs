//! What a failover run measured, as the table's row and the details
//! printed under it.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use super::{gateways::Attempt, name, Fault};
use crate::measure::percentiles;

/// What a fault may add to the slowest call (beyond the election, for a crash).
const TARGET: Duration = Duration::from_secs(1);

/// The gRPC code of a failed attempt's `code: message`.
fn code(failed: &str) -> &str {
    failed.split(':').next().unwrap_or(failed)
}

pub(super) struct Report {
    pub(super) attempts: Vec<Attempt>,
    /// The end of the warm-up.
    pub(super) measured_from: Instant,
    /// The fault's first signal.
    pub(super) fault_at: Instant,
    /// When the cluster had recovered from the fault's last step.
    pub(super) recovered: Instant,
    pub(super) ended: Instant,
}

impl Report {
    /// Seconds from the fault's first signal to `at`, signed.
    pub(super) fn after(&self, at: Instant) -> f64 {
        match at.checked_duration_since(self.fault_at) {
            Some(after) => after.as_secs_f64(),
            None => -(self.fault_at - at).as_secs_f64(),
        }
    }

    /// The longest time `replica` answered no attempt, from the warm-up's
    /// end to the run's, and when it began.
    fn gap(&self, replica: usize) -> String {
        let ok = self
            .attempts
            .iter()
            .filter(|a| a.replica() == replica && a.failed.is_none());
        let mut times: Vec<Instant> = ok
            .map(|a| a.answered)
            .filter(|&t| t >= self.measured_from)
            .collect();
        times.extend([self.measured_from, self.ended]);
        times.sort_unstable();
        let gaps = times.windows(2).map(|w| (w[1] - w[0], w[0]));
        let (gap, from) = gaps.max().unwrap_or((Duration::ZERO, self.fault_at));
        format!("{:.2} s @{:+.1}", gap.as_secs_f64(), self.after(from))
    }

    /// Calls answered, with their latency (first attempt sent to answer).
    fn answered(&self, keep: impl Fn(&Attempt) -> bool) -> Vec<u64> {
        let calls = self
            .attempts
            .iter()
            .filter(|a| a.last && a.failed.is_none() && keep(a));
        calls
            .map(|a| u64::try_from((a.answered - a.call_began).as_nanos()).unwrap_or(u64::MAX))
            .collect()
    }

    /// Failed attempts by the second after the fault they were sent in, and
    /// the slowest call of each kind answered after the fault.
    pub(super) fn details(&self) -> String {
        let (mut by, mut messages) = (BTreeMap::new(), BTreeMap::<_, usize>::new());
        for a in &self.attempts {
            if let Some(failed) = &a.failed {
                *by.entry((self.after(a.sent).floor() as i64, a.what, code(failed)))
                    .or_insert(0usize) += 1;
                // Session ids (quoted) left out, so alike failures count together.
                let parts = failed.split('"').enumerate();
                let message: String = parts
                    .map(|(i, p)| if i % 2 == 1 { "…" } else { p })
                    .collect();
                *messages.entry(message).or_insert(0) += 1;
            }
        }
        let messages = messages.iter().map(|(m, n)| format!("{n} x {m:?}"));
        let failed = by
            .iter()
            .map(|((s, what, code), n)| format!("{s:+} {what} {code} {n}"));
        let slowest = ["Start", "Finish"].map(|what| {
            let after = self.answered(|a| a.what == what && a.answered >= self.fault_at);
            format!("{what} {} ms", after.iter().max().unwrap_or(&0) / 1_000_000)
        });
        let failed: Vec<_> = failed.collect();
        format!(
            "failed attempts by second sent: [{}]; slowest after the fault: {}; why: [{}]; \
             the slowest call's attempts: {}",
            failed.join(", "),
            slowest.join(", "),
            messages.collect::<Vec<_>>().join(", "),
            self.slowest_call(),
        )
    }

    /// The slowest call answered after the fault, attempt by attempt: which
    /// replica, when it was sent (seconds from the fault), how long it took
    /// and how it failed; what a gap or an `added` is made of.
    fn slowest_call(&self) -> String {
        let answered = self
            .attempts
            .iter()
            .filter(|a| a.last && a.failed.is_none() && a.answered >= self.fault_at);
        let Some(slowest) = answered.max_by_key(|a| a.answered - a.call_began) else {
            return "none".into();
        };
        let of_call = self
            .attempts
            .iter()
            .filter(|a| a.gateway == slowest.gateway && a.call_began == slowest.call_began);
        let attempts: Vec<_> = of_call
            .map(|a| {
                format!(
                    "{} {} {:+.3} s, {} ms{}",
                    ["A", "B"][a.replica()],
                    a.what,
                    self.after(a.sent),
                    (a.answered - a.sent).as_millis(),
                    a.failed
                        .as_deref()
                        .map_or_else(String::new, |f| format!(", {}", code(f))),
                )
            })
            .collect();
        format!("gateway {}: [{}]", slowest.gateway, attempts.join("; "))
    }

    /// The table's row. `base p99`: calls begun after the warm-up and
    /// answered before the fault; `after`: calls answered from the fault
    /// on; `added`: the slowest of those minus the baseline p99; `progress`:
    /// gateways with a call begun after the cluster recovered and answered;
    /// `target`: the (see `met`); `failed attempts`: sent from the
    /// fault on, by code, and how many failed in the baseline.
    pub(super) fn row(
        &self,
        fault: Fault,
        new_leader: Option<Duration>,
        gateways: usize,
    ) -> String {
        let calls = self.attempts.iter().filter(|a| a.last);
        let (ok, failed) = calls.fold((0, 0), |(ok, failed), a| match a.failed {
            None => (ok + 1, failed),
            Some(_) => (ok, failed + 1),
        });
        let mut base =
            self.answered(|a| a.call_began >= self.measured_from && a.answered < self.fault_at);
        let mut after = self.answered(|a| a.answered >= self.fault_at);
        let base_p99 = percentiles(&mut base).map_or(0, |p| p.p99);
        let (p50, p99, max) = percentiles(&mut after).map_or((0, 0, 0), |p| (p.p50, p.p99, p.max));
        let progressed = (0..gateways).filter(|&g| {
            let mut calls = self.attempts.iter().filter(|a| a.gateway == g && a.last);
            calls.any(|a| a.failed.is_none() && a.call_began >= self.recovered)
        });
        let mut codes: BTreeMap<&str, usize> = BTreeMap::new();
        for a in self.attempts.iter().filter(|a| a.sent >= self.fault_at) {
            if let Some(failed) = &a.failed {
                *codes.entry(code(failed)).or_default() += 1;
            }
        }
        let mut listed: Vec<_> = codes.iter().map(|(c, n)| format!("{c} {n}")).collect();
        let baseline = self.attempts.iter().filter(|a| {
            a.failed.is_some() && a.sent >= self.measured_from && a.sent < self.fault_at
        });
        listed.push(format!("baseline {}", baseline.count()));
        let ms = |nanos: u64| nanos / 1_000_000;
        let added = Duration::from_nanos(max.saturating_sub(base_p99));
        // A planned restart: no call failed, at most 1 s added; a crash: at
        // most the new leader's election plus 1 s added.
        let met = match (fault, new_leader) {
            (Fault::KillLeader, elected) => elected.is_some_and(|e| added <= e + TARGET),
            _ => failed == 0 && added <= TARGET,
        };
        format!(
            "{:<18} {ok:>8}  {failed:>6}  {:<13}  {:<13}  {:>5} ms  {:>5}/{}/{} ms  {:>5.2} s  {:>10}  {:>5}/{:<3} {:<6}  {} ({})",
            name(fault),
            self.gap(0),
            self.gap(1),
            ms(base_p99),
            ms(p50),
            ms(p99),
            ms(max),
            added.as_secs_f64(),
            new_leader.map_or_else(|| "-".into(), |d| format!("{:.2} s", d.as_secs_f64())),
            progressed.count(),
            gateways,
            crate::measure::verdict(met),
            codes.values().sum::<usize>(),
            listed.join(", "),
        )
    }
}
