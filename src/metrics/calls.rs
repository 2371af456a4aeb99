//! `rpc.server.call.duration` without the OpenTelemetry SDK on the call
//! path: each call adds to two plain atomic counters (its bucket and its
//! summed nanoseconds) in a table indexed by method and status code, and
//! `/metrics` reads the table when it is scraped, as the same Prometheus
//! histogram the SDK rendered (`rpc_server_call_duration_seconds_*`, same
//! help, labels, buckets).
//!
//! Why: the SDK's `Histogram::record` looks the call's three attributes up
//! in a map keyed by the attributes themselves, hashing three key-value
//! pairs with SipHash on every call: about 1,700 instructions of a
//! 60,000-instruction Start, the largest single item respcoord added to
//! the transport's own cost (docs/performance.md, issue 43). A call here
//! costs two uncontended atomic adds; the summing moves to the scrape.
//!
//! With OTLP metric export on, the SDK's histogram is kept (OTLP reads
//! only SDK instruments), and this table is not used: see `RpcMetrics`.

use std::{
    cell::Cell,
    sync::atomic::{AtomicU64, AtomicUsize, Ordering},
    time::Duration,
};

use prometheus::{
    core::{Collector, Desc},
    proto::{Bucket, Histogram, LabelPair, Metric, MetricFamily, MetricType},
};
use tonic::Code;

use crate::grpc::status;

/// Every method this server serves, as spans and metrics name it, then
/// `_OTHER` (the OpenTelemetry convention) for a path it does not serve, so
/// a client cannot mint label values or span names.
const METHODS: [&str; 12] = [
    "respcoord.v1.ResponseCoordinator/Start",
    "respcoord.v1.ResponseCoordinator/Finish",
    "respcoord.v1.ResponseCoordinator/Cancel",
    "respcoord.v1.ResponseCoordinator/Shutdown",
    "respcoord.v1.ResponseCoordinator/GetState",
    "respcoord.v1.ResponseCoordinator/ListSessions",
    "respcoord.v1.ResponseCoordinator/Watch",
    "grpc.health.v1.Health/Check",
    "grpc.health.v1.Health/Watch",
    "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "_OTHER",
];

/// A method by its place in the server's list: no allocation and no
/// string compare after the call's path is read once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Method(u8);

impl Method {
    /// The method a request path names, or `_OTHER`.
    pub fn of_path(path: &str) -> Self {
        let path = path.trim_start_matches('/');
        let known = &METHODS[..METHODS.len() - 1];
        let index = known
            .iter()
            .position(|method| *method == path)
            .unwrap_or(METHODS.len() - 1);
        // Twelve methods: the index fits.
        Method(index as u8)
    }

    fn index(self) -> usize {
        usize::from(self.0)
    }

    pub fn name(self) -> &'static str {
        METHODS[self.index()]
    }
}

/// Histogram buckets for call durations, in seconds: coordinator calls take
/// microseconds, so the low end is fine-grained; Watch streams land high.
pub const DURATION_BUCKETS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 10.0, 60.0,
];

/// [`DURATION_BUCKETS`] in nanoseconds (each is a whole number of them).
const BOUNDS_NANOS: [u64; 17] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    10_000_000_000,
    60_000_000_000,
];

/// gRPC status codes are 0 (OK) to 16 (UNAUTHENTICATED).
const CODES: usize = 17;
/// Per method and code: a count per bucket, the overflow's, the summed
/// nanoseconds.
const SLOTS: usize = BOUNDS_NANOS.len() + 2;
const SUM: usize = SLOTS - 1;
const CELLS: usize = METHODS.len() * CODES * SLOTS;

pub const NAME: &str = "rpc_server_call_duration_seconds";
pub const HELP: &str =
    "Duration of incoming gRPC calls (for Watch, the whole stream), by method and status code";

/// The table, striped so that threads on different cores add to different
/// cache lines; a reader sums the stripes.
#[derive(Debug)]
pub struct CallDurations {
    stripes: Box<[Box<[AtomicU64]>]>,
}

impl Default for CallDurations {
    fn default() -> Self {
        let stripes = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .clamp(1, 8);
        Self {
            stripes: (0..stripes)
                .map(|_| (0..CELLS).map(|_| AtomicU64::new(0)).collect())
                .collect(),
        }
    }
}

/// This thread's stripe, handed out in turn at a thread's first call.
fn stripe_of_thread() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<Option<usize>> = const { Cell::new(None) };
    }
    STRIPE.with(|stripe| match stripe.get() {
        Some(index) => index,
        None => {
            let index = NEXT.fetch_add(1, Ordering::Relaxed);
            stripe.set(Some(index));
            index
        }
    })
}

fn code_index(code: Code) -> usize {
    usize::try_from(i32::from(code))
        .ok()
        .filter(|&index| index < CODES)
        .unwrap_or(Code::Unknown as usize)
}

impl CallDurations {
    /// One finished call.
    pub fn record(&self, method: Method, code: Code, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let bucket = BOUNDS_NANOS
            .iter()
            .position(|&bound| nanos <= bound)
            .unwrap_or(BOUNDS_NANOS.len());
        let cells = &self.stripes[stripe_of_thread() % self.stripes.len()];
        let base = (method.index() * CODES + code_index(code)) * SLOTS;
        cells[base + bucket].fetch_add(1, Ordering::Relaxed);
        cells[base + SUM].fetch_add(nanos, Ordering::Relaxed);
    }

    /// One method and code's counts per bucket and summed nanoseconds, over
    /// every stripe.
    fn read(&self, method: usize, code: usize) -> [u64; SLOTS] {
        let base = (method * CODES + code) * SLOTS;
        let mut sums = [0u64; SLOTS];
        for cells in self.stripes.iter() {
            for (sum, cell) in sums.iter_mut().zip(&cells[base..base + SLOTS]) {
                *sum = sum.wrapping_add(cell.load(Ordering::Relaxed));
            }
        }
        sums
    }

    /// The histogram as Prometheus reads it: a series per method and code
    /// that has seen a call.
    pub fn family(&self) -> MetricFamily {
        let mut metrics = Vec::new();
        for (method, name) in METHODS.iter().enumerate() {
            for code in 0..CODES {
                let slots = self.read(method, code);
                let count: u64 = slots[..SUM].iter().sum();
                if count == 0 {
                    continue;
                }
                let code_name = status::code_name(Code::from(code as i32));
                metrics.push(series(name, code_name, &slots, count));
            }
        }
        let mut family = MetricFamily::default();
        family.set_name(NAME.to_owned());
        family.set_help(HELP.to_owned());
        family.set_field_type(MetricType::HISTOGRAM);
        family.set_metric(metrics);
        family
    }
}

fn label(name: &str, value: &str) -> LabelPair {
    let mut pair = LabelPair::default();
    pair.set_name(name.to_owned());
    pair.set_value(value.to_owned());
    pair
}

/// One method and code's series, with cumulative buckets (the encoder adds
/// `+Inf`, the count).
fn series(method: &str, code: &str, slots: &[u64; SLOTS], count: u64) -> Metric {
    let mut cumulative = 0;
    let buckets = DURATION_BUCKETS
        .iter()
        .zip(slots)
        .map(|(&bound, &n)| {
            cumulative += n;
            let mut bucket = Bucket::default();
            bucket.set_upper_bound(bound);
            bucket.set_cumulative_count(cumulative);
            bucket
        })
        .collect();
    let mut histogram = Histogram::default();
    histogram.set_sample_count(count);
    histogram.set_sample_sum(slots[SUM] as f64 / 1e9);
    histogram.set_bucket(buckets);
    let mut metric = Metric::from_label(vec![
        label("rpc_method", method),
        label("rpc_response_status_code", code),
        label("rpc_system_name", "grpc"),
    ]);
    metric.set_histogram(histogram);
    metric
}

/// Registers the table with the Prometheus registry `/metrics` renders.
pub struct CallDurationsCollector {
    durations: std::sync::Arc<CallDurations>,
    desc: Desc,
}

impl CallDurationsCollector {
    pub fn new(durations: std::sync::Arc<CallDurations>) -> prometheus::Result<Self> {
        let desc = Desc::new(
            NAME.to_owned(),
            HELP.to_owned(),
            vec![
                "rpc_method".to_owned(),
                "rpc_response_status_code".to_owned(),
                "rpc_system_name".to_owned(),
            ],
            Default::default(),
        )?;
        Ok(Self { durations, desc })
    }
}

impl Collector for CallDurationsCollector {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let family = self.durations.family();
        if family.get_metric().is_empty() {
            Vec::new()
        } else {
            vec![family]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_named_by_path_and_unknown_paths_are_other() {
        let start = Method::of_path("/respcoord.v1.ResponseCoordinator/Start");
        assert_eq!(start.name(), "respcoord.v1.ResponseCoordinator/Start");
        assert_eq!(Method::of_path("/nope/Nope").name(), "_OTHER");
        assert_eq!(Method::of_path("/_OTHER").name(), "_OTHER");
    }

    #[test]
    fn bounds_are_the_buckets_in_nanoseconds() {
        for (seconds, nanos) in DURATION_BUCKETS.iter().zip(BOUNDS_NANOS) {
            assert_eq!((seconds * 1e9).round() as u64, nanos);
        }
    }

    #[test]
    fn a_call_lands_in_the_first_bucket_that_holds_it_and_buckets_are_cumulative() {
        let durations = CallDurations::default();
        let start = Method::of_path("/respcoord.v1.ResponseCoordinator/Start");
        durations.record(start, Code::Ok, Duration::from_micros(50));
        durations.record(start, Code::Ok, Duration::from_micros(51));
        durations.record(start, Code::Ok, Duration::from_secs(61));
        durations.record(start, Code::NotFound, Duration::from_millis(3));
        let family = durations.family();
        assert_eq!(family.name(), NAME);
        let metrics = family.get_metric();
        assert_eq!(metrics.len(), 2);
        let ok = metrics[0].get_histogram();
        assert_eq!(ok.get_sample_count(), 3);
        assert!((ok.get_sample_sum() - 61.000_101).abs() < 1e-9);
        let counts: Vec<u64> = ok
            .get_bucket()
            .iter()
            .map(|bucket| bucket.cumulative_count())
            .collect();
        assert_eq!(counts[0], 1);
        assert_eq!(counts[1], 2);
        assert_eq!(counts[16], 2, "61 s is only in +Inf");
        let labels: Vec<(&str, &str)> = metrics[1]
            .get_label()
            .iter()
            .map(|pair| (pair.name(), pair.value()))
            .collect();
        assert_eq!(
            labels,
            [
                ("rpc_method", "respcoord.v1.ResponseCoordinator/Start"),
                ("rpc_response_status_code", "NOT_FOUND"),
                ("rpc_system_name", "grpc"),
            ]
        );
    }
}
