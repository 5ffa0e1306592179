"""Job templates: the built-in ones render into valid jobs whose commands really run their launchers with
gpufleet's rendezvous; bad values and bad files are refused with clear messages; admin files override;
values substituted into a script never run as shell code."""

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from gpufleet.core.errors import InvalidInput
from gpufleet.jobs.schemas import JobSubmit
from gpufleet.jobs.templates import BUILTIN_DIR, Template, load_template, load_templates

# What each built-in needs beyond its defaults, and a word its command must hold.
REQUIRED = {
    "single-gpu": ({"script": "train.py"}, "train.py"),
    "torchrun-ddp": ({"script": "train.py"}, "torchrun"),
    "deepspeed": ({"script": "train.py"}, "--deepspeed_config"),
    "accelerate": ({"script": "train.py"}, "accelerate launch"),
    "batch-inference": ({"script": "infer.py", "input": "in.jsonl", "output": "out.jsonl"}, "--input"),
    "notebook": ({}, "jupyter"),
    "inference-service": ({"model": "Qwen/Qwen2.5-0.5B"}, "vllm"),
}
RENDEZVOUS = {"WORLD_SIZE": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29507"}


@pytest.fixture(scope="module")
def builtin() -> dict[str, Template]:
    templates, problems = load_templates()
    assert problems == []
    return templates


def command(job: dict[str, object]) -> str:
    script = job.get("script")
    return script if isinstance(script, str) else shlex.join(job["argv"])  # type: ignore[arg-type]


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / f"{name}.toml"
    path.write_text(text)
    return path


def run_script(script: str, tmp_path: Path) -> list[str]:
    """Run a rendered script with sh, as the agent would on the second of two nodes, with fake launchers on
    PATH that record their arguments, one a line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("torchrun", "accelerate"):
        fake = bin_dir / tool
        fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/args\n")
        fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **RENDEZVOUS}
    subprocess.run(["/bin/sh", "-c", script], cwd=tmp_path, env=env, check=True, timeout=10)
    return (tmp_path / "args").read_text().splitlines()


def test_every_builtin_renders_a_valid_job(builtin: dict[str, Template]) -> None:
    assert set(builtin) == set(REQUIRED)
    for name, (values, word) in REQUIRED.items():
        job = builtin[name].render(values)
        JobSubmit.model_validate(job)
        assert word in command(job), name
        assert builtin[name].description
        assert all(p.help for p in builtin[name].params.values()), name


def test_builtin_files_are_the_templates_dir() -> None:
    assert {p.stem for p in BUILTIN_DIR.glob("*.toml")} == set(REQUIRED)
    assert not (BUILTIN_DIR / "__init__.py").exists()


def test_torchrun_takes_the_rendezvous_from_gpufleet(builtin: dict[str, Template], tmp_path: Path) -> None:
    job = builtin["torchrun-ddp"].render({"nodes": "2", "gpus_per_node": "4", "script": "train.py"})
    assert (job["nodes"], job["gpus_per_node"]) == (2, 4)
    assert "--nnodes" in command(job)
    assert run_script(str(job["script"]), tmp_path) == [
        "--nnodes=2",
        "--node-rank=1",
        "--nproc-per-node=4",
        "--master-addr=10.0.0.5",
        "--master-port=29507",
        "train.py",
    ]


def test_deepspeed_passes_its_config_and_args(builtin: dict[str, Template], tmp_path: Path) -> None:
    values = {"script": "train.py", "config": "zero 3.json", "args": "--lr 3e-4 --tag 'a b'"}
    args = run_script(str(builtin["deepspeed"].render(values)["script"]), tmp_path)
    assert args[:2] == ["--nnodes=2", "--node-rank=1"]
    assert args[5:] == ["train.py", "--deepspeed", "--deepspeed_config", "zero 3.json", "--lr", "3e-4", "--tag", "a b"]


def test_accelerate_counts_processes_over_all_nodes(builtin: dict[str, Template], tmp_path: Path) -> None:
    job = builtin["accelerate"].render({"script": "train.py", "nodes": "2", "mixed_precision": "bf16"})
    assert run_script(str(job["script"]), tmp_path) == [
        "launch",
        "--multi_gpu",
        "--num_machines=2",
        "--machine_rank=1",
        "--main_process_ip=10.0.0.5",
        "--main_process_port=29507",
        "--num_processes=16",
        "--mixed_precision=bf16",
        "train.py",
    ]


def test_argv_templates_substitute_verbatim(builtin: dict[str, Template]) -> None:
    job = builtin["single-gpu"].render({"script": "my dir/{args}; x.py", "args": "--epochs 3 --name 'a b'"})
    assert job["argv"] == ["python3", "my dir/{args}; x.py", "--epochs", "3", "--name", "a b"]
    assert builtin["single-gpu"].render({"script": "t.py"})["argv"] == ["python3", "t.py"]  # no args: no element


def test_durations_and_bools_convert(builtin: dict[str, Template]) -> None:
    assert builtin["notebook"].render({})["time_limit_s"] == 4 * 3600
    job = builtin["notebook"].render({"time": "90m", "port": "9999", "gpus_per_node": "0"})
    assert (job["time_limit_s"], job["gpus_per_node"]) == (5400, 0)
    assert "--port=9999" in job["argv"]  # type: ignore[operator]
    assert builtin["inference-service"].render({"model": "m"})["requeue"] is True


@pytest.mark.parametrize(
    ("name", "values", "match"),
    [
        ("torchrun-ddp", {"script": "t.py", "bogus": "1"}, r"has no param bogus; its params: script, args, nodes"),
        ("torchrun-ddp", {"script": "t.py", "nodes": "two"}, r"param 'nodes': 'two' is not an int"),
        ("torchrun-ddp", {"script": "t.py", "nodes": "1.5"}, r"'1.5' is not an int"),
        ("torchrun-ddp", {"nodes": "2"}, r"needs a value for script \(the training script"),
        ("torchrun-ddp", {"script": "t.py", "nodes": "0"}, r"param 'nodes': 0 is below the minimum, 1"),
        ("torchrun-ddp", {"script": "t.py", "gpus_per_node": "65"}, r"65 is above the maximum, 64"),
        ("accelerate", {"script": "t.py", "mixed_precision": "fp9"}, r"'fp9' is not one of no, fp16, bf16, fp8"),
        ("notebook", {"time": "forever"}, r"param 'time': invalid duration 'forever'"),
        ("single-gpu", {"script": ""}, r"param 'script': a path cannot be empty"),
        ("single-gpu", {"script": "t.py", "args": "--name 'unclosed"}, r"cannot be split into words"),
        ("single-gpu", {"script": "t\x00.py"}, r"template single-gpu: .*NUL"),
    ],
)
def test_bad_values_are_refused(builtin: dict[str, Template], name: str, values: dict[str, str], match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        builtin[name].render(values)


def doc(job: str = 'argv = ["true"]', params: str = "", top: str = 'name = "t"\ndescription = "d"') -> str:
    """A template file's text, from its parts."""
    return f"{top}\n{params}\n[job]\n{job}\n"


def test_bool_params(tmp_path: Path) -> None:
    template = load_template(
        write(tmp_path, "t", doc('argv = ["true"]\nrequeue = "{rq}"', '[params.rq]\ntype = "bool"'))
    )
    assert template.render({"rq": "yes"})["requeue"] is True
    assert template.render({"rq": "False"})["requeue"] is False
    with pytest.raises(InvalidInput, match=r"'maybe' is not a bool"):
        template.render({"rq": "maybe"})


X = '[params.x]\ntype = "str"\ndefault = "a"'
ARGS = '[params.a]\ntype = "args"'


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('name = "t"\ndescription = "d"\n[job\nargv = ["true"]', r"not valid TOML"),
        (doc(top='name = "other"\ndescription = "d"'), r"name 'other' differs from the file's name"),
        (doc(top='name = "t"'), r"description must be a non-empty string"),
        (doc(top='name = "t"\ndescription = "d"\nversion = 2'), r"unknown key\(s\) version"),
        ('name = "t"\ndescription = "d"', r"a \[job\] table is required"),
        (doc('argv = ["{y}"]', X), r"job.argv\[0\]: \{y\} names no declared param \(declared: x\)"),
        (doc('argv = ["a"]\nscript = "b"', X), r"exactly one of argv .* and script"),
        (doc("nodes = 1", X), r"exactly one of argv"),
        (doc('script = "echo {x.__class__}"', X), r"'\{x.__class__\}' is not a placeholder"),
        (doc('script = "echo {x[0]}"', X), r"'\{x\[0\]\}' is not a placeholder"),
        (doc('script = "echo {x!r}"', X), r"'\{x!r\}' is not a placeholder"),
        (doc('script = "echo {x:>9}"', X), r"'\{x:>9\}' is not a placeholder"),
        (doc('script = "echo {0}"', X), r"'\{0\}' is not a placeholder"),
        (doc('script = "echo } {x}"', X), r"a lone '\}': write \}\} for a literal brace"),
        (doc(params='[params.n]\ntype = "int"\ndefault = "two"'), r"param 'n': default 'two' is not an int"),
        (doc(params='[params.n]\ntype = "int"\ndefault = 9\nmax = 8'), r"param 'n': default 9 is above the maximum, 8"),
        (doc(params='[params.n]\ntype = "float"'), r"type 'float' is not one of int, str, path, bool, duration, args"),
        (doc(params='[params.n]\ntype = "int"\nchoices = ["1"]'), r"param 'n': choices apply to str params only"),
        (doc(params='[params.N]\ntype = "int"'), r"param 'N': a name is lowercase"),
        (doc('argv = ["true"]\ngpus = 2'), r"job: unknown field\(s\) gpus"),
        (doc('argv = ["true"]\nworkdir = "relative"'), r"job: workdir: String should match"),
        (doc('argv = "true"'), r"job.argv must be a list of strings"),
        (doc('argv = ["x"]\nenv = {A = "{a}"}', ARGS), r"job.env.A: args param 'a' may stand only in the script or"),
        (doc('argv = ["--x={a}"]', ARGS), r"job.argv\[0\]: args param 'a' may stand only"),
    ],
)
def test_malformed_files_are_refused_naming_the_file(tmp_path: Path, text: str, match: str) -> None:
    path = write(tmp_path, "t", text)
    with pytest.raises(InvalidInput, match=match) as refused:
        load_template(path)
    assert str(refused.value).startswith(f"{path}: ")


def test_literal_braces_and_a_single_pass(tmp_path: Path) -> None:
    job_table = 'argv = ["{{x}}", "{{{x}}}", "{x}"]\nenv = {V = "{x}}}"}'
    template = load_template(write(tmp_path, "t", doc(job_table, '[params.x]\ntype = "str"')))
    job = template.render({"x": "{x}"})
    assert job["argv"] == ["{x}", "{{x}}", "{x}"]
    assert job["env"] == {"V": "{x}}"}


def test_admin_templates_override_and_a_broken_one_is_reported(tmp_path: Path) -> None:
    admin, later = tmp_path / "admin", tmp_path / "later"
    admin.mkdir()
    later.mkdir()
    builtin_ddp = (BUILTIN_DIR / "torchrun-ddp.toml").read_text()
    write(admin, "torchrun-ddp", builtin_ddp.replace("default = 8\n", "default = 4\n"))
    write(admin, "broken", 'name = "broken"\ndescription = "d"\n[job]\nargv = ["{nope}"]\n')
    write(admin, "in-house", 'name = "in-house"\ndescription = "ours"\n[job]\nargv = ["/opt/run"]\n')
    write(later, "in-house", 'name = "in-house"\ndescription = "later wins"\n[job]\nargv = ["/opt/run2"]\n')
    write(later, "single-gpu", "not toml [")
    (admin / "README").write_text("not a template")

    templates, problems = load_templates([admin, tmp_path / "missing", later])

    assert templates["torchrun-ddp"].render({"script": "t.py"})["gpus_per_node"] == 4
    assert templates["torchrun-ddp"].source == admin / "torchrun-ddp.toml"
    assert templates["in-house"].render({})["argv"] == ["/opt/run2"]
    assert templates["single-gpu"].source == BUILTIN_DIR / "single-gpu.toml"  # a broken override leaves it
    assert "broken" not in templates
    assert set(REQUIRED) <= set(templates)
    assert len(problems) == 2
    assert problems[0].startswith(f"{admin / 'broken.toml'}: ")
    assert "{nope} names no declared param" in problems[0]
    assert problems[1].startswith(f"{later / 'single-gpu.toml'}: not valid TOML")


INJECTIONS = ["a; touch pwned", "$(touch pwned)", "`touch pwned`", "a' ; touch pwned; echo '", "a\ntouch pwned", "-n"]


@pytest.mark.parametrize("value", INJECTIONS)
def test_script_values_are_quoted_never_run(tmp_path: Path, value: str) -> None:
    params = '[params.script]\ntype = "path"\n[params.extra]\ntype = "args"\ndefault = ""'
    job_table = "script = '''printf '%s\\n' {script} x{script}y {extra} > out'''"
    template = load_template(write(tmp_path, "t", doc(job_table, params)))
    work = tmp_path / "work"
    work.mkdir()
    script = str(template.render({"script": value, "extra": "b; touch pwned"})["script"])
    subprocess.run(["/bin/sh", "-c", script], cwd=work, env={"PATH": os.defpath}, check=True, timeout=10)
    assert not (work / "pwned").exists()
    assert (work / "out").read_text() == f"{value}\nx{value}y\nb;\ntouch\npwned\n"
