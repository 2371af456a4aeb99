//! The Grafana dashboard (`deploy/grafana/respcoord.json`) queries only
//! series the service really exports: the real binary is started with a
//! metrics port, driven through every kind of call, and every metric name in
//! the dashboard's PromQL must appear in its `/metrics`: on the memory
//! backend for all but the NATS panels, and on the NATS backend for all of
//! them when NATS is there to test against. (deploy/check.sh checks the
//! same names against the documented list.)

mod common;

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use common::{
    fresh_bucket, nats_available, spawn_respcoord, test_nats_url, try_http_get, PATIENCE,
};
use respcoord::proto::v1 as pb;
use tokio_stream::StreamExt;

const DASHBOARD: &str = include_str!("../deploy/grafana/respcoord.json");

/// Series names in a Prometheus text exposition (`_bucket`, `_sum`,
/// `_count` included, as PromQL names them).
fn exposition_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// The JSON string values of every `"expr"` (panel query) and
/// `"definition"` (query variable) key in the dashboard (a scan, not a JSON parser: the file is pretty-printed by
/// us, and deploy/check.sh parses it as JSON).
fn queries(json: &str) -> Vec<String> {
    let mut out = Vec::new();
    for key in ["\"expr\":", "\"definition\":"] {
        let mut rest = json;
        while let Some(at) = rest.find(key) {
            rest = rest[at + key.len()..].trim_start();
            if let Some(body) = rest.strip_prefix('"') {
                let mut value = String::new();
                let mut chars = body.chars();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => match chars.next() {
                            Some('n') => value.push('\n'),
                            Some('t') => value.push('\t'),
                            Some(other) => value.push(other),
                            None => break,
                        },
                        c => value.push(c),
                    }
                }
                out.push(value);
            }
        }
    }
    out
}

/// Metric names in a PromQL expression (or Grafana's `label_values(m, l)`):
/// identifiers outside strings, label matchers, ranges and grouping clauses
/// that are not functions, keywords or Grafana variables.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: [&str; 8] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
    ];
    const OPERATORS: [&str; 3] = ["and", "or", "unless"];
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let mut skip_group = false;
    let mut in_label_values = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    i += 1;
                }
                i += 1;
            }
            '$' => {
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || "_{}:".contains(chars[i])) {
                    i += 1;
                }
            }
            '(' if skip_group => {
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                skip_group = false;
                i += 1;
            }
            ',' if in_label_values => {
                // label_values(metric, label): skip the label.
                in_label_values = false;
                i += 1;
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i]))
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let preceded_by_number =
                    start > 0 && (chars[start - 1].is_ascii_digit() || chars[start - 1] == '.');
                let rest: String = chars[i..].iter().collect();
                let rest = rest.trim_start();
                // `sum by (l) (...)`: an aggregation, like `sum(...)`.
                let grouped = ["by", "without"].iter().any(|k| {
                    rest.strip_prefix(k).is_some_and(|after| {
                        after.starts_with(|c: char| c.is_whitespace() || c == '(')
                    })
                });
                let next = if grouped {
                    Some('(')
                } else {
                    rest.chars().next()
                };
                if preceded_by_number {
                    continue;
                }
                if KEYWORDS.contains(&word.as_str()) {
                    skip_group = word != "bool" && word != "offset";
                } else if next == Some('(') {
                    if word == "label_values" {
                        in_label_values = true;
                    }
                } else if !OPERATORS.contains(&word.to_lowercase().as_str()) {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn the_promql_scanner_finds_metric_names_only() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (le, rpc_method) (rate(a_bucket{rpc_method=~"x.+", pod=~"$pod"}[$__rate_interval]))) / clamp_min(sum(b_total offset 5m), 1e-9) and on(pod) c"#,
    );
    assert_eq!(names, ["a_bucket", "b_total", "c"].map(String::from).into());
    assert_eq!(
        metric_names(r#"label_values(respcoord_sessions{namespace="$namespace"}, pod)"#),
        ["respcoord_sessions".to_owned()].into()
    );
}

/// The series names `/metrics` exports after every kind of call, from the
/// real binary started with `envs`.
async fn exported_after_traffic(envs: &[(&str, &str)]) -> BTreeSet<String> {
    let (process, mut client) = spawn_respcoord(envs).await;

    // Every kind of call, including failing ones, and a watch.
    let mut watch = client
        .watch(pb::WatchRequest {
            session_id: "dash-1".into(),
            after_revision: Some(0),
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let started = client
        .start(pb::StartRequest {
            session_id: "dash-1".into(),
            ..Default::default()
        })
        .await
        .expect("start")
        .into_inner();
    client
        .finish(pb::FinishRequest {
            session_id: "dash-1".into(),
            response_id: started.response_id,
            ..Default::default()
        })
        .await
        .expect("finish");
    client
        .cancel(pb::CancelRequest {
            session_id: "dash-1".into(),
            ..Default::default()
        })
        .await
        .expect("cancel");
    let _ = client
        .get_state(pb::GetStateRequest {
            session_id: "no-such-session".into(),
        })
        .await
        .expect_err("NOT_FOUND");
    client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("list");
    client
        .shutdown(pb::ShutdownRequest {
            session_id: "dash-1".into(),
            source: pb::Source::Unspecified.into(),
        })
        .await
        .expect("shutdown");
    // The session watch ends after `terminated`.
    while let Some(item) = tokio::time::timeout(PATIENCE, watch.next())
        .await
        .expect("watch ends")
    {
        item.expect("watch item");
    }

    let deadline = Instant::now() + PATIENCE;
    loop {
        match try_http_get(process.metrics, "/metrics").await {
            Ok((200, body)) => return exposition_names(&body),
            result if Instant::now() < deadline => {
                let _ = result;
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            result => panic!("GET /metrics: {result:?}"),
        }
    }
}

/// Series that exist only on the NATS backend (`respcoord_nats_*`) or only
/// where procfs is (`process_*`, Linux).
fn conditional(name: &str, nats: bool) -> bool {
    (!nats && name.starts_with("respcoord_nats_"))
        || (cfg!(not(target_os = "linux")) && name.starts_with("process_"))
}

/// Checks the dashboard against what one server exported: every name it
/// queries is exported (save those `conditional` leaves out), and every
/// series of the service is charted.
fn check(exported: &BTreeSet<String>, nats: bool) {
    let queries = queries(DASHBOARD);
    assert!(
        queries.len() >= 10,
        "the dashboard has {} queries",
        queries.len()
    );
    let used: BTreeSet<String> = queries.iter().flat_map(|q| metric_names(q)).collect();
    let missing: Vec<&String> = used
        .difference(exported)
        .filter(|name| !conditional(name, nats))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries {missing:?}, which /metrics does not export; it exports {exported:?}"
    );
    // Every series the service has is on the dashboard (the histograms'
    // _sum are charted through the mean latency panels).
    let uncharted: Vec<&String> = exported
        .iter()
        .filter(|name| {
            ["respcoord_", "rpc_server_", "process_"]
                .iter()
                .any(|prefix| name.starts_with(prefix))
        })
        // Not worth a panel: the virtual size (mimalloc reserves far more
        // than it uses) and the start time.
        .filter(|name| {
            !["process_virtual_memory_bytes", "process_start_time_seconds"].contains(&name.as_str())
        })
        .filter(|name| !used.contains(*name))
        .collect();
    assert!(uncharted.is_empty(), "not on the dashboard: {uncharted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_is_exported() {
    let exported = exported_after_traffic(&[]).await;
    let nats_only: Vec<&String> = exported
        .iter()
        .filter(|name| name.starts_with("respcoord_nats_"))
        .collect();
    assert!(nats_only.is_empty(), "on the memory backend: {nats_only:?}");
    check(&exported, false);
}

/// The NATS backend's panels, against a server on that backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_is_exported_on_nats() {
    if !nats_available() {
        return;
    }
    let (url, bucket) = (test_nats_url(), fresh_bucket());
    let exported = exported_after_traffic(&[
        ("RESPCOORD_BACKEND", "nats"),
        ("RESPCOORD_NATS_URL", &url),
        ("RESPCOORD_NATS_BUCKET", &bucket),
        // Nothing left on the shared server's disk.
        ("RESPCOORD_NATS_MEMORY_STORAGE", "true"),
        // Past the idle plus tombstone TTLs, as the server requires.
        ("RESPCOORD_NATS_MAX_AGE", "2h"),
    ])
    .await;
    check(&exported, true);
}
