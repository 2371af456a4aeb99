"""Checks the Grafana dashboard against the metrics respcoord exports.

    check_dashboard.py DASHBOARD.json METRICS_DOC...

The dashboard must be valid JSON with panels, and every metric name in its
PromQL (panel targets and templating queries) must be one the service
exports, as documented in the first METRICS_DOC that lists metrics: the
README's "Metrics" section, or the series table of src/metrics.rs: every
backticked `respcoord_*`, `rpc_server_*` or `process_*` name there. Histogram
names written `name_{bucket,sum,count}`, `name_bucket`, `_sum`, `_count`, or
by a base name ending in `_seconds` or `_bytes` on a line that says
"histogram", stand for the three series.
tests/deploy_dashboard.rs checks the same names against a running server's
/metrics.
"""

import json
import re
import sys

# PromQL words that look like identifiers but are not metric names.
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "inf", "nan", "atan2",
}
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# The service's series: its own (respcoord_*), the RPC histogram named by
# the OpenTelemetry semantic conventions (rpc_server_*), and the standard
# process series (process_*).
SERIES = r"(respcoord|rpc_server|process)_[a-z0-9_]+"


def metric_names(expr):
    """Metric names in a PromQL expression (also Grafana's label_values(...))."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges and subqueries
    e = re.sub(r"\$\{?\w+(?::\w+)?\}?", "", e)  # Grafana variables
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    # label_values(metric, label): the label is not a metric.
    e = re.sub(rf"\blabel_values\s*\(\s*({NAME})\s*,\s*{NAME}\s*\)", r" \1 ", e)
    names = set()
    for m in re.finditer(rf"(?<![\w.]){NAME}", e):
        word = m.group(0)
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in KEYWORDS:
            continue  # a function or aggregation, or a keyword
        if re.fullmatch(r"\d.*", word):
            continue
        names.add(word)
    return names


def expressions(dashboard):
    """(where, expr) for every query in the dashboard."""
    out = []

    def panels(items):
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if "expr" in target:
                out.append((f"panel {panel.get('title')!r}", target["expr"]))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var.get("query")
            query = query.get("query") if isinstance(query, dict) else query
            if query:
                out.append((f"variable ${var.get('name')}", query))
    return out


def documented(path):
    text = open(path).read()
    if path.endswith(".md"):
        m = re.search(r"^## Metrics\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
        if not m:
            return set()
        text = m.group(1)
    else:  # a Rust source: its module doc's series table
        text = "\n".join(line[3:] for line in text.splitlines() if line.startswith("//!"))
    names, histograms = set(), set()
    for line in text.splitlines():
        last = None
        for token in re.findall(r"`([^`]+)`", line):
            brace = re.fullmatch(rf"({NAME})\{{([a-z,]+)\}}", token)
            if brace:
                candidates = {f"{brace.group(1)}_{s}".replace("__", "_") for s in brace.group(2).split(",")}
            elif re.fullmatch(r"_(bucket|sum|count)", token) and last:
                # `x_bucket`, `_sum`, `_count`: suffixes of the name before.
                candidates = {re.sub(r"_(bucket|sum|count)$", "", last) + token}
            else:
                candidates = {token}
            # Series names, not label names (rpc_method, ...) nor OTel names.
            series = {c for c in candidates if re.fullmatch(SERIES, c)}
            names |= series
            if "histogram" in line:
                histograms |= series
            if series and not brace:
                last = sorted(series)[0]
    # A histogram documented by its base name has the three series (a gauge
    # such as process_resident_memory_bytes does not).
    names |= {f"{n}_{s}" for n in histograms if re.search(r"_(seconds|bytes)$", n)
              for s in ("bucket", "sum", "count")}
    return names


def main(argv):
    path, docs = argv[1], argv[2:]
    try:
        with open(path) as f:
            dashboard = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"FAIL {path}: not valid JSON: {e}")
        return 1
    exported, source = set(), None
    for doc in docs:
        exported = documented(doc)
        if exported:
            source = doc
            break
    if not exported:
        print(f"FAIL {path}: no metrics list found in {', '.join(docs)}")
        return 1

    problems = []
    if not dashboard.get("title") or not dashboard.get("uid"):
        problems.append("the dashboard needs a title and a uid")
    queries = expressions(dashboard)
    if not queries:
        problems.append("the dashboard has no queries")
    used = set()
    for where, expr in queries:
        names = metric_names(expr)
        if not names and where.startswith("panel"):
            problems.append(f"{where}: no metric in {expr!r}")
        for name in sorted(names - exported):
            problems.append(f"{where}: {name!r} is not exported (in {expr!r})")
        used |= names
    unused = sorted({n for n in exported if not re.search(r"_(sum)$", n)} - used)
    if problems:
        print(f"FAIL {path}:")
        for p in problems:
            print(f"  - {p}")
        return 1
    note = f"; not charted: {', '.join(unused)}" if unused else ""
    print(f"ok   {path}: {len(queries)} queries over {len(used)} metrics, all exported ({source}){note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
