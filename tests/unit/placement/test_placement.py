"""The placement plan: contiguous, balanced, deterministic, and clear errors for bad maps."""

from __future__ import annotations

import pytest

from hooked.placement.plan import check_contiguous, default_units, devices_in_order, parse_size, plan_device_map


def _block_devices(plan: dict[str, str], n_layers: int) -> list[str]:
    return [plan[f"blocks.{i}"] for i in range(n_layers)]


def _is_contiguous(order: list[str]) -> bool:
    runs = [d for i, d in enumerate(order) if i == 0 or order[i - 1] != d]
    return len(runs) == len(set(runs))


@pytest.mark.parametrize("n_layers, n_devices", [(32, 3), (12, 2), (5, 5), (7, 4), (80, 8), (1, 1), (24, 7)])
def test_balanced_split_is_contiguous_balanced_and_uses_only_existing_devices(n_layers, n_devices):
    plan = plan_device_map(n_layers, n_devices)
    order = _block_devices(plan, n_layers)
    counts = [order.count(f"cuda:{i}") for i in range(n_devices)]
    assert set(plan.values()) == {f"cuda:{i}" for i in range(n_devices)}  # TL #837 put 32 layers on cuda:3 of 3
    assert max(counts) - min(counts) <= 1 and sum(counts) == n_layers
    assert counts == sorted(counts, reverse=True)  # the extra blocks go to the first devices
    assert _is_contiguous(order)
    assert plan["embed"] == "cuda:0" and plan["unembed"] == plan["ln_final"] == f"cuda:{n_devices - 1}"


def test_32_layers_on_3_devices_matches_the_hand_split():
    order = _block_devices(plan_device_map(32, 3), 32)
    assert order == ["cuda:0"] * 11 + ["cuda:1"] * 11 + ["cuda:2"] * 10


def test_plan_is_deterministic_and_ordered_like_the_forward_pass():
    sizes = {"embed": 50, **{f"blocks.{i}": 10 + (i % 3) for i in range(9)}, "ln_final": 1, "unembed": 50}
    plans = [plan_device_map(9, 3, sizes=sizes) for _ in range(3)]
    assert plans[0] == plans[1] == plans[2]
    assert list(plans[0]) == list(sizes)
    assert devices_in_order(plans[0]) == ["cuda:0", "cuda:1", "cuda:2"]


def test_uneven_block_sizes_minimise_the_largest_device_load():
    weights = [1, 1, 1, 1, 8, 1, 1, 1]
    sizes = {f"blocks.{i}": w for i, w in enumerate(weights)}
    plan = plan_device_map(8, 3, sizes=sizes)
    loads = {}
    for i, w in enumerate(weights):
        loads[plan[f"blocks.{i}"]] = loads.get(plan[f"blocks.{i}"], 0) + w
    assert max(loads.values()) == 8  # the 8 alone: the best any contiguous split can do
    assert _is_contiguous(_block_devices(plan, 8)) and len(loads) == 3


def test_max_memory_fills_in_order_then_cpu_then_disk():
    sizes = {"embed": 40, **{f"blocks.{i}": 100 for i in range(6)}, "ln_final": 1, "unembed": 40}
    plan = plan_device_map(6, max_memory={0: 250, 1: 250, "cpu": 200}, sizes=sizes)
    order = [plan[name] for name in sizes]
    # cuda:0 keeps room for the largest part (offloaded parts execute there): 250 - 100 leaves embed + 1 block
    assert order == ["cuda:0", "cuda:0", "cuda:1", "cuda:1", "cpu", "cpu", "disk", "disk", "disk"]
    assert _is_contiguous(order)


def test_max_memory_that_holds_everything_offloads_nothing():
    plan = plan_device_map(4, max_memory={"cpu": "1KiB"}, sizes={f"blocks.{i}": 100 for i in range(4)})
    assert set(plan.values()) == {"cpu"}


def test_cpu_only_budget_sends_the_rest_to_disk():
    sizes = {"embed": 10, **{f"blocks.{i}": 100 for i in range(4)}, "ln_final": 1, "unembed": 10}
    plan = plan_device_map(4, max_memory={"cpu": 215}, sizes=sizes)
    assert [plan[name] for name in sizes] == ["cpu", "cpu", "cpu", "disk", "disk", "disk", "disk"]


def test_parse_size_reads_hf_spellings():
    assert parse_size("2GiB") == 2 * 2**30 and parse_size("500MB") == 500 * 10**6 and parse_size(7) == 7
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_devices": 5}, "more than the model's 4 blocks"),
        ({"n_devices": 0}, "n_devices must be >= 1"),
        ({}, "exactly one of"),
        ({"n_devices": 2, "max_memory": {0: 1}}, "exactly one of"),
        ({"n_devices": 2, "devices": ["cuda:0"]}, "device names"),
        ({"n_devices": 2, "sizes": {"blocks.1": 1, "blocks.0": 1, "blocks.2": 1, "blocks.3": 1}}, "in order"),
        ({"n_devices": 2, "sizes": {**default_units(4), "blocks.2": -1}}, ">= 0 bytes"),
    ],
)
def test_bad_requests_name_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_device_map(4, **kwargs)


def test_user_maps_must_place_every_block_in_one_run_per_device():
    good = {"embed": "cuda:0", "blocks.0": "cuda:0", "blocks.1": "cuda:1", "blocks.2": "cpu", "blocks.3": "disk"}
    check_contiguous(good, 4)
    with pytest.raises(ValueError, match="places no device for \\['blocks.3'\\]"):
        check_contiguous({k: v for k, v in good.items() if k != "blocks.3"}, 4)
    with pytest.raises(ValueError, match="separate runs"):
        check_contiguous({"blocks.0": "cuda:0", "blocks.1": "cuda:1", "blocks.2": "cuda:0"}, 3)
