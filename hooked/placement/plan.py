"""Where each part of a model goes: a pure, deterministic, contiguous device plan.

`plan_device_map` maps the model's top-level parts (`embed`, `blocks.0` ... `blocks.{n-1}`,
`ln_final`, `unembed`, ...) to devices, in order, never splitting a block. It avoids the two
known TransformerLens placement bugs: `n_layers // n_devices` overshooting onto a device that
does not exist (#837), and greedy free-memory placement that scatters neighbouring layers (#907).
Devices are strings: `"cuda:0"`, `"cpu"`, and `"disk"` (HF's name for offloading to files).
"""

from __future__ import annotations

from collections.abc import Mapping

OFFLOAD_DEVICES = ("cpu", "disk")


def default_units(n_layers: int) -> dict[str, int]:
    """The parts of a model with `n_layers` blocks in forward order, each block weighing 1 and the rest 0."""
    return {"embed": 0, **{f"blocks.{i}": 1 for i in range(n_layers)}, "ln_final": 0, "unembed": 0}


def plan_device_map(
    n_layers: int,
    n_devices: int | None = None,
    *,
    max_memory: Mapping[str | int, int | str] | None = None,
    sizes: Mapping[str, int] | None = None,
    devices: list[str] | None = None,
) -> dict[str, str]:
    """A contiguous map `{part name: device}` over the parts in `sizes` (forward order).

    Arguments:
        n_layers: number of blocks; checked against the `blocks.i` entries of `sizes`.
        n_devices: split over `cuda:0` ... `cuda:{n_devices-1}` (or `devices`), balanced:
            with default sizes block counts differ by at most one, earlier devices taking the
            extra blocks; with byte `sizes` the largest device load is as small as possible.
        max_memory: HF's meaning, `{device: bytes or "200MB"}` (ints are CUDA indices, `"cpu"` is RAM).
            Accelerators are filled in order, then `"cpu"`, then the rest goes to `"disk"`.
        sizes: bytes per part, in forward order (default: `default_units(n_layers)`).
        devices: device names for `n_devices` (default `cuda:i`).
    """
    units = dict(default_units(n_layers) if sizes is None else sizes)
    _check_units(units, n_layers)
    if (n_devices is None) == (max_memory is None):
        raise ValueError("plan_device_map needs exactly one of n_devices=N or max_memory={device: bytes}")
    if n_devices is not None:
        devices = devices if devices is not None else [f"cuda:{i}" for i in range(n_devices)]
        return _balanced(units, _checked_devices(n_devices, devices, n_layers))
    assert max_memory is not None  # exactly one of n_devices / max_memory is set (checked above)
    return _fill(units, _memory_budgets(max_memory))


def _check_units(units: Mapping[str, int], n_layers: int) -> None:
    blocks = [name for name in units if name.startswith("blocks.")]
    expected = [f"blocks.{i}" for i in range(n_layers)]
    if blocks != expected:
        raise ValueError(f"sizes must list blocks.0 ... blocks.{n_layers - 1} in order, got {blocks[:4]}...")
    negative = [name for name, size in units.items() if size < 0]
    if negative:
        raise ValueError(f"sizes must be >= 0 bytes; negative for {negative}")


def _checked_devices(n_devices: int, devices: list[str], n_layers: int) -> list[str]:
    if n_devices < 1:
        raise ValueError(f"n_devices must be >= 1, got {n_devices}")
    if len(devices) != n_devices:
        raise ValueError(f"n_devices={n_devices} but {len(devices)} device names were given: {devices}")
    if n_devices > n_layers:
        raise ValueError(
            f"n_devices={n_devices} is more than the model's {n_layers} blocks: a device would hold no block. "
            f"Use n_devices <= {n_layers}."
        )
    return list(devices)


def _balanced(units: dict[str, int], devices: list[str]) -> dict[str, str]:
    """Blocks split contiguously over `devices`; embed goes with the first block, the rest with the last."""
    blocks = [name for name in units if name.startswith("blocks.")]
    weights = [units[name] for name in blocks]
    if all(w == weights[0] for w in weights):  # equal blocks: counts differ by at most one
        base, extra = divmod(len(blocks), len(devices))
        counts = [base + (i < extra) for i in range(len(devices))]
    else:
        counts = _min_max_partition(weights, len(devices))
    placement, start = {}, 0
    for device, count in zip(devices, counts, strict=True):
        placement.update({name: device for name in blocks[start : start + count]})
        start += count
    first, last = devices[0], devices[-1]
    before = True
    out = {}
    for name in units:
        if name.startswith("blocks."):
            before = False
            out[name] = placement[name]
        else:
            out[name] = first if before else last
    return out


def _min_max_partition(weights: list[int], parts: int) -> list[int]:
    """Counts of a contiguous split of `weights` into `parts` non-empty runs whose largest sum is smallest."""
    lo, hi = max(weights), sum(weights)
    while lo < hi:  # binary search on the largest run's sum
        mid = (lo + hi) // 2
        if _runs_needed(weights, mid, parts) <= parts:
            hi = mid
        else:
            lo = mid + 1
    counts, i = [], 0
    for part in range(parts):
        left_parts = parts - part - 1
        total, count = 0, 0
        while i < len(weights) and total + weights[i] <= lo and len(weights) - i > left_parts:
            total += weights[i]
            count += 1
            i += 1
        counts.append(count)
    counts[-1] += len(weights) - i  # never left over when `lo` is feasible; kept so every block is placed
    return counts


def _runs_needed(weights: list[int], cap: int, parts: int) -> int:
    runs, total = 1, 0
    for w in weights:
        if total + w > cap:
            runs, total = runs + 1, 0
        total += w
    return runs


def _memory_budgets(max_memory: Mapping[str | int, int | str]) -> list[tuple[str, float]]:
    """`[(device, bytes)]`: accelerators in the given order, then cpu, then disk (unbounded)."""
    budgets = []
    for key, value in max_memory.items():
        device = f"cuda:{key}" if isinstance(key, int) else str(key)
        if device == "disk":
            continue
        budgets.append((device, float(parse_size(value))))
    budgets.sort(key=lambda item: item[0] in OFFLOAD_DEVICES)  # stable: accelerators first, cpu after
    return budgets + [("disk", float("inf"))]


def _fill(units: dict[str, int], budgets: list[tuple[str, float]]) -> dict[str, str]:
    """Fill devices in order; a part that does not fit moves everything after it to the next device."""
    names, out, index = list(units), {}, 0
    main_reserve = max(units.values()) if sum(units.values()) > budgets[0][1] else 0  # offloaded parts run on main
    for rank, (device, budget) in enumerate(budgets):
        room = budget - (main_reserve if rank == 0 and device not in OFFLOAD_DEVICES else 0)
        while index < len(names) and units[names[index]] <= room:
            room -= units[names[index]]
            out[names[index]] = device
            index += 1
    return out


def parse_size(value: int | str) -> int:
    """Bytes from an int or a string such as `"2GiB"`, `"500MB"` (HF's max_memory spelling)."""
    if isinstance(value, int):
        return value
    text = str(value).strip().upper()
    for suffix, factor in (("GIB", 2**30), ("MIB", 2**20), ("KIB", 2**10), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"max_memory value {value!r} is not a size: use bytes or a string like '2GiB'") from None


def devices_in_order(device_map: Mapping[str, str]) -> list[str]:
    """The distinct devices of a map, in the order the forward pass visits them."""
    seen: list[str] = []
    for device in device_map.values():
        if device not in seen:
            seen.append(device)
    return seen


def check_contiguous(device_map: Mapping[str, str], n_layers: int) -> None:
    """Every block is placed, and no device is left and later returned to (outside cpu/disk offload)."""
    missing = [f"blocks.{i}" for i in range(n_layers) if f"blocks.{i}" not in device_map]
    if missing:
        raise ValueError(f"device_map places no device for {missing[:4]}: give every block a device")
    order = [device_map[f"blocks.{i}"] for i in range(n_layers)]
    runs = [d for i, d in enumerate(order) if i == 0 or order[i - 1] != d]
    repeated = sorted({d for d in runs if runs.count(d) > 1 and d not in OFFLOAD_DEVICES})
    if repeated:
        raise ValueError(
            f"device_map sends blocks to {repeated} in separate runs: the residual would cross devices back and forth. "
            "Give each device one contiguous run of blocks."
        )
