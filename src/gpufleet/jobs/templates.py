"""Job templates: parameterised job specs for the common workloads, kept as TOML data files.

A template is a file `<name>.toml`:

    name = "torchrun-ddp"            # the file's stem: lowercase letters, digits and dashes
    description = "Data-parallel training with torchrun."

    [params.nodes]                   # a parameter, set with `--set nodes=2`
    type = "int"                     # int, str, path, bool, duration (90m, 4h, 2d) or args (see below)
    default = 1                      # without a default the parameter is required
    help = "nodes, all started together"
    min = 1                          # min and max: ints only
    max = 1024
    # choices = ["no", "bf16"]       # strs only

    [job]                            # JobSubmit's fields
    nodes = "{nodes}"
    gpus_per_node = 8
    script = "exec torchrun --nnodes=\"$WORLD_SIZE\" ... {script} {args}"   # or argv = [...], never both

Placeholders. Any string in [job] may hold `{param}`, a declared parameter's name; `{{` and `}}` stand for
literal braces. Nothing else is a placeholder: `{x.y}`, `{x[0]}`, `{x!r}`, `{x:>4}`, `{0}` and a lone
brace refuse the file. Substitution is plain text replacement in one pass (a value holding braces stays as
it is), never str.format and never eval. A number field given as "{nodes}" becomes the number: JobSubmit
converts "2" to 2.

Quoting. A `script` is run by /bin/sh, so every value substituted into it is quoted with shlex.quote: the
value `x; rm -rf /` is one word, never a command. So in a script a placeholder stands where a word or part
of one goes and is never put in quotes of its own: `--out={output}`, not `--out="{output}"`. Everywhere
else (argv elements, env values, the name, the workdir) values go in verbatim: argv is not run by a shell.
An `args` parameter ("--epochs 10 --lr 3e-4") is split into words as the shell would split it and may
stand only in a script (each word quoted) or as a whole argv element (one element per word).

Multi-node templates read the rendezvous gpufleet puts in each rank's environment (agent.jobs.identity):
WORLD_SIZE (the number of nodes), NODE_RANK, MASTER_ADDR and MASTER_PORT; their scripts expand them.

Files. The built-in templates live in template_files/ beside this module; admins add their own in
directories of their own, where a file replaces the built-in one of the same name. `load_template`
refuses a bad file with InvalidInput naming the file and the problem; `load_templates` lists such
problems beside the templates that did load, so one bad file does not hide the others.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple, get_args

from pydantic import ValidationError

from gpufleet.core.durations import parse_duration
from gpufleet.core.errors import InvalidInput, describe
from gpufleet.core.toml_files import Refused, load_dirs, load_file
from gpufleet.jobs.schemas import JobSubmit

ParamType = Literal["int", "str", "path", "bool", "duration", "args"]
PARAM_TYPES: tuple[str, ...] = get_args(ParamType)
Value = int | bool | str | tuple[str, ...]  # a duration is its seconds, an args value its words

BUILTIN_DIR = Path(__file__).resolve().parent / "template_files"
TEMPLATE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
PARAM_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
JOB_FIELDS = frozenset(JobSubmit.model_fields)

_FILE_KEYS = ("name", "description", "params", "job")
_PARAM_KEYS = ("type", "default", "help", "min", "max", "choices")
_INT_TEXT = re.compile(r"^[+-]?[0-9]+$")
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})
# `{{`, `}}`, a `{...}` group (checked to be a parameter's name), or a lone brace (refused).
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


class Ref(NamedTuple):
    """A placeholder in a template string: the parameter it names."""

    name: str


def parse_placeholders(text: str) -> list[str | Ref]:
    """`text` as literal pieces and placeholders. Raises ValueError for anything that is neither."""
    parts: list[str | Ref] = []
    end = 0
    for match in _TOKEN.finditer(text):
        parts.append(text[end : match.start()])
        end = match.end()
        token = match.group(0)
        if token in ("{{", "}}"):
            parts.append(token[0])
        elif match.group(1) is not None and PARAM_NAME.match(match.group(1)):
            parts.append(Ref(match.group(1)))
        elif match.group(1) is not None:
            raise ValueError(f"{token!r} is not a placeholder: write {{name}} with a parameter's name")
        else:
            raise ValueError(f"a lone {token!r}: write {token * 2} for a literal brace")
    parts.append(text[end:])
    return [p for p in parts if p != ""]


@dataclass(frozen=True)
class Param:
    name: str
    type: ParamType
    default: Value | None  # None: required
    help: str = ""
    min: int | None = None
    max: int | None = None
    choices: tuple[str, ...] | None = None

    @property
    def required(self) -> bool:
        return self.default is None

    def convert(self, raw: object) -> Value:
        """`raw` (a `--set` text, or the file's default) as this parameter's type. Raises ValueError."""
        if self.type == "int":
            return self._int(raw)
        if self.type == "bool":
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
                return raw.strip().lower() in _TRUE
            raise ValueError(f"{raw!r} is not a bool (use true or false)")
        if not isinstance(raw, str):  # a TOML default of the wrong type: a bad value like any other
            raise ValueError(f"{raw!r} is not a {self.type}")  # noqa: TRY004
        if self.type == "duration":
            try:
                return parse_duration(raw)
            except InvalidInput as exc:
                raise ValueError(str(exc)) from None
        if self.type == "args":
            try:
                return tuple(shlex.split(raw))
            except ValueError as exc:  # an unclosed quote
                raise ValueError(f"{raw!r} cannot be split into words: {exc}") from None
        if self.type == "path" and not raw:
            raise ValueError("a path cannot be empty")
        if self.choices is not None and raw not in self.choices:
            raise ValueError(f"{raw!r} is not one of {', '.join(self.choices)}")
        return raw

    def _int(self, raw: object) -> int:
        if isinstance(raw, int) and not isinstance(raw, bool):  # TOML's true is no number
            value = raw
        elif isinstance(raw, str) and _INT_TEXT.match(raw.strip()):
            value = int(raw)
        else:
            raise ValueError(f"{raw!r} is not an int")
        if self.min is not None and value < self.min:
            raise ValueError(f"{value} is below the minimum, {self.min}")
        if self.max is not None and value > self.max:
            raise ValueError(f"{value} is above the maximum, {self.max}")
        return value


@dataclass(frozen=True)
class Template:
    name: str
    description: str
    params: Mapping[str, Param]  # in the file's order
    job: Mapping[str, object]  # the [job] table as written, placeholders checked
    source: Path

    @property
    def origin(self) -> str:
        """ "built-in", or "admin" for a file of the admins' own directory."""
        return "built-in" if self.source.parent == BUILTIN_DIR else "admin"

    def render(self, values: Mapping[str, str]) -> dict[str, object]:
        """The job spec for these `--set` values, validated as a JobSubmit and returned as its fields
        (those the template sets). Raises InvalidInput for unknown, malformed or missing values."""
        unknown = sorted(set(values) - set(self.params))
        if unknown:
            known = ", ".join(self.params) or "none"
            raise InvalidInput(f"template {self.name} has no param {', '.join(unknown)}; its params: {known}")
        typed: dict[str, Value] = {}
        missing: list[str] = []
        for name, param in self.params.items():
            if name in values:
                try:
                    typed[name] = param.convert(values[name])
                except ValueError as exc:
                    raise InvalidInput(f"template {self.name}: param {name!r}: {exc}") from None
            elif param.default is not None:
                typed[name] = param.default
            else:
                missing.append(f"{name} ({param.help})" if param.help else name)
        if missing:
            raise InvalidInput(f"template {self.name} needs a value for {'; '.join(missing)}")
        job = {field: _render_field(field, value, typed) for field, value in self.job.items()}
        try:
            spec = JobSubmit.model_validate(job)
        except ValidationError as exc:
            raise InvalidInput(f"template {self.name}: {describe(exc, 'job')}") from None
        return spec.model_dump(mode="json", exclude_unset=True)


def load_template(path: Path) -> Template:
    """The template in `path`. Raises InvalidInput, naming the file, when it is not a valid one."""
    return load_file(path, _template)


def load_templates(admin_dirs: Sequence[Path] = ()) -> tuple[dict[str, Template], list[str]]:
    """The built-in templates, then those in each of `admin_dirs` in turn, a later file replacing an
    earlier one of the same name. A file that fails to load is left out (a built-in it meant to replace
    stays) and its problem listed. A directory that does not exist is skipped: admin dirs are optional."""
    return load_dirs((BUILTIN_DIR, *admin_dirs), _template, lambda template: template.name)


def _template(path: Path, data: dict[str, object]) -> Template:
    unknown = sorted(set(data) - set(_FILE_KEYS))
    if unknown:
        raise Refused(f"unknown key(s) {', '.join(unknown)}; a template has {', '.join(_FILE_KEYS)}")
    name = data.get("name")
    if not isinstance(name, str) or not TEMPLATE_NAME.match(name):
        raise Refused(f"name {name!r} must be lowercase letters, digits and dashes")
    if name != path.stem:
        raise Refused(f"name {name!r} differs from the file's name: call the file {name}.toml")
    description = data.get("description")
    if not isinstance(description, str) or not description.strip():
        raise Refused("description must be a non-empty string")
    table = data.get("params", {})
    if not isinstance(table, dict):
        raise Refused("params must hold [params.NAME] tables")
    params = {pname: _param(pname, spec) for pname, spec in table.items()}
    job = data.get("job")
    if not isinstance(job, dict):
        raise Refused("a [job] table is required")
    _check_job(job, params)
    return Template(name, description.strip(), params, job, path)


def _param(name: str, spec: object) -> Param:
    where = f"param {name!r}"
    if not PARAM_NAME.match(name):
        raise Refused(f"{where}: a name is lowercase letters, digits and underscores, not starting with a digit")
    if not isinstance(spec, dict):
        raise Refused(f"{where}: must be a table, [params.{name}]")
    unknown = sorted(set(spec) - set(_PARAM_KEYS))
    if unknown:
        raise Refused(f"{where}: unknown key(s) {', '.join(unknown)}; a param has {', '.join(_PARAM_KEYS)}")
    kind = spec.get("type")
    if kind not in PARAM_TYPES:
        raise Refused(f"{where}: type {kind!r} is not one of {', '.join(PARAM_TYPES)}")
    help_text = spec.get("help", "")
    if not isinstance(help_text, str):
        raise Refused(f"{where}: help must be a string")
    low, high = spec.get("min"), spec.get("max")
    if (low is not None or high is not None) and kind != "int":
        raise Refused(f"{where}: min and max apply to int params only")
    if any(b is not None and (not isinstance(b, int) or isinstance(b, bool)) for b in (low, high)):
        raise Refused(f"{where}: min and max must be integers")
    if low is not None and high is not None and low > high:
        raise Refused(f"{where}: min {low} is above max {high}")
    choices = spec.get("choices")
    if choices is not None and kind != "str":
        raise Refused(f"{where}: choices apply to str params only")
    if choices is not None and (not isinstance(choices, list) or not all(isinstance(c, str) for c in choices)):
        raise Refused(f"{where}: choices must be a list of strings")
    param = Param(name, kind, None, help_text, low, high, tuple(choices) if choices else None)
    if "default" not in spec:
        return param
    try:
        default = param.convert(spec["default"])
    except ValueError as exc:
        raise Refused(f"{where}: default {exc}") from None
    return Param(name, kind, default, help_text, low, high, param.choices)


def _check_job(job: dict[str, object], params: Mapping[str, Param]) -> None:
    """Refuse a [job] table that could never render: unknown fields, not exactly one of argv and script,
    values of the wrong shape, bad placeholders, and fields without placeholders that JobSubmit refuses."""
    unknown = sorted(set(job) - JOB_FIELDS)
    if unknown:
        raise Refused(f"job: unknown field(s) {', '.join(unknown)}; the fields are {', '.join(sorted(JOB_FIELDS))}")
    if ("argv" in job) == ("script" in job):
        raise Refused("job: give exactly one of argv (a list of strings) and script (a string)")
    fixed: dict[str, object] = {}
    for field, value in job.items():
        texts = _texts(field, value)
        refs = [_refs(where, text, params) for where, text in texts]
        for (where, text), found in zip(texts, refs, strict=True):
            whole_element = field == "argv" and parse_placeholders(text) == found
            for ref in found:
                if params[ref.name].type == "args" and field != "script" and not whole_element:
                    raise Refused(
                        f"{where}: args param {ref.name!r} may stand only in the script or as a whole argv element"
                    )
        if not any(refs):
            fixed[field] = _render_field(field, value, {})
    # The fields without placeholders are final: check them now, not at the first submit. A stand-in
    # command satisfies JobSubmit's one-command rule while the real one still holds placeholders.
    if "argv" not in fixed and "script" not in fixed:
        fixed["argv"] = ["true"]
    try:
        JobSubmit.model_validate(fixed)
    except ValidationError as exc:
        raise Refused(f"job: {describe(exc)}") from None


def _texts(field: str, value: object) -> list[tuple[str, str]]:
    """Every string in one [job] field, with where it is; refuses a value of the wrong shape."""
    where = f"job.{field}"
    if field == "argv":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise Refused(f"{where} must be a list of strings")
        return [(f"{where}[{i}]", v) for i, v in enumerate(value)]
    if field == "env":
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise Refused(f"{where} must be a table of strings")
        return [(f"{where}.{k}", v) for k, v in value.items()]
    if field == "script" and not isinstance(value, str):
        raise Refused(f"{where} must be a string")
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, bool | int | float):
        return []
    raise Refused(f"{where} must be a string, a number or a boolean")


def _refs(where: str, text: str, params: Mapping[str, Param]) -> list[Ref]:
    try:
        refs = [p for p in parse_placeholders(text) if isinstance(p, Ref)]
    except ValueError as exc:
        raise Refused(f"{where}: {exc}") from None
    for ref in refs:
        if ref.name not in params:
            declared = ", ".join(params) or "none"
            raise Refused(f"{where}: {{{ref.name}}} names no declared param (declared: {declared})")
    return refs


def _render_field(field: str, value: object, values: Mapping[str, Value]) -> object:
    if field == "argv" and isinstance(value, list):
        argv: list[str] = []
        for element in value:
            parts = parse_placeholders(element)
            whole = values[parts[0].name] if len(parts) == 1 and isinstance(parts[0], Ref) else None
            if isinstance(whole, tuple):
                argv.extend(whole)  # an args value standing alone: one element per word
            else:
                argv.append(_render_text(element, values, quote=False))
        return argv
    if field == "env" and isinstance(value, dict):
        return {k: _render_text(v, values, quote=False) for k, v in value.items()}
    if isinstance(value, str):
        return _render_text(value, values, quote=field == "script")
    return value


def _render_text(text: str, values: Mapping[str, Value], quote: bool) -> str:
    return "".join(p if isinstance(p, str) else _as_text(values[p.name], quote) for p in parse_placeholders(text))


def _as_text(value: Value, quote: bool) -> str:
    if isinstance(value, tuple):
        return shlex.join(value)  # only ever in a script (checked at load): each word quoted
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return shlex.quote(text) if quote else text
