#!/usr/bin/env python3
"""Checks a /metrics page of vfio-dra-plugin as Prometheus reads it, and against the README.

The page is parsed with the Prometheus Python client's text-format parser (Debian's
python3-prometheus-client; Debian's promtool comes only with the whole Prometheus server, about
96 MB). That parser is lenient where Prometheus is not, so this also checks, line by line, what
Prometheus's own parser rejects: metric and label names, one HELP and one TYPE per family before
its samples, a family's lines together, no series twice. Then every family must be in the
README's Metrics table with the type and label names given there, and the other way round;
counters end in _total, every family has help text, and each histogram series has ascending
buckets, cumulative counts and a +Inf bucket equal to its _count.

Usage: check_exposition.py README.md PAGE_FILE   (exit 1 and one line per problem)
       check_exposition.py --self-test README.md   (each of a list of broken pages is reported)
Run it with Debian's /usr/bin/python3: an interpreter from elsewhere (pyenv) does not see the
python3-* packages."""
import re
import sys

from prometheus_client.parser import text_string_to_metric_families

METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
SAMPLE = re.compile(r"^([^\s{]+)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?$")
LABEL_PAIR = re.compile(r'\s*([^=\s]+)="((?:[^"\\]|\\.)*)"\s*(,|$)')
SUFFIXES = ("_bucket", "_count", "_sum")


def readme_table(readme_text):
    """{name: (type, {label names})} from the rows of the README's Metrics table."""
    section = readme_text.split("### Metrics", 1)[1].split("\n#", 1)[0]
    table = {}
    for row in re.findall(r"^\| `(\w+)` \| (\w+) \| (.*) \|$", section, re.M):
        name, kind, labels = row
        table[name] = (kind, set(re.findall(r"`(\w+)`", labels)))
    return table


def family_of(sample_name, families):
    for suffix in SUFFIXES:
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in families:
            return sample_name[: -len(suffix)]
    return sample_name


def check_lines(page):
    """What Prometheus's text parser rejects and the Python client's lets through."""
    problems, declared, seen_series, finished, current = [], {}, set(), set(), None
    for number, line in enumerate(page.splitlines(), 1):
        where = f"line {number}"
        if not line.strip():
            continue
        if line.startswith("#"):
            words = line.split(None, 3)
            if len(words) < 3 or words[1] not in ("HELP", "TYPE"):
                continue  # a comment
            name = words[2]
            if not METRIC_NAME.match(name):
                problems.append(f"{where}: {name!r} is not a metric name")
            if (name, words[1]) in declared:
                problems.append(f"{where}: a second {words[1]} line for {name}")
            declared[(name, words[1])] = number
            if name != current and name in finished:
                problems.append(f"{where}: {name}'s lines are not together")
            if current is not None and name != current:
                finished.add(current)
            current = name
            continue
        match = SAMPLE.match(line)
        if not match:
            problems.append(f"{where}: not a sample line: {line!r}")
            continue
        name, _, label_text, value = match.group(1, 2, 3, 4)
        family = family_of(name, {n for n, _ in declared})
        if family != current:
            problems.append(f"{where}: a sample of {family} outside its family's lines")
        labels = tuple(LABEL_PAIR.findall(label_text or ""))
        for label, _, _ in labels:
            if not LABEL_NAME.match(label) or label.startswith("__"):
                problems.append(f"{where}: {label!r} is not a label name")
        series = (name, tuple(sorted((k, v) for k, v, _ in labels)))
        if series in seen_series:
            problems.append(f"{where}: {name} with these labels a second time")
        seen_series.add(series)
        try:
            float(value)
        except ValueError:
            problems.append(f"{where}: {value!r} is not a value")
    return problems


def check_histogram(family, problems):
    series = {}
    for sample in family.samples:
        key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        series.setdefault(key, {"buckets": [], "count": None})
        if sample.name.endswith("_bucket"):
            series[key]["buckets"].append((float(sample.labels["le"]), sample.value))
        elif sample.name.endswith("_count"):
            series[key]["count"] = sample.value
    for key, s in series.items():
        bounds = [b for b, _ in s["buckets"]]
        counts = [c for _, c in s["buckets"]]
        if bounds != sorted(bounds) or not bounds or bounds[-1] != float("inf"):
            problems.append(f"{family.name}{dict(key)}: buckets not ascending up to +Inf")
        elif counts != sorted(counts) or counts[-1] != s["count"]:
            problems.append(f"{family.name}{dict(key)}: bucket counts not cumulative to _count")


def check(page, readme_text):
    problems = check_lines(page)
    try:
        families = list(text_string_to_metric_families(page))
    except ValueError as error:
        return problems + [f"the Prometheus client's parser rejects the page: {error}"]
    table = readme_table(readme_text)
    on_page = set()
    for family in families:
        # The client's parser names a counter family without its _total suffix.
        name = family.name + "_total" if family.type == "counter" else family.name
        on_page.add(name)
        if not family.documentation:
            problems.append(f"{name}: no help text")
        if name not in table:
            problems.append(f"{name}: on the page but not in the README's Metrics table")
            continue
        kind, label_names = table[name]
        if family.type != kind:
            problems.append(f"{name}: a {family.type} on the page, a {kind} in the README")
        for sample in family.samples:
            if family.type == "counter" and not sample.name.endswith("_total"):
                problems.append(f"{sample.name}: a counter's samples end in _total")
            extra = set(sample.labels) - label_names - {"le"}
            if extra:
                problems.append(f"{sample.name}: labels {sorted(extra)} not in the README")
        if family.type == "histogram":
            check_histogram(family, problems)
    problems += [f"{name}: in the README but not on the page" for name in sorted(set(table) - on_page)]
    return problems


def self_test(readme_text):
    """A page made from the README table passes; each broken variant must be reported."""
    good = []
    for name, (kind, labels) in readme_table(readme_text).items():
        good += [f"# HELP {name} help", f"# TYPE {name} {kind}"]
        label = f'{sorted(labels)[0]}="x"' if labels else ""
        if kind == "histogram":
            good += [f'{name}_bucket{{{label},le="1"}} 1', f'{name}_bucket{{{label},le="+Inf"}} 2',
                     f"{name}_sum{{{label}}} 3", f"{name}_count{{{label}}} 2"]
        else:
            good.append(f"{name}{{{label}}} 1")
    good = "\n".join(good) + "\n"
    first = next(iter(readme_table(readme_text)))
    broken = {
        "malformed": good + 'x{a="b} 1\n',
        "undocumented": good + "# HELP other_total h\n# TYPE other_total counter\nother_total 1\n",
        "missing": good.replace(f"# HELP {first} help\n# TYPE {first} counter\n", "").replace(
            f'{first}{{{sorted(readme_table(readme_text)[first][1])[0]}="x"}} 1\n', ""),
        "no help": good.replace(f"# HELP {first} help\n", ""),
        "twice": good + good.splitlines()[2] + "\n",
        "label": good.replace('="x"', '="x",__bad="y"', 1),
        "not cumulative": good.replace('le="+Inf"} 2', 'le="+Inf"} 0', 1),
    }
    failures = [] if not check(good, readme_text) else [f"good page: {check(good, readme_text)}"]
    failures += [f"{what}: not reported" for what, page in broken.items() if not check(page, readme_text)]
    for failure in failures:
        print(f"self-test: {failure}")
    return 1 if failures else 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--self-test":
        with open(argv[2]) as f:
            return self_test(f.read())
    if len(argv) != 3:
        print(__doc__)
        return 2
    with open(argv[1]) as f:
        readme_text = f.read()
    with open(argv[2]) as f:
        problems = check(f.read(), readme_text)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
