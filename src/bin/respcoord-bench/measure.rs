//! What every command measures with: the machine it runs on, the CPU time
//! and resident memory of this process (Linux /proc), and the statistics
//! over latency samples.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn print_machine() {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    println!("machine: {cores} cores (available_parallelism), cpu model: {model}");
    println!("load average at start: {}", loadavg());
    println!(
        "build: {}",
        if cfg!(debug_assertions) {
            "DEBUG (numbers are meaningless: use --release)"
        } else {
            "release"
        }
    );
}

/// /proc/loadavg's first three fields: other work on the machine skews
/// absolute numbers (the ratios less so).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

pub fn unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

pub const SERVER_THREADS: &str = "bench-server";

pub const CLIENT_THREADS: &str = "bench-client";

/// On-CPU time so far of this process's threads named `SERVER_THREADS` and
/// `CLIENT_THREADS` (per-thread schedstat, nanoseconds). CPU per call is far
/// steadier than throughput on a machine shared with other work.
pub fn cpu_by_role() -> (Duration, Duration) {
    let (mut server, mut client) = (0u64, 0u64);
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.filter_map(Result::ok) {
            let path = task.path();
            let Ok(name) = std::fs::read_to_string(path.join("comm")) else {
                continue;
            };
            let Some(nanos) = std::fs::read_to_string(path.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            else {
                continue;
            };
            match name.trim() {
                SERVER_THREADS => server += nanos,
                CLIENT_THREADS => client += nanos,
                _ => {}
            }
        }
    }
    (Duration::from_nanos(server), Duration::from_nanos(client))
}

/// Resident set size of this process, bytes (VmRSS).
pub fn rss_bytes() -> u64 {
    rss_of("self").unwrap_or(0)
}

/// Resident set size of process `pid` ("self" for this one), bytes.
pub fn rss_of(pid: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                let kb = line.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?;
                kb.trim().parse::<u64>().ok()
            })
        })
        .map(|kb| kb * 1024)
}

/// CPU time (user + system) of the whole process so far, from
/// /proc/self/stat (clock ticks of 1/100 s, Linux's USER_HZ).
pub fn process_cpu() -> Duration {
    process_cpu_of("self")
}

/// As [`process_cpu`], of the process `pid` (a number, or `self`).
pub fn process_cpu_of(pid: &str) -> Duration {
    let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // Fields after the parenthesised command name; utime and stime
            // are fields 14 and 15 of the whole line.
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            Some(utime + stime)
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Sum of every thread's on-CPU time in nanoseconds (schedstat), finer than
/// clock ticks; threads that exit between two reads drop out.
pub fn threads_cpu() -> Duration {
    threads_cpu_of("self")
}

/// As [`threads_cpu`], of the process `pid` (a number, or `self`).
pub fn threads_cpu_of(pid: &str) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Duration::ZERO;
    };
    let nanos: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(nanos)
}

/// Nearest-rank percentiles over a sorted copy.
pub struct Percentiles {
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

pub fn percentiles(values: &mut [u64]) -> Option<Percentiles> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let at = |p: f64| {
        let rank = (p * values.len() as f64).ceil() as usize;
        values[rank.clamp(1, values.len()) - 1]
    };
    Some(Percentiles {
        p50: at(0.50),
        p99: at(0.99),
        p999: at(0.999),
        max: values[values.len() - 1],
    })
}

pub fn ms(nanos: u64) -> String {
    format!("{:.3} ms", nanos as f64 / 1e6)
}

pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}
