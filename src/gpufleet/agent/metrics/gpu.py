"""GPU metrics through NVML: per GPU, one nvmlDeviceGetFieldValues call for every counter NVML offers as a
field, plain calls for the rest, and whatever the GPU, driver or VM refuses simply left out.

What a GPU supports is learnt once, on its first round ("discovery"): fields it refuses as not
supported are dropped from its request, replaced by the plain call that gives the same value where
one exists; plain calls it refuses are dropped too. After that a round asks only what can be
answered, which keeps NVML calls per sample near ten per GPU (see bench/agent_cost.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.agent.gpu import nvml_api as api
from gpufleet.agent.gpu.nvml_api import NvmlLibrary, NvmlUnavailable
from gpufleet.agent.gpu.ports import BYTES_PER_MIB, as_text
from gpufleet.agent.metrics.ports import Collected, CollectorError
from gpufleet.agent.metrics.xid import XidBook
from gpufleet.protocol.metrics import NodeEvent

log = logging.getLogger(__name__)

Request = int | tuple[int, int]  # a field id, or (field id, scope id) for per-link fields


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """A metric read as an NVML field; `fallback` names the plain reader that gives it where the field is refused."""

    metric: str
    field_id: int
    fallback: str | None = None


FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("ecc_sbe_volatile", api.FI_ECC_SBE_VOL_TOTAL, "ecc"),
    FieldSpec("ecc_dbe_volatile", api.FI_ECC_DBE_VOL_TOTAL, "ecc"),
    FieldSpec("ecc_sbe_aggregate", api.FI_ECC_SBE_AGG_TOTAL, "ecc"),
    FieldSpec("ecc_dbe_aggregate", api.FI_ECC_DBE_AGG_TOTAL, "ecc"),
    FieldSpec("retired_pages_sbe", api.FI_RETIRED_SBE, "retired_pages"),
    FieldSpec("retired_pages_dbe", api.FI_RETIRED_DBE, "retired_pages"),
    FieldSpec("retired_pages_pending", api.FI_RETIRED_PENDING, "retired_pages"),
    FieldSpec("remapped_rows_correctable", api.FI_REMAPPED_COR, "remapped_rows"),
    FieldSpec("remapped_rows_uncorrectable", api.FI_REMAPPED_UNC, "remapped_rows"),
    FieldSpec("remapped_rows_pending", api.FI_REMAPPED_PENDING, "remapped_rows"),
    FieldSpec("remapped_rows_failure", api.FI_REMAPPED_FAILURE, "remapped_rows"),
    FieldSpec("mem_temp_c", api.FI_MEMORY_TEMP),
    FieldSpec("energy_mj", api.FI_TOTAL_ENERGY_CONSUMPTION, "energy"),
    FieldSpec("pcie_replay_counter", api.FI_PCIE_REPLAY_COUNTER, "pcie_replay"),
    # Flow-control and data CRC errors are two NVML counters; the sample carries their sum.
    FieldSpec("nvlink_crc_errors", api.FI_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL),
    FieldSpec("nvlink_crc_errors", api.FI_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL),
    FieldSpec("nvlink_replay_errors", api.FI_NVLINK_REPLAY_ERROR_COUNT_TOTAL),
    FieldSpec("nvlink_recovery_errors", api.FI_NVLINK_RECOVERY_ERROR_COUNT_TOTAL),
)

# Plain readers every GPU starts with, and the metrics each gives (for the list of what a GPU refused).
ALWAYS_READ = ("utilization", "memory", "temperature", "power", "sm_clock", "mem_clock", "clocks_event", "pcie_link")
READER_METRICS: dict[str, tuple[str, ...]] = {
    "utilization": ("gpu_util", "mem_copy_util"),
    "memory": ("fb_used_mib", "fb_free_mib"),
    "temperature": ("gpu_temp_c",),
    "power": ("power_w",),
    "sm_clock": ("sm_clock_mhz",),
    "mem_clock": ("mem_clock_mhz",),
    "clocks_event": ("clocks_event_reasons",),
    "pcie_link": ("pcie_link_gen", "pcie_link_width"),
    "ecc": ("ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate"),
    "retired_pages": ("retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending"),
    "remapped_rows": (
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_pending",
        "remapped_rows_failure",
    ),
    "energy": ("energy_mj",),
    "pcie_replay": ("pcie_replay_counter",),
    "nvlink_state": ("nvlink_links_up", "nvlink_links_total"),
}
MIG_LOOK_ROUNDS = 12  # how often a GPU not in MIG mode is asked whether it is now (a minute at 5 s)
# Per-field answers that mean "never on this GPU": not supported, or a field id this driver predates.
_REFUSED = (api.NVML_ERROR_NOT_SUPPORTED, api.NVML_ERROR_INVALID_ARGUMENT)
NVLINK_METRICS = (
    "nvlink_links_up",
    "nvlink_links_total",
    "nvlink_crc_errors",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
)


class _GpuLost(Exception):
    """Internal: an NVML call said the GPU is lost; the round skips it and says so once."""


@dataclass
class _GpuState:
    """What the collector knows about the GPU at one NVML index."""

    index: int
    handle: Any = None
    uuid: str | None = None
    lost: bool = False
    discovered: bool = False
    requests: list[Request] = field(default_factory=list)
    meanings: list[str | int] = field(default_factory=list)  # per request: a metric, or a link number
    readers: list[str] = field(default_factory=list)
    link_count: int = 0
    static: dict[str, float] = field(default_factory=dict)  # values that never change (max PCIe link)
    unsupported: dict[str, str] = field(default_factory=dict)  # metric -> why it is left out
    mig_capable: bool = True  # False once NVML said this GPU has no MIG: not asked again
    mig_enabled: bool = False  # as of the last look (every MIG_LOOK_ROUNDS rounds while off)


class GpuCollector:
    """Samples every GPU NVML lists; `nvml` is the pynvml module (imported on first use) or a stand-in.

    `xids`, when given, supplies `xid_last` (from the Xid watcher). `calls` counts NVML calls, for the
    benchmark. Not thread-safe: one round at a time.
    """

    name = "gpu"

    def __init__(self, nvml: Any | None = None, *, xids: XidBook | None = None, clock: Callable[[], float] = time.time):
        """Keep what is needed; NVML is not loaded until the first round."""
        self._lib = NvmlLibrary(nvml)
        self._xids = xids
        self._clock = clock
        self._gpus: list[_GpuState] = []
        self._listed = False
        self._round = -1  # the first round is 0: MIG is looked at then
        self.calls = 0
        self._readers: dict[str, Callable[[_GpuState], dict[str, float]]] = {
            "utilization": self._utilization,
            "memory": self._memory,
            "temperature": self._temperature,
            "power": self._power,
            "sm_clock": self._sm_clock,
            "mem_clock": self._mem_clock,
            "clocks_event": self._clocks_event,
            "pcie_link": self._pcie_link,
            "ecc": self._ecc,
            "retired_pages": self._retired_pages,
            "remapped_rows": self._remapped_rows,
            "energy": self._energy,
            "pcie_replay": self._pcie_replay,
            "nvlink_state": self._nvlink_state,
        }

    # -- the round ---------------------------------------------------------------------------------
    def collect(self) -> Collected:
        """One round over every GPU. A lost GPU is left out and reported once as a `gpu_lost` event.

        Raises CollectorError when NVML cannot be loaded or started, or will not count the GPUs.
        """
        nvml = self._open()
        out = Collected()
        self._round += 1
        try:
            count = int(self._call("nvmlDeviceGetCount"))
        except (nvml.NVMLError, _GpuLost) as exc:
            raise CollectorError(f"NVML cannot count the GPUs: {exc}") from exc
        if count != len(self._gpus) or not self._listed:
            self._refresh(count, out)
        for state in self._gpus:
            if state.handle is None and not self._reacquire(state, out):
                continue
            try:
                if not state.discovered:
                    self._discover(state)
                values = self._read(state, out.problems)
            except _GpuLost as exc:
                self._mark_lost(state, str(exc), out)
                continue
            except nvml.NVMLError as exc:
                out.problems.append(f"GPU {state.index}: {exc}")
                continue
            if self._xids is not None and self._xids.active:
                values["xid_last"] = float(self._xids.last.get(state.index, 0))
            out.entities[f"gpu:{state.index}"] = values
            self._mig_devices(state, out)
        return out

    def _mig_devices(self, state: _GpuState, out: Collected) -> None:
        """Each MIG device's memory, as `mig:<gpu>/<gpu instance>` (NVML gives a MIG device no utilization,
        temperature or power of its own: those stay the GPU's). A failure here costs only these entities."""
        nvml = self._nvml
        if not state.mig_capable or not hasattr(nvml, "nvmlDeviceGetMigMode"):
            return
        if not state.mig_enabled and self._round % MIG_LOOK_ROUNDS:
            return  # a GPU turned to MIG is seen within MIG_LOOK_ROUNDS rounds; no call every round for it
        try:
            state.mig_enabled = int(self._call("nvmlDeviceGetMigMode", state.handle)[0]) == api.NVML_DEVICE_MIG_ENABLE
            if not state.mig_enabled:
                return
            for slot in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", state.handle))):
                try:
                    device = self._call("nvmlDeviceGetMigDeviceHandleByIndex", state.handle, slot)
                except nvml.NVMLError as exc:
                    if api.error_code(exc) == api.NVML_ERROR_NOT_FOUND:
                        continue
                    raise
                instance = int(self._call("nvmlDeviceGetGpuInstanceId", device))
                memory = self._call("nvmlDeviceGetMemoryInfo", device)
                out.entities[f"mig:{state.index}/{instance}"] = {
                    "fb_used_mib": float(int(memory.used) // BYTES_PER_MIB),
                    "fb_free_mib": float(int(memory.free) // BYTES_PER_MIB),
                }
        except _GpuLost:
            return  # the GPU's own read says so next round
        except nvml.NVMLError as exc:
            if api.is_not_supported(exc):
                state.mig_capable = False
            else:
                out.problems.append(f"GPU {state.index} MIG devices: {exc}")

    def unsupported(self, index: int) -> dict[str, str]:
        """Metrics GPU `index` leaves out and why (NVML said it does not support them); empty if unknown."""
        for state in self._gpus:
            if state.index == index:
                return dict(state.unsupported)
        return {}

    def close(self) -> None:
        """Shut NVML down if this collector started it; safe to call twice."""
        self._lib.close()

    # -- NVML ----------------------------------------------------------------------------------------
    @property
    def _nvml(self) -> Any:
        return self._lib.module

    def _open(self) -> Any:
        """The NVML object, imported and initialised on first use. Raises CollectorError if it cannot be."""
        try:
            return self._lib.open()
        except NvmlUnavailable as exc:
            raise CollectorError(str(exc)) from exc

    def _call(self, name: str, *args: Any) -> Any:
        """Call one NVML function, counted; a GPU-lost error becomes _GpuLost."""
        self.calls += 1
        nvml = self._nvml
        try:
            return getattr(nvml, name)(*args)
        except nvml.NVMLError as exc:
            if api.is_gpu_lost(exc):
                raise _GpuLost(f"{name}: {exc}") from exc
            raise

    def _field_values(self, handle: Any, requests: list[Request]) -> list[Any] | None:
        """nvmlDeviceGetFieldValues, or None where the library or GPU has no such call at all."""
        nvml = self._nvml
        if not hasattr(nvml, "nvmlDeviceGetFieldValues"):
            return None
        try:
            results = self._call("nvmlDeviceGetFieldValues", handle, requests)
        except nvml.NVMLError as exc:
            if api.is_not_supported(exc):
                return None
            raise
        for result in results:
            if int(result.nvmlReturn) == api.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost("nvmlDeviceGetFieldValues: GPU is lost")
        return list(results)

    # -- which GPUs --------------------------------------------------------------------------------
    def _refresh(self, count: int, out: Collected) -> None:
        """Take the GPU list again (first round, or the count changed): new handles, and a `gpu_lost`
        event for each GPU that is no longer listed."""
        before = self._gpus
        states = []
        for index in range(count):
            state = _GpuState(index=index)
            previous = before[index] if index < len(before) else None
            try:
                state.handle = self._call("nvmlDeviceGetHandleByIndex", index)
                state.uuid = as_text(self._call("nvmlDeviceGetUUID", state.handle))
            except _GpuLost as exc:
                if previous is not None:
                    state.uuid, state.lost = previous.uuid, previous.lost
                self._mark_lost(state, str(exc), out)
            except self._nvml.NVMLError as exc:
                state.handle = None  # tried again next round
                out.problems.append(f"GPU {index}: no handle: {exc}")
            states.append(state)
        listed = {state.uuid for state in states}
        for old in before:
            if old.uuid is not None and old.uuid not in listed:
                message = f"GPU {old.index} ({old.uuid}) is no longer listed: NVML sees {count} GPU(s)"
                out.events.append(self._event("gpu_lost", old.index, message))
        if self._listed and count != len(before):
            log.warning("NVML now lists %d GPU(s), not %d", count, len(before))
        self._gpus = states
        self._listed = True

    def _reacquire(self, state: _GpuState, out: Collected) -> bool:
        """Try to get back the handle of a GPU that was lost or unreachable; True once it answers again."""
        try:
            handle = self._call("nvmlDeviceGetHandleByIndex", state.index)
        except _GpuLost:
            return False  # still off the bus; said so already
        except self._nvml.NVMLError as exc:
            out.problems.append(f"GPU {state.index}: no handle: {exc}")
            return False
        if state.lost:
            log.warning("GPU %d answers again", state.index)
        state.handle, state.lost, state.discovered = handle, False, False
        return True

    def _mark_lost(self, state: _GpuState, reason: str, out: Collected) -> None:
        """Forget the handle; the first time, report the loss."""
        state.handle = None
        state.discovered = False
        if not state.lost:
            state.lost = True
            who = f"GPU {state.index}" + (f" ({state.uuid})" if state.uuid else "")
            out.events.append(self._event("gpu_lost", state.index, f"{who} is lost: {reason}"))

    def _event(self, kind: str, gpu: int, message: str) -> NodeEvent:
        return NodeEvent.model_validate({"ts": self._clock(), "kind": kind, "gpu": gpu, "message": message[:512]})

    # -- what a GPU supports -----------------------------------------------------------------------
    def _discover(self, state: _GpuState) -> None:
        """Learn which fields and calls this GPU answers. Raises NVMLError on a failure that is not
        "not supported" (the next round tries again) and _GpuLost."""
        handle = state.handle
        probe: list[Request] = [spec.field_id for spec in FIELDS]
        probe.append(api.FI_NVLINK_LINK_COUNT)
        results = self._field_values(handle, probe)
        refused: list[FieldSpec] = []
        links: int | None = None
        if results is None:
            refused = list(FIELDS)
        else:
            refused = [s for s, r in zip(FIELDS, results, strict=False) if int(r.nvmlReturn) in _REFUSED]
            count = api.field_value(results[-1])
            links = None if count is None else int(count)
        if links is None:
            links = self._probe_links(handle)
        kept = [s for s in FIELDS if s not in refused and (links > 0 or not s.metric.startswith("nvlink_"))]
        state.requests = [s.field_id for s in kept]
        state.meanings = [s.metric for s in kept]
        fallbacks = sorted({s.fallback for s in refused if s.fallback is not None})
        state.readers = [*ALWAYS_READ, *fallbacks]
        state.unsupported = {s.metric: "NVML field not supported" for s in refused if s.fallback is None}
        state.link_count = links
        if links:
            self._plan_link_states(state)
        else:
            state.unsupported.update(dict.fromkeys(NVLINK_METRICS, "no NVLink"))
        state.static = self._static(state)
        state.discovered = True

    def _probe_links(self, handle: Any) -> int:
        """How many NVLinks answer nvmlDeviceGetNvLinkState, where the link-count field is refused."""
        links = 0
        for link in range(api.NVLINK_PROBE_LINKS):
            try:
                self._call("nvmlDeviceGetNvLinkState", handle, link)
            except (self._nvml.NVMLError, AttributeError):
                break  # past the last link, or no NVLink at all (a PCIe card, a VM)
            links += 1
        return links

    def _plan_link_states(self, state: _GpuState) -> None:
        """Read link states as per-link fields in the same batch where NVML offers them, else one call per link."""
        scoped: list[Request] = [(api.FI_NVLINK_GET_STATE, link) for link in range(state.link_count)]
        results = self._field_values(state.handle, scoped)
        if results is not None and all(int(r.nvmlReturn) == api.NVML_SUCCESS for r in results):
            state.requests.extend(scoped)
            state.meanings.extend(range(state.link_count))
        else:
            state.readers.append("nvlink_state")

    def _static(self, state: _GpuState) -> dict[str, float]:
        """The GPU's maximum PCIe link, read once: it is a property of the GPU and its slot."""
        values: dict[str, float] = {}
        for metric, call in (
            ("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
            ("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
        ):
            try:
                values[metric] = float(self._call(call, state.handle))
            except (self._nvml.NVMLError, AttributeError) as exc:
                state.unsupported[metric] = f"{call}: {exc}"
        return values

    # -- one GPU's round ---------------------------------------------------------------------------
    def _read(self, state: _GpuState, problems: list[str]) -> dict[str, float]:
        """Every value this GPU answers this round. Raises _GpuLost."""
        values = dict(state.static)
        if state.requests:
            self._read_fields(state, values, problems)
        nvml = self._nvml
        for name in list(state.readers):
            try:
                values.update(self._readers[name](state))
            except (nvml.NVMLError, AttributeError) as exc:
                if isinstance(exc, AttributeError) or api.is_not_supported(exc):
                    # Never coming: stop asking, and remember why the values are missing.
                    state.readers.remove(name)
                    state.unsupported.update(dict.fromkeys(READER_METRICS[name], f"{name}: {exc}"))
                else:
                    problems.append(f"GPU {state.index}: {name}: {exc}")
        return values

    def _read_fields(self, state: _GpuState, values: dict[str, float], problems: list[str]) -> None:
        try:
            results = self._field_values(state.handle, state.requests)
        except self._nvml.NVMLError as exc:
            problems.append(f"GPU {state.index}: nvmlDeviceGetFieldValues: {exc}")
            return
        if results is None:
            state.discovered = False  # supported at discovery and not now: learn again next round
            return
        links_up = 0
        links_read = False
        members = api.VALUE_MEMBERS
        for meaning, result in zip(state.meanings, results, strict=False):
            # api.field_value, inlined: this loop runs ~30 times per GPU per round.
            if result.nvmlReturn != api.NVML_SUCCESS or not 0 <= result.valueType < len(members):
                continue
            value = float(getattr(result.value, members[result.valueType]))
            if isinstance(meaning, int):
                links_read = True
                links_up += value == api.NVML_FEATURE_ENABLED
            else:
                values[meaning] = values.get(meaning, 0.0) + value
        if links_read:
            values["nvlink_links_up"] = float(links_up)
            values["nvlink_links_total"] = float(state.link_count)

    # -- plain readers: one per NVML call (or small group of calls) --------------------------------
    def _utilization(self, state: _GpuState) -> dict[str, float]:
        rates = self._call("nvmlDeviceGetUtilizationRates", state.handle)
        return {"gpu_util": float(rates.gpu), "mem_copy_util": float(rates.memory)}

    def _memory(self, state: _GpuState) -> dict[str, float]:
        memory = self._call("nvmlDeviceGetMemoryInfo", state.handle)
        return {
            "fb_used_mib": float(int(memory.used) // BYTES_PER_MIB),
            "fb_free_mib": float(int(memory.free) // BYTES_PER_MIB),
        }

    def _temperature(self, state: _GpuState) -> dict[str, float]:
        return {"gpu_temp_c": float(self._call("nvmlDeviceGetTemperature", state.handle, api.NVML_TEMPERATURE_GPU))}

    def _power(self, state: _GpuState) -> dict[str, float]:
        return {"power_w": int(self._call("nvmlDeviceGetPowerUsage", state.handle)) / 1000}  # mW

    def _sm_clock(self, state: _GpuState) -> dict[str, float]:
        return {"sm_clock_mhz": float(self._call("nvmlDeviceGetClockInfo", state.handle, api.NVML_CLOCK_SM))}

    def _mem_clock(self, state: _GpuState) -> dict[str, float]:
        return {"mem_clock_mhz": float(self._call("nvmlDeviceGetClockInfo", state.handle, api.NVML_CLOCK_MEM))}

    def _clocks_event(self, state: _GpuState) -> dict[str, float]:
        # nvidia-ml-py 12.535 renamed the throttle reasons to clocks-event reasons; older ones lack the new name.
        name = "nvmlDeviceGetCurrentClocksEventReasons"
        if not hasattr(self._nvml, name):
            name = "nvmlDeviceGetCurrentClocksThrottleReasons"
        return {"clocks_event_reasons": float(self._call(name, state.handle))}

    def _pcie_link(self, state: _GpuState) -> dict[str, float]:
        return {
            "pcie_link_gen": float(self._call("nvmlDeviceGetCurrPcieLinkGeneration", state.handle)),
            "pcie_link_width": float(self._call("nvmlDeviceGetCurrPcieLinkWidth", state.handle)),
        }

    def _ecc(self, state: _GpuState) -> dict[str, float]:
        values = {}
        for metric, error_type, counter in (
            ("ecc_sbe_volatile", api.NVML_MEMORY_ERROR_TYPE_CORRECTED, api.NVML_VOLATILE_ECC),
            ("ecc_dbe_volatile", api.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, api.NVML_VOLATILE_ECC),
            ("ecc_sbe_aggregate", api.NVML_MEMORY_ERROR_TYPE_CORRECTED, api.NVML_AGGREGATE_ECC),
            ("ecc_dbe_aggregate", api.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, api.NVML_AGGREGATE_ECC),
        ):
            values[metric] = float(self._call("nvmlDeviceGetTotalEccErrors", state.handle, error_type, counter))
        return values

    def _retired_pages(self, state: _GpuState) -> dict[str, float]:
        sbe = self._call(
            "nvmlDeviceGetRetiredPages", state.handle, api.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        )
        dbe = self._call("nvmlDeviceGetRetiredPages", state.handle, api.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pending = self._call("nvmlDeviceGetRetiredPagesPendingStatus", state.handle)
        return {
            "retired_pages_sbe": float(len(sbe)),
            "retired_pages_dbe": float(len(dbe)),
            "retired_pages_pending": float(int(pending) == api.NVML_FEATURE_ENABLED),
        }

    def _remapped_rows(self, state: _GpuState) -> dict[str, float]:
        correctable, uncorrectable, pending, failure = self._call("nvmlDeviceGetRemappedRows", state.handle)
        return {
            "remapped_rows_correctable": float(correctable),
            "remapped_rows_uncorrectable": float(uncorrectable),
            "remapped_rows_pending": float(bool(pending)),
            "remapped_rows_failure": float(bool(failure)),
        }

    def _energy(self, state: _GpuState) -> dict[str, float]:
        return {"energy_mj": float(self._call("nvmlDeviceGetTotalEnergyConsumption", state.handle))}

    def _pcie_replay(self, state: _GpuState) -> dict[str, float]:
        return {"pcie_replay_counter": float(self._call("nvmlDeviceGetPcieReplayCounter", state.handle))}

    def _nvlink_state(self, state: _GpuState) -> dict[str, float]:
        up = sum(
            int(self._call("nvmlDeviceGetNvLinkState", state.handle, link)) == api.NVML_FEATURE_ENABLED
            for link in range(state.link_count)
        )
        return {"nvlink_links_up": float(up), "nvlink_links_total": float(state.link_count)}
