"""The one checksum of a model or dataset (protocol.artifacts.digest), computed independently here the way
`sha256sum` would, and which locations the agents can stage from."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from gpufleet.protocol.artifacts import ArtifactError, StageRef, check_source, digest, local_path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _expected_tree(files: dict[str, bytes]) -> str:
    """What `cd TREE && find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum` would print, without
    the `./` prefixes: one `<sha256>  <relative path>` line per file, in byte order of the path."""
    lines = [f"{_sha(data)}  {path}\n" for path, data in sorted(files.items(), key=lambda kv: kv[0].encode())]
    return _sha("".join(lines).encode())


def _write(root: Path, files: dict[str, bytes], order: list[str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for relative in order or list(files):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[relative])
    return root


FILES = {
    "train/part-0001.parquet": b"\x00\x01rows" * 100,
    "train/part-0002.parquet": b"more rows\n",
    "README.md": b"# a dataset\n",
    "Zeta.txt": b"upper case sorts before lower case in byte order\n",
    "b/a": b"",
    "b.txt": b"'.' (0x2e) sorts before '/' (0x2f): b.txt comes before b/a\n",
}


def test_a_files_digest_is_the_sha256_of_its_bytes(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)  # over the 1 MiB read chunk, not a multiple of it
    path = tmp_path / "model.safetensors"
    path.write_bytes(data)
    assert digest(path) == (hashlib.sha256(data).hexdigest(), len(data))
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert digest(empty) == (_sha(b""), 0)


def test_a_trees_digest_is_the_sha256_of_its_sha256sum_manifest(tmp_path: Path) -> None:
    root = _write(tmp_path / "ds", FILES)
    (root / "empty-dir" / "deeper").mkdir(parents=True)  # directories hold no lines of their own
    sha, size = digest(root)
    assert sha == _expected_tree(FILES)
    assert size == sum(len(d) for d in FILES.values())
    # The order is the paths' byte order, not the order they were listed or created in.
    assert sha != _sha("".join(f"{_sha(d)}  {p}\n" for p, d in FILES.items()).encode())


def test_the_tree_digest_does_not_depend_on_the_order_files_were_created(tmp_path: Path) -> None:
    forward = _write(tmp_path / "one", FILES, order=list(FILES))
    backward = _write(tmp_path / "two", FILES, order=list(reversed(FILES)))
    assert digest(forward) == digest(backward)
    # Nor on the name of the tree's own directory: only paths relative to it count.
    assert digest(forward)[0] == _expected_tree(FILES)


def test_changing_one_byte_or_one_name_changes_the_digest(tmp_path: Path) -> None:
    root = _write(tmp_path / "ds", FILES)
    before, size = digest(root)
    target = root / "train" / "part-0002.parquet"
    data = bytearray(target.read_bytes())
    data[3] ^= 0x01
    target.write_bytes(bytes(data))
    after, same_size = digest(root)
    assert after != before
    assert same_size == size
    target.rename(root / "train" / "part-0003.parquet")  # same bytes, another name
    renamed, _ = digest(root)
    assert renamed not in (before, after)

    single = tmp_path / "weights.bin"
    single.write_bytes(b"abc")
    one, _ = digest(single)
    single.write_bytes(b"abd")
    assert digest(single)[0] != one


def test_links_and_special_files_are_refused(tmp_path: Path) -> None:
    root = _write(tmp_path / "ds", {"a.txt": b"a"})
    (root / "link").symlink_to(root / "a.txt")
    with pytest.raises(ArtifactError, match="symbolic link"):
        digest(root)

    linked_dir = _write(tmp_path / "ds2", {"sub/a.txt": b"a"})
    (linked_dir / "elsewhere").symlink_to(tmp_path / "ds", target_is_directory=True)
    with pytest.raises(ArtifactError, match="symbolic link"):
        digest(linked_dir)

    fifo_dir = _write(tmp_path / "ds3", {"a.txt": b"a"})
    os.mkfifo(fifo_dir / "pipe")
    with pytest.raises(ArtifactError, match="not a plain file"):
        digest(fifo_dir)


def test_a_missing_path_is_an_artifact_error(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="cannot read"):
        digest(tmp_path / "nope")


@pytest.mark.parametrize(
    "source",
    [
        "/shared/datasets/imagenet",
        "file:///shared/models/llama.safetensors",
        "https://objects.example.com/bucket/model.gguf?X-Amz-Signature=abc",
        "http://mirror.internal/ds.tar",
    ],
)
def test_sources_the_agents_can_stage_from(source: str) -> None:
    assert check_source(source) == source


@pytest.mark.parametrize(
    "source",
    ["s3://bucket/key", "datasets/imagenet", "./model.bin", "~/model.bin", "hf://org/model", "ftp://x/y", ""],
)
def test_sources_they_cannot_are_refused_with_the_choices(source: str) -> None:
    with pytest.raises(ArtifactError, match="absolute path"):
        check_source(source)


def test_a_nul_in_a_source_is_refused() -> None:
    with pytest.raises(ArtifactError, match="NUL"):
        check_source("/shared/a\x00b")


def test_local_path_names_the_file_for_paths_and_file_uris_only() -> None:
    assert local_path("/shared/x") == Path("/shared/x")
    assert local_path("file:///shared/x") == Path("/shared/x")
    assert local_path("https://h/x") is None
    assert local_path("relative/x") is None


@pytest.mark.parametrize("source", ["file://shared/x", "file://./x", "file:relative"])
def test_a_file_uri_must_name_an_absolute_path(source: str) -> None:
    """`file://shared/x` would be read relative to wherever each agent happens to run."""
    with pytest.raises(ArtifactError):
        check_source(source)


def test_a_stage_ref_needs_a_real_sha256() -> None:
    good = {"kind": "dataset", "name": "ds", "version": "1", "sha256": "a" * 64, "size_bytes": 1, "source": "/x"}
    assert StageRef.model_validate(good).ref == "ds:1"
    for bad in ("A" * 64, "a" * 63, "g" * 64):
        with pytest.raises(ValueError, match="sha256"):
            StageRef.model_validate(good | {"sha256": bad})
