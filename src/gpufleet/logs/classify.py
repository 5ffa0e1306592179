"""Kernel and driver log lines a GPU cluster admin must act on: recognised, named and graded.

Pure functions over text. `classify_text` reads a whole export (dmesg, /dev/kmsg, syslog, journalctl
short or JSON, the Fabric Manager log, `ibstat` output); `LogClassifier` does the same for a stream
of lines (the agent following its kernel log). Each recognised line becomes one `LogEvent` naming
the GPU or device by PCI bus id, a kind, the code, a severity and the recommended action.

Speed comes from not looking: almost every line of a kernel log is ordinary, so the text is first
searched for a handful of literal keywords (`str.find` over the whole buffer, far faster than a
regular expression per line), and only the lines that hold one are framed and matched.

Multi-line messages are one event: the driver's "The NVIDIA GPU ... has fallen off the bus" spans
three lines, an SXid's "Severity"/"Data" lines and an Xid 119's RPC history belong to the line that
named the error, an `ibstat` port's state belongs to its CA and port lines above it, and a kernel
oops is one event on the line naming its cause ("BUG: unable to handle ...", "kernel BUG at ..."),
its "Oops: 0000 [#1]" header a few lines below being part of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from gpufleet.logs.catalog import DEFAULT_POLICY, Action, Severity, XidPolicy, severity_of, xid_table
from gpufleet.logs.framing import frame

FELL_OFF = "GPU has fallen off the bus"
# Every recognisable line holds at least one of these (case as the kernel writes them).
KEYWORDS: tuple[str, ...] = (
    "NVRM",
    "Xid",  # also SXid
    "XID",
    "mlx5",
    " carrier",
    "ut of memory: Kill",
    "blocked for more than",
    "Machine Check",
    "Machine check",
    "Hardware Error",
    "EDAC",
    "State:",  # ibstat
    "Link layer:",
    "NVSwitch",  # the Fabric Manager log's own account of SXids
    "API mismatch",  # NVRM: the driver's kernel module and its user-space libraries differ
    "peermem",  # nvidia-peermem (GPUDirect RDMA), and nvidia_peermem as the module loader names it
    "nv_peer_mem",  # its predecessor from Mellanox OFED
    "Kernel panic",
    "BUG: ",  # the causes of an oops: "BUG: unable to handle ...", "BUG: kernel NULL pointer ..."
    "kernel BUG at",
    "Unable to handle kernel",  # arm and arm64
    " [#",  # an oops's own header: "Oops: 0000 [#1] SMP", "general protection fault: 0000 [#1]"
    '"MESSAGE":[',  # journalctl -o json writes a message that is not UTF-8 as a list of bytes
    '"MESSAGE": [',
)
_PCI = r"(?:PCI:)?((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
_BDF = r"((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"  # with the PCI function
_XID = re.compile(r"\b(S?)Xid \(" + _PCI + r"(?: GPU-I:\s*\d+)?\):\s*(\d+)(?:,\s*(.*))?")
_FM_SXID = re.compile(r"detected NVSwitch (non-fatal|fatal) error (\d+) .*?pci bus id " + _PCI, re.IGNORECASE)
_XID_BARE = re.compile(r"\bXID (\d+)\b\s*(.*)")  # NVIDIA's documented form, without the PCI address
_FELL_OFF = re.compile(r"GPU " + _PCI + r": GPU has fallen off the bus")
_FELL_OFF_START = re.compile(r"The NVIDIA GPU " + _PCI)
_SXID_DETAIL = re.compile(r"^(?:Severity \d+ Engine|Data \{)")
_RECOVERY = re.compile(
    r"to 0x[0-9a-fA-F]+ \(([^)]*)\)"
)  # Xid 154: "... changed from 0x0 (None) to 0x4 (Drain and Reset)"
_NVLINK5 = re.compile(r"\b(Nonfatal|Fatal)\b")
_MLX5 = re.compile(r"\bmlx5_(?:core " + _BDF + ")?")  # mlx5_core 0000:01:00.0: ..., mlx5_port_module_event:...
_CARRIER = re.compile(r"\b(ib[\w.]*): (Lost|Gained) carrier")
# "Killed process N (name)" since kernel 5.x; "Kill process N (name) score S or sacrifice child" before
# (RHEL/CentOS 7's 3.10), where the "Killed process" line that follows is the same kill.
_OOM = re.compile(r"[Oo]ut of memory: Kill(?:ed)? process (\d+) \(([^)]*)\)")
_HUNG = re.compile(r"task (\S+):(\d+) blocked for more than (\d+) seconds")
_EDAC = re.compile(r"EDAC \S+: (\d+) (UE|CE) ")
_MCE = re.compile(r"Machine check events logged|Machine Check Exception")
# The driver's kernel module refuses a client whose libraries are another version: the node cannot run
# CUDA until they agree (usually a driver upgraded without a reboot). The message spans several lines;
# rsyslog writes it as one, its newlines as #012.
_API_MISMATCH = re.compile(
    r"NVRM: API mismatch: the client (?:'(?P<client>[^']*)' \(pid (?P<pid>\d+)\)|has the version (?P<libs>\d[\d.]*\d))"
)
_MODULE_VERSION = re.compile(r"this kernel module has the version (\d[\d.]*\d)")
_PEERMEM_ERROR = re.compile(r"\bnvidia[-_]peermem \w+:\d+ (?:ERROR )?(.*)")  # peer_err(): function:line message
_PEERMEM_UNLOADED = re.compile(r"\b(nvidia[-_]peermem|nv_peer_mem): Unknown symbol (\w+)")  # the loader's refusal
_PANIC = re.compile(r"(?<!end )Kernel panic - not syncing: ?(.*?)(?: \]---)?$")  # not its closing "---[ end ..."
_OOPS_CAUSE = re.compile(
    r"\b(?:BUG: (?:unable to handle|kernel NULL pointer dereference)|kernel BUG at |Unable to handle kernel ).*"
)
_OOPS_HEADER = re.compile(r"(?P<what>[A-Za-z][^\[\]]*?): [0-9a-f]{2,16} \[#\d+\]")  # die(): "what: error [#count]"
_OOPS_HEADER_PREFIX = re.compile(r"^(?:Internal error: |Oops: )+")
# An oops's header follows its cause within a few lines (x86: the #PF and PGD lines; arm64: a dozen
# lines of abort information). Further apart, they are two oopses.
OOPS_CAUSE_LINES = 40
_IBSTAT_STATE = re.compile(r"^\s*State: (\w+)")
_IBSTAT_CA = re.compile(r"^CA '([^']+)'", re.MULTILINE)
_IBSTAT_PORT = re.compile(r"^\s*Port (\d+):", re.MULTILINE)
_IBSTAT_LAYER = re.compile(r"^\s*Link layer: (\w+)")
_NVRM_RESET = re.compile(r"NVRM: .*\bGPU (?:" + _PCI + r"):? .*\breset\b", re.IGNORECASE)
_NVRM_NVLINK = re.compile(r"NVRM: .*NVLink.*\b(error|fail\w*|down)\b", re.IGNORECASE)
_NVRM_ECC = re.compile(r"NVRM: .*\b(uncorrectable|double bit|ECC error|row remap\w*)\b", re.IGNORECASE)
_RECOVERY_ACTIONS: dict[str, Action] = {
    "none": "ignore",
    "gpu reset required": "reset_gpu",
    "drain and reset": "reset_gpu",
    "node reboot required": "reboot",
    "drain p2p": "drain",
}

# Every kind of event the recognisers below give (the dashboard's kind filter lists them).
EVENT_KINDS = (
    "xid",
    "sxid",
    "gpu_off_bus",
    "nvlink",
    "ecc",
    "gpu_reset",
    "driver",
    "nic",
    "ib_link",
    "peermem",
    "oom",
    "hung_task",
    "mce",
    "oops",
    "panic",
)


@dataclass
class LogEvent:
    kind: str  # one of EVENT_KINDS
    severity: Severity
    action: Action
    line: str
    line_no: int  # 1-based, in the text classified (or the stream since the classifier started)
    code: int | None = None
    pci_bus: str | None = None  # a GPU's "0000:2b:00" (as NVML); a NIC's "0000:3b:00.1" (its port's function too)
    device: str | None = None  # a name where there is no PCI id: ib0, mlx5_10/1, a task
    category: str | None = None  # for Xids, the table's category (ecc, nvlink, bus, app, ...)
    message: str = ""
    time: float | None = None  # epoch seconds, when the line says
    uptime_s: float | None = None  # seconds since boot, when the line says (dmesg, /dev/kmsg)
    suggested: Action | None = None  # what an Xid line itself says to do, before the admins' policy

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["time"] = datetime.fromtimestamp(self.time, UTC).isoformat() if self.time is not None else None
        return out


def normalize_pci(value: str, *, function: bool = False) -> str:
    """'00000000:2B:00.0', '2b:00' and '0000:2b:00' all name the same GPU: '0000:2b:00'.

    With `function`, a function the address has is kept ('0000:3b:00.1'): the ports of one network
    card are functions of one PCI device, and must stay apart."""
    value, _, fn = value.lower().partition(".")
    parts = value.split(":")
    if len(parts) == 2:
        parts.insert(0, "0000")
    domain = parts[0][-4:].rjust(4, "0")
    device = f"{domain}:{parts[1]}:{parts[2]}"
    return f"{device}.{fn}" if function and fn else device


def _event(kind: str, action: Action, line: str, **fields: Any) -> LogEvent:
    return LogEvent(kind=kind, severity=severity_of(action), action=action, line=line, line_no=0, **fields)


def _xid(m: re.Match[str], line: str, policy: XidPolicy) -> LogEvent | None:
    """An Xid or SXid line; None for an SXid's detail lines (Severity..., Data {...})."""
    switch, pci, code, rest = m.group(1), m.group(2), int(m.group(3)), m.group(4) or ""
    if switch:
        if _SXID_DETAIL.match(rest):
            return None  # the details of the SXid line above it
        fatal = "Non-fatal" not in rest and "Nonfatal" not in rest
        action: Action = "drain" if fatal else "warn"
        return _event("sxid", action, line, code=code, pci_bus=normalize_pci(pci), category="nvswitch", message=rest)
    suggested: Action | None = None
    if code == 154 and (r := _RECOVERY.search(rest)):
        suggested = _RECOVERY_ACTIONS.get(r.group(1).strip().lower())
    elif 144 <= code <= 150 and (n := _NVLINK5.search(rest)) and n.group(1) == "Nonfatal":
        suggested = "warn"
    info = xid_table().get(code)
    return _event(
        "xid",
        policy.action(code, suggested),
        line,
        code=code,
        pci_bus=normalize_pci(pci),
        category=info.category if info else None,
        message=rest or (info.meaning if info else ""),
        suggested=suggested,
    )


def _fm_sxid(m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent:
    """The Fabric Manager's "detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id ..."."""
    action: Action = "drain" if m.group(1).lower() == "fatal" else "warn"
    pci = normalize_pci(m.group(3))
    return _event("sxid", action, line, code=int(m.group(2)), pci_bus=pci, category="nvswitch", message=m.group(0))


def _xid_bare(m: re.Match[str], line: str, policy: XidPolicy) -> LogEvent:
    code = int(m.group(1))
    info = xid_table().get(code)
    category = info.category if info else None
    return _event("xid", policy.action(code), line, code=code, category=category, message=m.group(2))


def _fell_off(m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent:
    return _event("gpu_off_bus", "reboot", line, pci_bus=normalize_pci(m.group(1)), message=FELL_OFF)


# mlx5_core messages that are events, first match wins: (text in the line, kind, action, message).
_MLX5_EVENTS: tuple[tuple[tuple[str, ...], str, Action, str], ...] = (
    (("health compromised", "firmware internal error", "Health issue observed"), "nic", "drain", "firmware health"),
    (("insufficient power",), "nic", "warn", "insufficient power on the PCIe slot"),
    (("Port module event[error]", "Cable error", "unplugged"), "nic", "warn", "cable or module error"),
    (("Port module event",), "nic", "ignore", "cable or module event"),
    (("Link down",), "ib_link", "warn", "link down"),
    (("Link up",), "ib_link", "ignore", "link up"),
    (("_err:",), "nic", "ignore", "firmware command failed"),  # recorded; rarely a fault on its own
)


def _mlx5(m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent | None:
    pci = normalize_pci(m.group(1), function=True) if m.group(1) else None
    for needles, kind, action, message in _MLX5_EVENTS:
        if any(n in line for n in needles):
            return _event(kind, action, line, pci_bus=pci, message=message)
    return None


def _carrier(m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent:
    action: Action = "warn" if m.group(2) == "Lost" else "ignore"
    return _event("ib_link", action, line, device=m.group(1), message=f"{m.group(2).lower()} carrier")


def _oom(m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent:
    return _event("oom", "warn", line, device=f"{m.group(2)}:{m.group(1)}", message="killed by the OOM killer")


def _hung(m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent:
    message = f"blocked for more than {m.group(3)} s"
    return _event("hung_task", "warn", line, device=f"{m.group(1)}:{m.group(2)}", message=message)


def _edac(m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent:
    action: Action = "drain" if m.group(2) == "UE" else "warn"  # uncorrected host memory errors
    return _event("mce", action, line, message=f"{m.group(1)} {m.group(2)} memory errors")


def _mce(_m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent:
    return _event("mce", "warn", line, message="machine-check events logged")


def _api_mismatch(m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent:
    """Reboot: what fixes it after a driver upgrade (the new kernel module loads); a drain until then."""
    if m.group("client") is not None:
        detail = f"client {m.group('client')}, pid {m.group('pid')}"
    else:
        module = _MODULE_VERSION.search(m.string)  # on this line only where rsyslog joined the message
        detail = f"libraries {m.group('libs')}" + (f", kernel module {module.group(1)}" if module else "")
    message = f"the driver's kernel module and its user-space libraries differ ({detail})"
    return _event("driver", "reboot", line, message=message)


def _peermem_error(m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent:
    """Every message nvidia-peermem prints is an error; GPUDirect RDMA transfers may fail or fall back."""
    return _event("peermem", "warn", line, message=f"nvidia-peermem: {m.group(1).strip()}")


def _peermem_unloaded(m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent:
    message = f"{m.group(1)} did not load (unknown symbol {m.group(2)}): no GPUDirect RDMA"
    return _event("peermem", "warn", line, message=message)


def _panic(m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent:
    """Drain: the node rebooted (or hangs); work stays off it until someone finds out why."""
    return _event("panic", "drain", line, message=f"kernel panic: {m.group(1).strip()}")


def _reset(m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent:
    return _event("gpu_reset", "warn", line, pci_bus=normalize_pci(m.group(1)), message="GPU reset")


def _nvlink(_m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent:
    return _event("nvlink", "warn", line, message="NVLink error")


def _ecc(_m: re.Match[str], line: str, _policy: XidPolicy) -> LogEvent:
    return _event("ecc", "warn", line, message="GPU memory error")


Recogniser = Callable[[re.Match[str], str, XidPolicy], "LogEvent | None"]
# In order; the first pattern found in a line decides it, even when its recogniser then finds no event
# in it (an SXid's detail line, an ordinary mlx5_core line).
RECOGNISERS: tuple[tuple[re.Pattern[str], Recogniser], ...] = (
    (_XID, _xid),
    (_FM_SXID, _fm_sxid),
    (_XID_BARE, _xid_bare),
    (_FELL_OFF, _fell_off),
    (_MLX5, _mlx5),
    (_CARRIER, _carrier),
    (_OOM, _oom),
    (_HUNG, _hung),
    (_EDAC, _edac),
    (_MCE, _mce),
    (_API_MISMATCH, _api_mismatch),
    (_PEERMEM_ERROR, _peermem_error),
    (_PEERMEM_UNLOADED, _peermem_unloaded),
    (_PANIC, _panic),
    (_NVRM_RESET, _reset),
    (_NVRM_NVLINK, _nvlink),
    (_NVRM_ECC, _ecc),
)


def classify_message(message: str, line: str, policy: XidPolicy) -> LogEvent | None:
    """The event one framed line carries, or None. `line` is kept as the evidence."""
    for pattern, recognise in RECOGNISERS:
        if m := pattern.search(message):
            return recognise(m, line, policy)
    return None


@dataclass
class LogClassifier:
    """Classifies lines as they come, remembering the little context multi-line messages need.

    `year` completes syslog dates, which have none (default: guessed from today); `policy` is the
    admins' Xid policy.
    """

    policy: XidPolicy = DEFAULT_POLICY
    year: int | None = None
    line_no: int = 0
    _fell_off: tuple[str, list[str], float | None, float | None] | None = None  # pci, lines so far, times
    _ca: str | None = None  # ibstat: the CA and port being read
    _port: str | None = None
    _port_down: LogEvent | None = None  # an ibstat port not Active, until its link layer is read
    _oops_cause_at: int | None = None  # the line of an oops's cause whose header is still to come

    def feed(self, lines: Iterable[str]) -> Iterator[LogEvent]:
        """The events in `lines` (without their line ends). Every line goes through the keyword test;
        see `classify_text` for the faster path over a whole buffer."""
        for line in lines:
            self.line_no += 1
            self._ibstat_header(line)
            if any(k in line for k in KEYWORDS):
                event = self._line(line)
                if event is not None:
                    yield event

    def _ibstat_header(self, line: str) -> None:
        """Lines without a keyword that still matter: ibstat's CA and port headers."""
        if line.startswith("CA '"):
            self._ca, self._port = line[4:].split("'", 1)[0], None
        elif self._ca is not None and (m := _IBSTAT_PORT.match(line)):
            self._port = m.group(1)

    def _line(self, line: str) -> LogEvent | None:
        epoch, uptime, message = frame(line, self.year)
        consumed, event = self._multi_line(line, message, epoch, uptime)
        if not consumed:
            event = classify_message(message, line, self.policy)
        if event is not None:
            event.line_no = event.line_no or self.line_no
            if event.time is None:
                event.time = epoch
            if event.uptime_s is None:
                event.uptime_s = uptime
        return event

    def _multi_line(
        self, line: str, message: str, epoch: float | None, uptime: float | None
    ) -> tuple[bool, LogEvent | None]:
        """(whether this line belongs to a multi-line message, the event it completes)."""
        if m := _FELL_OFF_START.search(message):
            self._fell_off = (normalize_pci(m.group(1)), [message.strip()], epoch, uptime)
            return True, None
        if self._fell_off is not None:
            pci, parts, first_epoch, first_uptime = self._fell_off
            if "fallen off the bus and is not responding" in message:
                self._fell_off = None
                full = " ".join([*parts, message.strip()])
                event = _event("gpu_off_bus", "reboot", full, pci_bus=pci, message=FELL_OFF)
                event.time, event.uptime_s = first_epoch, first_uptime
                return True, event
            if "NVRM" in message and len(parts) < 3:
                parts.append(message.strip())
                return True, None
            self._fell_off = None
        if self._ca is not None and (m := _IBSTAT_STATE.match(line)):
            self._port_down = None
            if m.group(1) != "Active":  # reported at the port's "Link layer:" line, which says IB or Ethernet
                where = f"{self._ca}/{self._port or '?'}"
                self._port_down = _event("ib_link", "warn", line, device=where, message=f"port state {m.group(1)}")
                self._port_down.line_no = self.line_no
            return True, None
        if self._port_down is not None and (m := _IBSTAT_LAYER.match(line)):
            event, self._port_down = self._port_down, None
            if m.group(1) != "InfiniBand":
                event.kind = "nic"  # an Ethernet port of a ConnectX card: not the InfiniBand fabric
            return True, event
        return self._oops(line, message)

    def _oops(self, line: str, message: str) -> tuple[bool, LogEvent | None]:
        """An oops: an event at its cause; its header ("Oops: 0000 [#1] SMP") is part of the cause
        above it, or the event itself where none came first (a general protection fault, an invalid
        opcode). Reboot: the kernel goes on after an oops, with locks held and state half changed."""
        if m := _OOPS_CAUSE.search(message):
            self._oops_cause_at = self.line_no
            return True, _event("oops", "reboot", line, message=f"kernel oops: {m.group(0).strip()}")
        if "[#" not in message or not (m := _OOPS_HEADER.search(message)):  # the test first: a cheap one
            return False, None
        cause_at, self._oops_cause_at = self._oops_cause_at, None
        if cause_at is not None and self.line_no - cause_at <= OOPS_CAUSE_LINES:
            return True, None
        what = _OOPS_HEADER_PREFIX.sub("", m.group("what"))
        return True, _event("oops", "reboot", line, message="kernel oops" if what == "Oops" else f"kernel oops: {what}")

    def context_before(self, text: str, start: int) -> None:
        """For `classify_text`, which skips the lines without keywords: an ibstat `State:` line's CA
        and port are found by looking back from it."""
        if not text[start : start + 64].lstrip().startswith("State:"):
            return
        ca_at = text.rfind("CA '", 0, start)
        if ca_at == -1:
            return
        self._ca = text[ca_at + 4 : text.find("'", ca_at + 4, start)]  # not a slice to the end: this runs often
        ports = _IBSTAT_PORT.findall(text, ca_at, start)
        self._port = ports[-1] if ports else None


def classify_text(text: str, policy: XidPolicy = DEFAULT_POLICY, year: int | None = None) -> list[LogEvent]:
    """Every event in a whole log export. Equivalent to `LogClassifier.feed(text.splitlines())`, faster:
    the keywords are searched for over the whole text and only the lines around a hit are read."""
    classifier = LogClassifier(policy=policy, year=year)
    events: list[LogEvent] = []
    for start, end, line_no in _candidate_lines(text):
        classifier.line_no = line_no
        classifier.context_before(text, start)
        event = classifier._line(text[start:end].rstrip("\r"))
        if event is not None:
            events.append(event)
    return events


def _candidate_lines(text: str) -> list[tuple[int, int, int]]:
    """(start, end, 1-based line number) of every line holding a keyword, plus the lines continuing a
    multi-line message (the two after "The NVIDIA GPU"), in order."""
    starts: set[int] = set()
    for keyword in KEYWORDS:
        find = text.find
        at = find(keyword)
        while at != -1:
            line_start = text.rfind("\n", 0, at) + 1
            starts.add(line_start)
            line_end = text.find("\n", at)
            if line_end == -1:
                break
            at = find(keyword, line_end + 1)
    ordered = sorted(starts)
    out: list[tuple[int, int, int]] = []
    line_no, counted_to = 1, 0
    for start in ordered:
        line_no += text.count("\n", counted_to, start)
        counted_to = start
        end = text.find("\n", start)
        out.append((start, end if end != -1 else len(text), line_no))
    return out
