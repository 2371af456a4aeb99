//! The standard process series every Prometheus client library exports
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, ...),
//! read from procfs when `/metrics` is scraped. Linux only; elsewhere the
//! series are absent.
//!
//! Not the `prometheus` crate's `process` feature: it adds six crates
//! (procfs, procfs-core, a second rustix, linux-raw-sys, hex, bitflags) for
//! what is a handful of text files here, and its CPU counter counts whole
//! seconds, which leaves `rate()` of a mostly idle service at zero. These
//! are registered on the Prometheus registry directly rather than as
//! OpenTelemetry instruments, so they keep their conventional names and
//! are not pushed over OTLP (an OTLP collector has its own host metrics).

use prometheus::{
    core::{Collector, Desc},
    proto::MetricFamily,
    Counter, Gauge,
};

type Spec = (&'static str, &'static str);

const CPU: Spec = (
    "process_cpu_seconds_total",
    "Total user and system CPU time spent in seconds.",
);
const RESIDENT: Spec = (
    "process_resident_memory_bytes",
    "Resident memory size in bytes.",
);
const VIRTUAL: Spec = (
    "process_virtual_memory_bytes",
    "Virtual memory size in bytes.",
);
const OPEN_FDS: Spec = ("process_open_fds", "Number of open file descriptors.");
const MAX_FDS: Spec = (
    "process_max_fds",
    "Maximum number of open file descriptors.",
);
const START_TIME: Spec = (
    "process_start_time_seconds",
    "Start time of the process since unix epoch in seconds.",
);

/// Auxiliary vector keys (`<elf.h>`): what `sysconf(_SC_PAGESIZE)` and
/// `sysconf(_SC_CLK_TCK)` answer from, read without `libc` or `unsafe`.
const AT_PAGESZ: usize = 6;
const AT_CLKTCK: usize = 17;

/// This process's `/proc` series.
pub(super) struct ProcessCollector {
    descs: Vec<Desc>,
    /// Clock ticks per second: the unit of CPU times and the start time.
    ticks: f64,
    page_size: f64,
    /// Unix seconds; fixed for the process's life.
    start_time: Option<f64>,
}

impl ProcessCollector {
    /// `None` where procfs does not say how long a clock tick or a page is
    /// (no `/proc`): then the series are left out rather than guessed.
    pub(super) fn new() -> Option<Self> {
        let auxv = std::fs::read("/proc/self/auxv").ok()?;
        let ticks = auxv_value(&auxv, AT_CLKTCK).filter(|&t| t > 0)? as f64;
        let page_size = auxv_value(&auxv, AT_PAGESZ).filter(|&p| p > 0)? as f64;
        let mut descs = Vec::new();
        for (name, help) in [CPU, RESIDENT, VIRTUAL, OPEN_FDS, MAX_FDS, START_TIME] {
            let metric: Box<dyn Collector> = if name == CPU.0 {
                Box::new(Counter::new(name, help).ok()?)
            } else {
                Box::new(Gauge::new(name, help).ok()?)
            };
            descs.extend(metric.desc().into_iter().cloned());
        }
        let boot_time = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|text| boot_time(&text));
        let start_ticks = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|text| Stat::parse(&text))
            .map(|stat| stat.start_ticks);
        let start_time = boot_time
            .zip(start_ticks)
            .map(|(boot, ticks_since)| boot as f64 + ticks_since as f64 / ticks);
        Some(Self {
            descs,
            ticks,
            page_size,
            start_time,
        })
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    /// Fresh metrics on every scrape, so two scrapes at once never race on
    /// a stored counter; a file that cannot be read leaves its series out.
    fn collect(&self) -> Vec<MetricFamily> {
        let mut families = Vec::with_capacity(6);
        if let Some(stat) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|text| Stat::parse(&text))
        {
            let cpu_ticks = stat.user_ticks.saturating_add(stat.system_ticks);
            families.extend(counter(CPU, cpu_ticks as f64 / self.ticks));
            families.extend(gauge(RESIDENT, stat.rss_pages as f64 * self.page_size));
            families.extend(gauge(VIRTUAL, stat.virtual_bytes as f64));
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            families.extend(gauge(OPEN_FDS, entries.count() as f64));
        }
        if let Some(max) = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|text| max_open_files(&text))
        {
            families.extend(gauge(MAX_FDS, max as f64));
        }
        if let Some(start) = self.start_time {
            families.extend(gauge(START_TIME, start));
        }
        families
    }
}

fn counter((name, help): Spec, value: f64) -> Option<MetricFamily> {
    let counter = Counter::new(name, help).ok()?;
    counter.inc_by(value.max(0.0));
    counter.collect().pop()
}

fn gauge((name, help): Spec, value: f64) -> Option<MetricFamily> {
    let gauge = Gauge::new(name, help).ok()?;
    gauge.set(value);
    gauge.collect().pop()
}

/// The fields of `/proc/self/stat` used here (proc(5)).
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    user_ticks: u64,
    system_ticks: u64,
    /// Clock ticks after boot at which the process started.
    start_ticks: u64,
    virtual_bytes: u64,
    rss_pages: u64,
}

impl Stat {
    fn parse(text: &str) -> Option<Self> {
        // The command name (field 2) is in parentheses and may hold spaces
        // and parentheses itself: fields are counted after the last ')'.
        let (_, rest) = text.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3 (state); proc(5) numbers from 1.
        let field = |number: usize| -> Option<u64> { fields.get(number - 3)?.parse().ok() };
        Some(Self {
            user_ticks: field(14)?,
            system_ticks: field(15)?,
            start_ticks: field(22)?,
            virtual_bytes: field(23)?,
            rss_pages: field(24)?,
        })
    }
}

/// The `btime` line of `/proc/stat`: boot time, Unix seconds.
fn boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|value| value.trim().parse().ok())
}

/// The soft limit on open files from `/proc/self/limits`; `None` if
/// unlimited or unreadable.
fn max_open_files(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|soft| soft.parse().ok())
}

/// The value of `key` in the auxiliary vector: native-endian word pairs,
/// ended by a zero key.
fn auxv_value(auxv: &[u8], key: usize) -> Option<usize> {
    const WORD: usize = std::mem::size_of::<usize>();
    let word = |bytes: &[u8]| bytes.try_into().ok().map(usize::from_ne_bytes);
    auxv.chunks_exact(2 * WORD)
        .map_while(|pair| {
            let found = word(&pair[..WORD])?;
            (found != 0).then_some((found, word(&pair[WORD..])?))
        })
        .find_map(|(found, value)| (found == key).then_some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with a space and a parenthesis of its own.
        let line = "4242 (respcoord (x)) S 1 4242 4242 0 -1 4194560 2405 0 0 0 \
                    157 31 0 0 20 0 9 0 1234567 2080374784 3301 18446744073709551615 \
                    1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                user_ticks: 157,
                system_ticks: 31,
                start_ticks: 1_234_567,
                virtual_bytes: 2_080_374_784,
                rss_pages: 3301,
            })
        );
        assert_eq!(Stat::parse("4242 (truncated) S 1 2"), None);
    }

    #[test]
    fn limits_and_boot_time_are_read_from_their_lines() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             63459                63459                processes \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(max_open_files(limits), Some(1024));
        assert_eq!(
            max_open_files(
                "Max open files            unlimited            unlimited            files"
            ),
            None
        );
        assert_eq!(
            boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn auxv_pairs_end_at_the_zero_key() {
        let mut auxv = Vec::new();
        for (key, value) in [(AT_PAGESZ, 4096usize), (AT_CLKTCK, 100), (0, 0), (99, 7)] {
            auxv.extend(key.to_ne_bytes());
            auxv.extend(value.to_ne_bytes());
        }
        assert_eq!(auxv_value(&auxv, AT_CLKTCK), Some(100));
        assert_eq!(auxv_value(&auxv, AT_PAGESZ), Some(4096));
        assert_eq!(auxv_value(&auxv, 99), None, "past the end marker");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_every_series() {
        let collector = ProcessCollector::new().expect("procfs on Linux");
        let names: Vec<String> = collector
            .collect()
            .iter()
            .map(|family| family.name().to_owned())
            .collect();
        for (name, _) in [CPU, RESIDENT, VIRTUAL, OPEN_FDS, MAX_FDS, START_TIME] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
        assert_eq!(collector.desc().len(), 6);
    }
}
