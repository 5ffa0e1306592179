"""How long does a full re-evaluation of the fleet's findings take: 1,000 nodes x 3,000 packages
against 50,000 advisories?

Everything is scaled up from real data in tests/fixtures:

* packages: the real names and versions of an H200's dpkg and pip lists and Colab's apt and pip
  lists (about 2,400), made up to `--packages` with renamed copies of real entries (libfoo -> libfoo-7,
  same version);
* images: `--images` package sets, each the universe with a few hundred versions bumped as updates
  would; every node runs one, and `--drift` of the nodes carry one or two packages of their own
  (so they are sets of their own, as a node someone upgraded by hand is);
* advisories: the real OSV, NVD and CSAF records parsed by gpufleet's own loaders, and copies of the
  real Debian, Ubuntu and PyPA records re-issued for other packages of the universe under new ids,
  `--advisories` in all. Each copy keeps its record's shape (introduced 0 and a fix; the PyPA ranges
  and version lists) and is fixed at the target package's installed version or before (not
  affected) or, for `AFFECTED_SHARE` of them, after it (affected); distribution ones name Ubuntu
  22.04 or 20.04 (the other release: not affected).

Two figures:

1. the matcher alone, in memory: every node's packages against the index (what `cve scan` and the
   head do per set), with the verdict cache cold;
2. the head's full re-evaluation (`assets.evaluate.Evaluator` on a fresh evaluator): load the 50,000
   advisories from the database and index them, decode every set, match, compare with the stored
   findings and write them. First pass on an empty findings table (every finding inserted), then a
   second pass after an advisory import changed 500 records (everything re-judged, little written).

    .venv/bin/python bench/cve_scan.py --json bench/results/cve-scan.json [--db-url postgresql+psycopg://...]

Goal (issue 9): <= 10 s for the full re-evaluation. Exit status 0 when met, 1 when not.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import sessionmaker

from gpufleet.assets import store
from gpufleet.assets.advisories.load import load_path
from gpufleet.assets.evaluate import Evaluator
from gpufleet.assets.installed import detect_and_parse, parse_distro_arg
from gpufleet.assets.matching import AdvisoryIndex, Matcher
from gpufleet.assets.models import FindingRecord
from gpufleet.assets.records import Advisory, Affected, Distro, Installed, Range
from gpufleet.core.clock import SystemClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.migrations import upgrade

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
GOAL_S = 10.0
JAMMY = Distro("Ubuntu", "22.04")
# Of the generated records, the share that affects the version installed: a well-kept fleet is hit by
# a few hundred of the tens of thousands of records its distribution has ever published.
AFFECTED_SHARE = 0.01


def real_packages() -> list[Installed]:
    """The real package lists, as one Ubuntu 22.04 node's would be (distro packages with a source)."""
    software = FIXTURES / "software"
    out: list[Installed] = []
    for name, distro in (("dpkg-query.tsv", "ubuntu:24.04"), ("2023-02-22_e0be326_apt-list.txt", "ubuntu:20.04")):
        for p in detect_and_parse((software / name).read_text(), parse_distro_arg(distro)).packages:
            out.append(Installed("Ubuntu", p.name, p.version, p.source_name or p.name, p.source_version or p.version))
    for name in ("pip-freeze.txt", "2023-02-22_e0be326_pip-freeze.txt"):
        out += detect_and_parse((software / name).read_text(), None).packages
    unique = {(p.ecosystem, p.name): p for p in out}
    return sorted(unique.values(), key=lambda p: (p.ecosystem, p.name))


def universe(size: int, rng: random.Random) -> list[Installed]:
    base = real_packages()
    packages = list(base)
    n = 0
    while len(packages) < size:
        p = base[n % len(base)]
        suffix = f"-{n // len(base) + 2}"
        source = (p.source_name + suffix) if p.source_name else None
        packages.append(dataclasses.replace(p, name=p.name + suffix, source_name=source))
        n += 1
    rng.shuffle(packages)
    return packages[:size]


def bumped(version: str) -> str:
    """A later version of the same package (a security update's revision)."""
    return version + ("+1" if "+" not in version else ".1")


def images(packages: list[Installed], count: int, rng: random.Random) -> list[list[Installed]]:
    out = []
    for _ in range(count):
        image = list(packages)
        for i in rng.sample(range(len(image)), 300):
            p = image[i]
            image[i] = dataclasses.replace(
                p, version=bumped(p.version), source_version=bumped(p.source_version or p.version)
            )
        out.append(image)
    return out


def advisories(packages: list[Installed], total: int, rng: random.Random) -> list[Advisory]:
    real = [a for path in sorted((FIXTURES / "advisories").iterdir()) for _, a in load_path(path)]
    templates = {
        "deb": [a for a in real if any(x.ecosystem in ("Debian", "Ubuntu") for x in a.affected)],
        "pypi": [a for a in real if any(x.ecosystem == "PyPI" for x in a.affected)],
    }
    deb = [p for p in packages if p.ecosystem == "Ubuntu"]
    pypi = [p for p in packages if p.ecosystem == "PyPI"]
    out = list(real)
    n = 0
    while len(out) < total:
        n += 1
        if rng.random() < 0.8:
            template, target = rng.choice(templates["deb"]), rng.choice(deb)
            version = target.source_version or target.version
            # Most records were fixed long ago (at this version or before); AFFECTED_SHARE still hit.
            fix = bumped(version) if rng.random() < AFFECTED_SHARE else version
            affected = (
                Affected(
                    "Ubuntu",
                    target.source_name or target.name,
                    rng.choice(["22.04", "20.04"]),
                    (Range("ECOSYSTEM", (("introduced", "0"), ("fixed", fix))),),
                    fixed=fix,
                ),
            )
        else:
            template, target = rng.choice(templates["pypi"]), rng.choice(pypi)
            shape = next(x for x in template.affected if x.ecosystem == "PyPI")
            if rng.random() < AFFECTED_SHARE:  # the PyPA record's own ranges and version list
                affected = (dataclasses.replace(shape, package=target.name),)
            else:  # fixed at the installed version: not affected
                events = (("introduced", "0"), ("fixed", target.version))
                affected = (Affected("PyPI", target.name, None, (Range("ECOSYSTEM", events),), fixed=target.version),)
        aliases = (f"CVE-2031-{n:06d}",)
        out.append(dataclasses.replace(template, id=f"{template.id}-x{n}", aliases=aliases, affected=affected))
    return out[:total]


def fleet(nodes: int, images_: list[list[Installed]], drift: float, rng: random.Random) -> list[list[Installed]]:
    out = []
    for i in range(nodes):
        packages = images_[i % len(images_)]
        if rng.random() < drift:
            packages = list(packages)
            j = rng.randrange(len(packages))
            packages[j] = dataclasses.replace(packages[j], version=bumped(bumped(packages[j].version)))
        out.append(packages)
    return out


def in_memory(nodes: list[list[Installed]], records: list[Advisory]) -> dict[str, float | int]:
    started = time.perf_counter()
    index = AdvisoryIndex(records)
    indexed = time.perf_counter() - started
    matcher = Matcher(index)
    findings = 0
    started = time.perf_counter()
    for packages in nodes:
        findings += len(matcher.scan(packages, JAMMY).findings)
    return {"index_s": round(indexed, 2), "match_s": round(time.perf_counter() - started, 2), "findings": findings}


def in_database(url: str, nodes: list[list[Installed]], records: list[Advisory]) -> dict[str, float | int]:
    engine = create_engine(url)
    upgrade(engine)
    sessions = sessionmaker(engine, expire_on_commit=False)
    clock = SystemClock()
    with transaction(sessions) as s:
        ids = [n.id for n in inventory.add_nodes(s, clock, [f"gpu[0001-{len(nodes):04d}]"], NodeSettings())]
        for node_id, packages in zip(ids, nodes, strict=True):
            store.report_software(s, clock, node_id, JAMMY, "5.15.0-91-generic", packages)
    for start in range(0, len(records), 5000):
        with transaction(sessions) as s:
            store.import_advisories(s, clock, records[start : start + 5000])
    passes = {}
    for name in ("first", "after_import"):
        if name == "after_import":
            changed = [dataclasses.replace(a, summary=a.summary + " (revised)") for a in records[-500:]]
            with transaction(sessions) as s:
                store.import_advisories(s, clock, changed)
        started = time.perf_counter()
        with transaction(sessions) as s:
            result = Evaluator().evaluate(s, clock)
        passes[name] = {
            "seconds": round(time.perf_counter() - started, 2),
            "sets": result.sets,
            "opened": result.opened,
            "updated": result.updated,
        }
    with transaction(sessions, readonly=True) as s:
        stored = s.scalar(select(func.count()).select_from(FindingRecord))
    return {"backend": engine.dialect.name, "findings_stored": int(stored or 0), **passes}  # type: ignore[dict-item]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--packages", type=int, default=3000)
    parser.add_argument("--advisories", type=int, default=50_000)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--drift", type=float, default=0.1, help="share of nodes with packages of their own")
    parser.add_argument("--db-url", help="a database to fill (default: a new SQLite file)")
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    packages = universe(args.packages, rng)
    nodes = fleet(args.nodes, images(packages, args.images, rng), args.drift, rng)
    records = advisories(packages, args.advisories, rng)
    url = args.db_url or f"sqlite:///{tempfile.mkdtemp(prefix='gpufleet-cve-bench-')}/bench.db"
    result = {
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "nodes": args.nodes,
        "packages_per_node": args.packages,
        "advisories": len(records),
        "in_memory": in_memory(nodes, records),
        "head": in_database(url, nodes, records),
        "goal_s": GOAL_S,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    head = result["head"]
    assert isinstance(head, dict)
    return 0 if max(head["first"]["seconds"], head["after_import"]["seconds"]) <= GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
