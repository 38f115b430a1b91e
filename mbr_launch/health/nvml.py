"""NVML, read in one place: this host's GPUs, their health, their memory and the processes that hold it.

Plain frozen values come out, so tests fake NVML at the ``Session`` protocol. nvidia-ml-py is optional:
without it, or without a driver, ``Nvml.open`` returns why.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, TypeVar

MB = 1024 * 1024
MAX_PROCESSES = 256  # per GPU: a longer list is cut (NVML's own answer is unbounded)

_T = TypeVar("_T")


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str = ""
    ecc_uncorrected: int | None = None  # volatile (since driver load) uncorrectable ECC errors
    retired_pending: bool | None = None  # page retirement waiting for a GPU reset
    remap_pending: bool | None = None  # row remapping waiting for a GPU reset
    remap_failure: bool | None = None  # row remapping failed: the GPU needs replacing
    recovery_action: str | None = None  # NVML's recommended recovery action; "none" when healthy


@dataclass(frozen=True)
class NvmlView:
    available: bool
    reason: str = ""  # why NVML is unavailable
    driver: str = ""
    gpus: tuple[GpuInfo, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class GpuProcess:
    pid: int  # as NVML gives it: in a container often the host's, which /proc here may not show
    used_mb: float | None  # None: NVML does not say (some drivers and virtual GPUs)


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory at one moment. ``processes`` None: NVML cannot list them here; () lists none."""

    device: str  # an index or a UUID, as CUDA_VISIBLE_DEVICES names it
    used_mb: float | None  # None: this GPU could not be read
    total_mb: float | None = None
    processes: tuple[GpuProcess, ...] | None = None

    @property
    def free_mb(self) -> float | None:
        return None if self.used_mb is None or self.total_mb is None else self.total_mb - self.used_mb


class Session(Protocol):
    def memory(self, device: str) -> GpuMemory: ...
    def close(self) -> None: ...


class Nvml:
    """One NVML session. Every query answers rather than raises: a broken GPU must not stop the launcher."""

    def __init__(self, nv: Any) -> None:
        self._nv = nv

    @classmethod
    def open(cls) -> "Nvml | str":
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the deprecated "pynvml" shim NVRx pulls in warns on import
                import pynvml  # noqa: PLC0415 - optional: only where a GPU is asked about
        except ImportError:
            return "nvidia-ml-py is not installed"
        try:
            pynvml.nvmlInit()
        except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no GPU driver here
            return f"NVML init failed ({err}); no NVIDIA driver on this machine"
        return cls(pynvml)

    def __enter__(self) -> "Nvml":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception:
            pass

    def _handle(self, device: str) -> Any:
        nv = self._nv
        return nv.nvmlDeviceGetHandleByIndex(int(device)) if device.isdigit() else nv.nvmlDeviceGetHandleByUUID(device)

    def memory(self, device: str) -> GpuMemory:
        nv = self._nv
        try:
            handle = self._handle(device)
            v2 = getattr(nv, "nvmlMemory_v2", None)  # v2: memory the driver reserves is not "used"
            info = nv.nvmlDeviceGetMemoryInfo(handle, version=v2) if v2 is not None else nv.nvmlDeviceGetMemoryInfo(handle)
        except Exception:
            return GpuMemory(device, None)
        return GpuMemory(device, float(info.used) / MB, float(info.total) / MB, self._processes(handle))

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...] | None:
        try:
            found = self._nv.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:  # NOT_SUPPORTED (some virtual GPUs, MIG without the rights): no per-process view
            return None
        out: dict[int, GpuProcess] = {}
        for p in list(found)[:MAX_PROCESSES]:
            pid, used = getattr(p, "pid", None), getattr(p, "usedGpuMemory", None)
            if not isinstance(pid, int) or pid < 0:
                continue
            out[pid] = GpuProcess(pid, float(used) / MB if isinstance(used, int) and used >= 0 else None)
        return tuple(out.values())

    def driver(self) -> str:
        return _s(self._nv.nvmlSystemGetDriverVersion())

    def count(self) -> int:
        return int(self._nv.nvmlDeviceGetCount())

    def info(self, index: int) -> GpuInfo:
        nv = self._nv
        h = nv.nvmlDeviceGetHandleByIndex(index)

        def opt(fn, *args):  # type: ignore[no-untyped-def]
            # Each query is optional: consumer GPUs lack ECC, older drivers lack row remapping.
            try:
                return fn(h, *args)
            except Exception:
                return None

        ecc = opt(nv.nvmlDeviceGetTotalEccErrors, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        retired = opt(nv.nvmlDeviceGetRetiredPagesPendingStatus)
        remap = opt(nv.nvmlDeviceGetRemappedRows)  # (corr, unc, isPending, failureOccurred)
        recovery = None
        field_id = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field_id is not None:
            values = opt(nv.nvmlDeviceGetFieldValues, [field_id])
            if values and values[0].nvmlReturn == 0:
                code = int(values[0].value.uiVal)
                recovery = _RECOVERY_NAMES.get(code, f"action {code}")
        return GpuInfo(
            index=index, name=_s(nv.nvmlDeviceGetName(h)), uuid=_s(opt(nv.nvmlDeviceGetUUID) or ""),
            ecc_uncorrected=None if ecc is None else int(ecc),
            retired_pending=None if retired is None else bool(retired),
            remap_pending=None if remap is None else bool(remap[2]),
            remap_failure=None if remap is None else bool(remap[3]),
            recovery_action=recovery,
        )


# NVML's nvmlGpuRecoveryAction_t values, named as the fix text should say them.
_RECOVERY_NAMES = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset"}


def once(query: Callable[[Nvml], _T]) -> _T | str:
    session = Nvml.open()
    if isinstance(session, str):
        return session
    with session:
        return query(session)


def view() -> NvmlView:
    def read(session: Nvml) -> NvmlView:
        try:
            return NvmlView(available=True, driver=session.driver(),
                            gpus=tuple(session.info(i) for i in range(session.count())))
        except Exception as exc:
            return NvmlView(available=False, reason=f"NVML query failed: {exc}")

    answer = once(read)
    return NvmlView(available=False, reason=answer) if isinstance(answer, str) else answer


def memories(devices: Sequence[str]) -> list[GpuMemory] | str:
    return once(lambda session: [session.memory(d) for d in devices])


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
