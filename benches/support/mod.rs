//! What the benches measure with: CPU time of the whole bench process by
//! default, wall time with `RESPCOORD_BENCH_CLOCK=wall`.
//!
//! On a machine shared with other work (the 2-core development machines and
//! CI run builds side by side), wall time counts every moment the bench
//! thread sat waiting for a core: at a load average of 8 on 2 cores a 15 ns
//! call reads as 60 ns. CPU time does not count waiting, so it stays put.
//! Process CPU (`CLOCK_PROCESS_CPUTIME_ID`) sums every thread of the bench,
//! which is what a multi-threaded bench wants too: for two threads it is the
//! CPU both spent per call (equal to one thread's means perfect scaling), and
//! for fan-out it includes the runtime workers that deliver to watchers.
//! Use `RESPCOORD_BENCH_CLOCK=wall` on an otherwise idle machine to see
//! elapsed time (and two-thread throughput) instead.

#![allow(dead_code)] // each bench uses a different part

use std::{
    sync::OnceLock,
    time::{Duration, Instant},
};

use criterion::{
    measurement::{Measurement, ValueFormatter},
    Throughput,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    ProcessCpu,
    Wall,
}

impl Clock {
    pub fn from_env() -> Self {
        match std::env::var("RESPCOORD_BENCH_CLOCK").as_deref() {
            Ok("wall") => Clock::Wall,
            Ok("cpu") | Err(_) => Clock::ProcessCpu,
            Ok(other) => panic!("RESPCOORD_BENCH_CLOCK={other}: expected `cpu` or `wall`"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Clock::ProcessCpu => "process CPU time",
            Clock::Wall => "wall time",
        }
    }

    /// A reading; only differences between two readings mean anything.
    pub fn now(self) -> Duration {
        match self {
            Clock::Wall => {
                static ORIGIN: OnceLock<Instant> = OnceLock::new();
                ORIGIN.get_or_init(Instant::now).elapsed()
            }
            Clock::ProcessCpu => {
                let mut ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: `ts` is a valid, writable timespec and the clock id
                // is a constant the kernel always supports.
                let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
                assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
                Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
            }
        }
    }

    pub fn measure(self, f: impl FnOnce()) -> Duration {
        let start = self.now();
        f();
        self.now().saturating_sub(start)
    }
}

/// True when criterion runs the benches as tests (`cargo test --all-targets`
/// runs every bench once, without `--bench`, in the debug profile): benches
/// then use small fixtures so the test command stays fast.
pub fn smoke_test() -> bool {
    let mut bench = false;
    let mut test = false;
    for arg in std::env::args() {
        bench |= arg == "--bench";
        test |= arg == "--test";
    }
    !bench || test
}

/// The criterion measurement over [`Clock`]; values are nanoseconds.
pub struct BenchClock(pub Clock);

impl BenchClock {
    pub fn from_env() -> Self {
        let clock = Clock::from_env();
        eprintln!(
            "measuring {} (RESPCOORD_BENCH_CLOCK=cpu|wall)",
            clock.name()
        );
        Self(clock)
    }
}

impl Measurement for BenchClock {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        self.0.now()
    }
    fn end(&self, start: Duration) -> Duration {
        self.0.now().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &NanosFormatter
    }
}

struct NanosFormatter;

impl ValueFormatter for NanosFormatter {
    fn scale_values(&self, ns: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = if ns < 1e3 {
            (1.0, "ns")
        } else if ns < 1e6 {
            (1e-3, "µs")
        } else if ns < 1e9 {
            (1e-6, "ms")
        } else {
            (1e-9, "s")
        };
        for value in values {
            *value *= factor;
        }
        unit
    }

    fn scale_throughputs(
        &self,
        typical_ns: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        let per_iteration = match *throughput {
            Throughput::Elements(n) | Throughput::ElementsAndBytes { elements: n, .. } => n,
            Throughput::Bytes(n) | Throughput::BytesDecimal(n) => n,
            Throughput::Bits(n) => n,
        } as f64;
        let per_second = per_iteration * 1e9 / typical_ns;
        let (divisor, unit) = if per_second < 1e3 {
            (1.0, " elem/s")
        } else if per_second < 1e6 {
            (1e3, "Kelem/s")
        } else if per_second < 1e9 {
            (1e6, "Melem/s")
        } else {
            (1e9, "Gelem/s")
        };
        for value in values {
            *value = per_iteration * 1e9 / *value / divisor;
        }
        unit
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}
