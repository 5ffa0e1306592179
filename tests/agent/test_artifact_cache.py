"""The node's artifact cache (agent.artifacts) on a real directory: copied once and checked, reused after,
a bad copy thrown away, least recently used evicted first but never what a running rank uses, and kept
across a restart. Then the job supervisor staging a rank's model and dataset before its executor runs."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.artifacts import ArtifactCache, describe_staged, job_variables
from gpufleet.agent.jobs.ports import OnOutput, OnStarted, RankResult
from gpufleet.agent.jobs.supervisor import JobSupervisor
from gpufleet.protocol.artifacts import MAX_CACHE_ENTRIES, ArtifactError, StageRef, digest
from gpufleet.protocol.jobs import JobStart

LIMIT = 10_000


class Ticks:
    """A clock that moves only when told: `now` seconds since the epoch."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def _ref(source: Path | str, kind: str = "dataset", name: str = "ds", **kw: Any) -> StageRef:
    """A StageRef for `source` with its true checksum and size (computed where it is a local path)."""
    if isinstance(source, Path):
        sha, size = digest(source)
        kw.setdefault("sha256", sha)
        kw.setdefault("size_bytes", size)
        source = str(source)
    return StageRef.model_validate({"kind": kind, "name": name, "version": "1", "source": source, **kw})


def _blob(tmp_path: Path, name: str, size: int, fill: bytes = b"x") -> StageRef:
    path = tmp_path / "src" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(fill * size)
    return _ref(path, name=name)


def _index(root: Path) -> dict[str, dict[str, Any]]:
    return {e["sha256"]: e for e in json.loads((root / "index.json").read_text())}


def _listing(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


# --- copying and reusing ---------------------------------------------------------------------------


def test_a_tree_is_copied_once_and_then_reused_in_place(tmp_path: Path) -> None:
    src = _tree(tmp_path / "imagenet", {"train/0.bin": b"a" * 100, "val/0.bin": b"b" * 50, "README": b"hi\n"})
    ref = _ref(src)
    clock = Ticks()
    cache = ArtifactCache(tmp_path / "cache", LIMIT, clock=clock)

    first = cache.stage(ref)
    assert first.copied
    assert first.path == tmp_path / "cache" / ref.sha256 / "tree"
    assert (first.path / "train" / "0.bin").read_bytes() == b"a" * 100
    assert (first.path / "README").read_text() == "hi\n"
    assert digest(first.path)[0] == ref.sha256
    inode = (first.path / "train" / "0.bin").stat().st_ino
    entry = _index(cache.root)[ref.sha256]
    assert (entry["uses"], entry["copied_at"], entry["last_used_at"], entry["size_bytes"]) == (1, 1000.0, 1000.0, 153)

    clock.now = 2000.0
    (src / "train" / "0.bin").write_bytes(b"changed at the source after it was staged")
    second = cache.stage(ref)
    assert not second.copied
    assert second.path == first.path
    assert (second.path / "train" / "0.bin").stat().st_ino == inode  # the same file, not a new copy
    assert (second.path / "train" / "0.bin").read_bytes() == b"a" * 100
    entry = _index(cache.root)[ref.sha256]
    assert (entry["uses"], entry["copied_at"], entry["last_used_at"]) == (2, 1000.0, 2000.0)
    assert "copied to the node cache and checked (153 bytes" in describe_staged(first)
    assert describe_staged(second) == "gpufleet: dataset ds:1 reused from the node cache\n"


def test_a_file_is_copied_under_its_own_name(tmp_path: Path) -> None:
    src = tmp_path / "llama.safetensors"
    src.write_bytes(b"\x01\x02weights" * 64)
    ref = _ref(src, kind="model", name="llama")
    staged = ArtifactCache(tmp_path / "cache", LIMIT).stage(ref)
    assert staged.copied
    assert staged.path == tmp_path / "cache" / ref.sha256 / "file" / "llama.safetensors"
    assert staged.path.read_bytes() == src.read_bytes()
    # A file:// source is the same file.
    as_uri = ref.model_copy(update={"source": f"file://{src}"})
    again = ArtifactCache(tmp_path / "cache2", LIMIT).stage(as_uri)
    assert again.path.read_bytes() == src.read_bytes()


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A tiny object store: http.server over a directory, on a thread. Yields (base URL, directory)."""
    served = tmp_path / "served"
    served.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_an_http_source_is_downloaded_and_checked(tmp_path: Path, http_root: tuple[str, Path]) -> None:
    base, served = http_root
    data = b"gguf\x00" * 3000
    (served / "model.gguf").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    ref = _ref(f"{base}/model.gguf?X-Amz-Signature=abc", kind="model", sha256=sha, size_bytes=len(data))
    cache = ArtifactCache(tmp_path / "cache", LIMIT * 10)
    staged = cache.stage(ref)
    assert staged.copied
    assert staged.path.name == "model.gguf"  # the query string is not part of the name
    assert staged.path.read_bytes() == data
    assert not cache.stage(ref).copied

    missing = _ref(f"{base}/nope.bin", sha256="0" * 64, size_bytes=1)
    with pytest.raises(ArtifactError, match="HTTP 404"):
        cache.stage(missing)
    assert _listing(cache.root) == sorted([sha, "index.json"])


def test_a_checksum_mismatch_discards_the_copy_and_leaves_the_index_alone(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path / "cache", LIMIT)
    kept = _blob(tmp_path, "kept", 10)
    cache.stage(kept)
    before = (cache.root / "index.json").read_text()

    src = _tree(tmp_path / "ds", {"a": b"registered"})
    registered = _ref(src)
    (src / "a").write_bytes(b"tampered!!")  # same size, other bytes
    with pytest.raises(ArtifactError, match="checksum mismatch") as raised:
        cache.stage(registered)
    assert "the copy was discarded" in str(raised.value)
    assert registered.sha256[:12] in str(raised.value)
    assert _listing(cache.root) == sorted([kept.sha256, "index.json"])  # no .incoming-*, no half copy
    assert (cache.root / "index.json").read_text() == before
    assert [e.sha256 for e in cache.report().entries] == [kept.sha256]


# --- the size limit --------------------------------------------------------------------------------


def test_the_least_recently_used_go_first(tmp_path: Path) -> None:
    clock = Ticks()
    cache = ArtifactCache(tmp_path / "cache", 100, clock=clock)
    a, b, c, d = (_blob(tmp_path, n, 40, fill=n.encode()) for n in "abcd")
    for when, ref in ((1.0, a), (2.0, b), (3.0, a)):  # a used again after b: b is now the oldest
        clock.now = when
        cache.stage(ref)
    clock.now = 4.0
    cache.stage(c)  # 80 + 40 > 100: one must go
    assert {e.sha256 for e in cache.report().entries} == {a.sha256, c.sha256}
    assert not (cache.root / b.sha256).exists()
    clock.now = 5.0
    cache.stage(d)
    assert {e.sha256 for e in cache.report().entries} == {c.sha256, d.sha256}  # a (last used at 3) before c (4)
    assert cache.used_bytes() == 80
    assert set(_index(cache.root)) == {c.sha256, d.sha256}
    assert not cache.stage(d).copied


def test_what_a_running_rank_uses_is_never_evicted(tmp_path: Path) -> None:
    clock = Ticks()
    cache = ArtifactCache(tmp_path / "cache", 100, clock=clock)
    a, b = _blob(tmp_path, "a", 40, b"a"), _blob(tmp_path, "b", 40, b"b")
    clock.now = 1.0
    cache.stage(a)  # the oldest: evicted first, were it free
    clock.now = 2.0
    cache.stage(b)
    c = _blob(tmp_path, "c", 40, b"c")
    clock.now = 3.0
    cache.stage(c, in_use={a.sha256})
    assert {e.sha256 for e in cache.report().entries} == {a.sha256, c.sha256}

    # Both others in use: no room, and nothing is dropped trying.
    d = _blob(tmp_path, "d", 40, b"d")
    with pytest.raises(ArtifactError, match="cannot make room for 40 bytes"):
        cache.stage(d, in_use={a.sha256, c.sha256})
    assert {e.sha256 for e in cache.report().entries} == {a.sha256, c.sha256}
    assert (cache.root / a.sha256).is_dir()
    assert (cache.root / c.sha256).is_dir()


def test_a_failed_eviction_drops_nothing(tmp_path: Path) -> None:
    """Freeing the one unused entry would not make room: it stays, rather than being lost for nothing."""
    clock = Ticks()
    cache = ArtifactCache(tmp_path / "cache", 100, clock=clock)
    small, busy = _blob(tmp_path, "small", 30, b"s"), _blob(tmp_path, "busy", 50, b"u")
    clock.now = 1.0
    cache.stage(small)
    clock.now = 2.0
    cache.stage(busy)
    big = _blob(tmp_path, "big", 60, b"g")  # needs 40 more than is free; only small (30) may go
    with pytest.raises(ArtifactError, match="cannot make room"):
        cache.stage(big, in_use={busy.sha256})
    assert {e.sha256 for e in cache.report().entries} == {small.sha256, busy.sha256}
    assert (cache.root / small.sha256).is_dir()


def test_an_artifact_bigger_than_the_whole_cache_is_refused(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path / "cache", 100)
    kept = _blob(tmp_path, "kept", 60)
    cache.stage(kept)
    huge = _blob(tmp_path, "huge", 101)
    with pytest.raises(ArtifactError, match="101 bytes, over this node's cache limit of 100"):
        cache.stage(huge)
    assert [e.sha256 for e in cache.report().entries] == [kept.sha256]  # nothing evicted for it
    assert _listing(cache.root) == sorted([kept.sha256, "index.json"])
    assert cache.stage(_blob(tmp_path, "exact", 100, b"e"), in_use=()).copied  # exactly the limit fits


# --- restarts and reports --------------------------------------------------------------------------


def test_a_restart_keeps_the_entries_and_clears_interrupted_copies(tmp_path: Path) -> None:
    clock = Ticks()
    root = tmp_path / "cache"
    first = ArtifactCache(root, LIMIT, clock=clock)
    assert not first.in_use  # nothing created yet: nothing to tell the head
    ref = _ref(_tree(tmp_path / "ds", {"x": b"data"}))
    staged = first.stage(ref)
    assert first.in_use
    (root / ".incoming-crashed" / "tree").mkdir(parents=True)  # a copy a crash cut short
    (root / ".incoming-crashed" / "tree" / "half").write_bytes(b"ha")
    (root / ("f" * 64)).mkdir()  # on disk but in no index: cannot be trusted

    clock.now = 5_000.0
    again = ArtifactCache(root, LIMIT, clock=clock)
    assert again.in_use
    assert [(e.sha256, e.uses, e.copied_at) for e in again.report().entries] == [(ref.sha256, 1, 1000.0)]
    assert _listing(root) == sorted([ref.sha256, "index.json"])
    reused = again.stage(ref)
    assert not reused.copied
    assert reused.path == staged.path
    entry = again.report().entries[0]
    assert (entry.uses, entry.copied_at, entry.last_used_at) == (2, 1000.0, 5000.0)


def test_a_damaged_index_empties_the_cache_instead_of_trusting_it(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    ref = _blob(tmp_path, "a", 10)
    ArtifactCache(root, LIMIT).stage(ref)
    (root / "index.json").write_text("{not json")
    again = ArtifactCache(root, LIMIT)
    assert again.report().entries == []
    assert again.stage(ref).copied


def test_an_entry_removed_behind_the_caches_back_is_copied_again(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path / "cache", LIMIT)
    ref = _blob(tmp_path, "a", 10)
    cache.stage(ref)
    shutil.rmtree(cache.root / ref.sha256)
    again = cache.stage(ref)
    assert again.copied
    assert again.path.read_bytes() == b"x" * 10


def test_report_lists_every_entry_with_the_limit(tmp_path: Path) -> None:
    clock = Ticks()
    cache = ArtifactCache(tmp_path / "cache", 1234, clock=clock)
    refs = [_blob(tmp_path, n, 10 + i, n.encode()) for i, n in enumerate("abc")]
    for i, ref in enumerate(refs):
        clock.now = 10.0 + i
        cache.stage(ref)
    report = cache.report()
    assert report.type == "node_cache"
    assert report.limit_bytes == 1234
    assert sorted((e.sha256, e.size_bytes, e.uses) for e in report.entries) == sorted(
        (r.sha256, r.size_bytes, 1) for r in refs
    )
    assert [e.sha256 for e in report.entries] == sorted(r.sha256 for r in refs)


def test_a_report_of_a_huge_cache_keeps_the_most_recently_used(tmp_path: Path) -> None:
    """The message holds at most MAX_CACHE_ENTRIES; a bigger cache must still report (not fail the rank)."""
    clock = Ticks(0.0)
    cache = ArtifactCache(tmp_path / "cache", 10**9, clock=clock)
    src = tmp_path / "many"
    src.mkdir()
    staged: list[str] = []
    for i in range(MAX_CACHE_ENTRIES + 3):
        clock.now = float(i)
        path = src / f"{i}.bin"
        path.write_bytes(str(i).encode())
        staged.append(cache.stage(_ref(path, name=f"a{i}")).ref.sha256)
    report = cache.report()
    assert len(report.entries) == MAX_CACHE_ENTRIES
    assert {e.sha256 for e in report.entries} == set(staged[3:])  # the three used longest ago are left out


def test_job_variables_name_the_model_and_every_dataset_in_order(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path / "cache", LIMIT)
    model = cache.stage(_ref(_tree(tmp_path / "m", {"w": b"w"}), kind="model", name="m"))
    one = cache.stage(_ref(_tree(tmp_path / "d1", {"1": b"1"}), name="d1"))
    two = cache.stage(_ref(_tree(tmp_path / "d2", {"2": b"2"}), name="d2"))
    assert job_variables([model, two, one]) == {
        "GPUFLEET_MODEL_PATH": str(model.path),
        "GPUFLEET_DATASET_PATH": str(two.path),
        "GPUFLEET_DATASET_PATHS": f"{two.path}:{one.path}",
    }
    assert job_variables([]) == {}


# --- the supervisor stages before the executor runs -------------------------------------------------


class Capturing:
    """An executor that records each launch and what the rank would read, then completes."""

    def __init__(self) -> None:
        self.launches: list[JobStart] = []
        self.read: dict[str, bytes] = {}

    async def run(
        self, launch: JobStart, on_started: OnStarted, on_output: OnOutput, cancel: asyncio.Event
    ) -> RankResult:
        self.launches.append(launch)
        on_started()
        self.read["dataset"] = await asyncio.to_thread(
            (Path(launch.env["GPUFLEET_DATASET_PATH"]) / "rows.csv").read_bytes
        )
        self.read["model"] = await asyncio.to_thread(Path(launch.env["GPUFLEET_MODEL_PATH"]).read_bytes)
        return RankResult("completed", 0)


def _launch(job_id: int, artifacts: list[StageRef]) -> JobStart:
    return JobStart(
        job_id=job_id,
        run=1,
        rank=0,
        world_size=1,
        user="alice",
        argv=["train"],
        env={"MINE": "kept"},
        time_limit_s=60,
        artifacts=artifacts,
    )


async def _messages(sup: JobSupervisor, seconds: float = 0.2) -> list[dict[str, Any]]:
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    task = asyncio.create_task(sup.send_forever(send))
    await asyncio.sleep(seconds)
    task.cancel()
    return [json.loads(t) for t in sent]


async def _until_ended(sup: JobSupervisor) -> None:
    for _ in range(1000):  # 10 s
        if all(r.result is not None for r in sup.ranks.values()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the rank did not end")


def test_the_supervisor_stages_a_ranks_artifacts_before_it_runs(tmp_path: Path) -> None:
    dataset = _ref(_tree(tmp_path / "ds", {"rows.csv": b"a,b\n1,2\n"}))
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"weights")
    model = _ref(weights, kind="model", name="m")
    cache = ArtifactCache(tmp_path / "cache", LIMIT)
    executor = Capturing()

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        sup = JobSupervisor(executor, flush_s=0.01, cache=cache)
        sup.start(_launch(1, [model, dataset]))
        await _until_ended(sup)
        first = await _messages(sup)
        sup.start(_launch(2, [dataset, model]))
        await _until_ended(sup)
        return first, await _messages(sup)

    first, second = asyncio.run(scenario())
    launch = executor.launches[0]
    assert launch.env["MINE"] == "kept"
    assert launch.env["GPUFLEET_MODEL_PATH"] == str(cache.root / model.sha256 / "file" / "model.bin")
    assert launch.env["GPUFLEET_DATASET_PATH"] == str(cache.root / dataset.sha256 / "tree")
    assert launch.env["GPUFLEET_DATASET_PATHS"] == launch.env["GPUFLEET_DATASET_PATH"]
    assert executor.read == {"dataset": b"a,b\n1,2\n", "model": b"weights"}

    stderr = "".join(m["data"] for m in first if m["type"] == "job_output" and m["stream"] == "stderr")
    assert "gpufleet: model m:1 copied to the node cache and checked (7 bytes" in stderr
    assert "gpufleet: dataset ds:1 copied to the node cache and checked" in stderr
    ended = [m for m in first if m["type"] == "job_update" and m["state"] == "exited"]
    assert [m["outcome"] for m in ended] == ["completed"]
    reports = [m for m in first if m["type"] == "node_cache"]
    assert reports, first
    assert {e["sha256"] for e in reports[-1]["entries"]} == {model.sha256, dataset.sha256}
    assert reports[-1]["limit_bytes"] == LIMIT

    stderr = "".join(m["data"] for m in second if m["type"] == "job_output" and m["stream"] == "stderr")
    assert "gpufleet: dataset ds:1 reused from the node cache\n" in stderr
    assert "gpufleet: model m:1 reused from the node cache\n" in stderr
    assert "copied" not in stderr
    uses = {e["sha256"]: e["uses"] for e in [m for m in second if m["type"] == "node_cache"][-1]["entries"]}
    assert uses == {model.sha256: 2, dataset.sha256: 2}


def test_a_checksum_mismatch_ends_the_rank_with_an_error_and_never_runs_it(tmp_path: Path) -> None:
    src = _tree(tmp_path / "ds", {"rows.csv": b"original"})
    dataset = _ref(src)
    (src / "rows.csv").write_bytes(b"modified")
    cache = ArtifactCache(tmp_path / "cache", LIMIT)
    executor = Capturing()

    async def scenario() -> list[dict[str, Any]]:
        sup = JobSupervisor(executor, flush_s=0.01, cache=cache)
        sup.start(_launch(3, [dataset]))
        await _until_ended(sup)
        return await _messages(sup)

    sent = asyncio.run(scenario())
    assert executor.launches == []
    ended = [m for m in sent if m["type"] == "job_update" and m["state"] == "exited"]
    assert len(ended) == 1
    assert ended[0]["outcome"] == "error"
    assert "checksum mismatch" in ended[0]["message"]
    assert "dataset ds:1" in ended[0]["message"]
    assert [m["entries"] for m in sent if m["type"] == "node_cache"] == [[]]  # told, and it holds nothing
    assert [p.name for p in cache.root.iterdir() if p.name.startswith(".incoming")] == []


def test_a_node_without_a_cache_refuses_a_rank_with_artifacts(tmp_path: Path) -> None:
    dataset = _ref(_tree(tmp_path / "ds", {"rows.csv": b"x"}))
    executor = Capturing()

    async def scenario() -> list[dict[str, Any]]:
        sup = JobSupervisor(executor, flush_s=0.01)
        sup.start(_launch(4, [dataset]))
        await _until_ended(sup)
        return await _messages(sup)

    sent = asyncio.run(scenario())
    assert executor.launches == []
    ended = [m for m in sent if m["type"] == "job_update" and m["state"] == "exited"]
    assert [(m["outcome"], "no artifact cache" in m["message"]) for m in ended] == [("error", True)]


def test_a_reconnect_reports_the_cache_only_where_one_exists(tmp_path: Path) -> None:
    async def scenario(cache: ArtifactCache) -> list[str]:
        sup = JobSupervisor(Capturing(), flush_s=0.01, cache=cache)
        sup.connected()
        return [m["type"] for m in await _messages(sup, 0.05)]

    assert asyncio.run(scenario(ArtifactCache(tmp_path / "never", LIMIT))) == ["job_held"]
    used = ArtifactCache(tmp_path / "used", LIMIT)
    used.stage(_blob(tmp_path, "a", 5))
    assert asyncio.run(scenario(ArtifactCache(tmp_path / "used", LIMIT))) == ["job_held", "node_cache"]


def test_a_redirect_to_the_metadata_service_is_refused_before_any_connection(tmp_path: Path) -> None:
    """The head checks the URL an operator registers; only the node sees where it redirects. A public URL
    answering 302 to 169.254.169.254 would otherwise hand the node's cloud credentials to a job's dataset."""

    class Jump(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/iam/security-credentials/")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Jump)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        ref = _ref(f"http://127.0.0.1:{server.server_address[1]}/data.bin", sha256="0" * 64, size_bytes=10)
        cache = ArtifactCache(tmp_path / "cache", LIMIT)
        with pytest.raises(ArtifactError, match=r"169\.254\.169\.254.*link-local"):
            cache.stage(ref)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert not [name for name in _listing(cache.root) if name != "index.json"]  # no copy, no .incoming-*
