"""`promtool check metrics` for a test: the Prometheus text exposition parsed by
prometheus_client's parser (PyPI; promtool itself is a Go binary, not on PyPI), then the rules
promtool applies (client_golang's promlint: help text, counter and reserved suffixes, type
and abbreviated units in names, snake_case names and labels, base units) plus the format's
own invariants that the parser does not enforce (one TYPE per family and before its samples,
histogram buckets cumulative up to le="+Inf" = _count).

SGLANG_NAMES: promlint also refuses ':' in a name (reserved for recording rules) and the type
in a name; SGLang's own series, which its Grafana dashboard queries, are `sglang:...` and
include `sglang:prompt_tokens_histogram`, so those two rules are waived for the `sglang:`
names only (SGLang's own server exposes the same names)."""
import math
import re

from prometheus_client.parser import text_string_to_metric_families

SGLANG_PREFIX = "sglang:"
SNAKE = re.compile(r"^[a-z_:][a-z0-9_:]*$")
LABEL = re.compile(r"^[a-z_][a-z0-9_]*$")
# promlint's abbreviated units and their base units.
ABBREVIATED = {"s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d"}
NON_BASE = {"milliseconds": "seconds", "microseconds": "seconds", "nanoseconds": "seconds", "minutes": "seconds",
            "hours": "seconds", "days": "seconds", "kilobytes": "bytes", "megabytes": "bytes", "gigabytes": "bytes",
            "bits": "bytes", "celsius": "celsius is fine", "percent": "ratio"}
RESERVED_SUFFIXES = ("_bucket", "_count", "_sum")


def name_problems(name, kind):
    """promlint's rules on one family's name (as the TYPE line gives it)."""
    problems = []
    sglang = name.startswith(SGLANG_PREFIX)
    bare = name[len(SGLANG_PREFIX):] if sglang else name
    if ":" in bare:
        problems.append("metric names should not contain ':'")
    if not SNAKE.match(name):
        problems.append("metric names should be written in 'snake_case' not 'camelCase'")
    words = bare.split("_")
    if kind == "counter" and not name.endswith("_total"):
        problems.append('counter metrics should have "_total" suffix')
    if kind != "counter" and name.endswith("_total"):
        problems.append('non-counter metrics should not have "_total" suffix')
    if kind not in ("histogram", "summary") and name.endswith(RESERVED_SUFFIXES):
        problems.append("non-histogram and non-summary metrics should not have a reserved suffix")
    if not sglang and kind in words:
        problems.append(f"metric name should not include type '{kind}'")
    for word in words:
        if word in ABBREVIATED:
            problems.append(f"metric names should not contain abbreviated units ('{word}')")
        if word in NON_BASE and NON_BASE[word] != "celsius is fine":
            problems.append(f"use base unit {NON_BASE[word]!r} instead of {word!r}")
    return problems


def declared_families(text):
    """[(name, type)] of the TYPE lines, and problems of their order: each family declared
    once, before any sample of it."""
    declared, problems, seen_samples = [], [], set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if name in (n for n, _ in declared):
                problems.append(f"{name}: TYPE declared twice")
            if name in seen_samples:
                problems.append(f"{name}: TYPE after its samples")
            declared.append((name, kind))
        elif line and not line.startswith("#"):
            seen_samples.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return declared, problems


def histogram_problems(family):
    """Buckets cumulative and sorted by le, ending at +Inf with the _count."""
    problems, series = [], {}
    for sample in family.samples:
        labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        entry = series.setdefault(labels, {"buckets": [], "count": None})
        if sample.name.endswith("_bucket"):
            entry["buckets"].append((float(sample.labels["le"]), sample.value))
        elif sample.name.endswith("_count"):
            entry["count"] = sample.value
    for labels, entry in series.items():
        buckets = entry["buckets"]
        where = f"{family.name}{dict(labels)}"
        if not buckets or not math.isinf(buckets[-1][0]):
            problems.append(f"{where}: no le=\"+Inf\" bucket last")
            continue
        if [le for le, _ in buckets] != sorted(le for le, _ in buckets):
            problems.append(f"{where}: buckets not sorted by le")
        if any(b[1] < a[1] for a, b in zip(buckets, buckets[1:])):
            problems.append(f"{where}: buckets not cumulative")
        if entry["count"] != buckets[-1][1]:
            problems.append(f"{where}: _count {entry['count']} != le=\"+Inf\" bucket {buckets[-1][1]}")
    return problems


def lint(text):
    """Every problem `promtool check metrics` would report on `text` (the sglang: waivers
    above), and the exposition's own inconsistencies; [] when clean."""
    families = list(text_string_to_metric_families(text))  # raises on text that does not parse
    declared, problems = declared_families(text)
    for name, kind in declared:
        problems += [f"{name}: {p}" for p in name_problems(name, kind)]
    for family in families:
        if not family.documentation:
            problems.append(f"{family.name}: no help text")
        for sample in family.samples:
            problems += [f"{family.name}: label {k!r} is not snake_case" for k in sample.labels if not LABEL.match(k)]
        if family.type == "histogram":
            problems += histogram_problems(family)
    return problems
