"""Planning: cells from the registry's tuple kinds, dropped pairs with reasons, one budget for all."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cli import main
from bench.commands.plan import format_plan
from bench.plan import Cell, plan
from bench.plan.cost import TRUNK_COSTS
from bench.protocol import load_protocol, parse_protocol

REPO = Path(__file__).resolve().parents[2]

GRID = """\
name: grid
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 30
  test_classes: 10
  image_size: 28
  validation: {folds: 3, use: 2}
model: {trunk: conv4, embedding_dim: 16, normalize: true}
training: {optimizer: adam, lr: 1.0e-3, P: 8, K: 4, iterations: 100}
evaluation: {metrics: [map_at_r], primary: map_at_r}
tuning: {trials: 3}
final: {seeds: [0, 1, 2, 3]}
grid:
  losses:
    - {name: contrastive}
    - {name: npair}
    - {name: pml:proxy_anchor}
    - {name: quadruplet}
    - {name: quadruplet, label: quadruplet-learned, params: {learned_metric: true}}
  miners: [{name: none}, {name: batch_hard}, {name: pml:multi_similarity}, {name: margohnm}]
"""


@pytest.fixture(scope="module")
def grid_plan():
    return plan(parse_protocol(GRID, "grid.yaml"))


def test_cells_keep_sensible_pairs_only(grid_plan):
    ids = [c.id for c in grid_plan.cells]
    assert ids == [
        "contrastive+none",
        "contrastive+batch_hard",
        "contrastive+pml-multi_similarity",
        "npair+none",
        "npair+pml-multi_similarity",
        "pml-proxy_anchor+none",
        "quadruplet+none",
        "quadruplet+margohnm",
        "quadruplet-learned+none",
        "quadruplet-learned+margohnm",
    ]
    learned = grid_plan.cell("quadruplet-learned+margohnm")
    assert learned.loss == "quadruplet" and learned.loss_params["learned_metric"] is True
    assert learned.loss_params["normalize"] is True  # the protocol's normalisation reaches every method
    # MargOHNM supplies alpha1 and alpha2 (searching them is dead, issue 11): its own weights are searched instead
    assert set(learned.search_space) == {"miner.w1", "miner.w2"}
    assert set(grid_plan.cell("quadruplet-learned+none").search_space) == {"loss.alpha1", "loss.alpha2"}


def test_dropped_pairs_say_why(grid_plan):
    reasons = {d.cell: d.reason for d in grid_plan.dropped}
    assert "proxy loss" in reasons["pml-proxy_anchor+batch_hard"]
    assert "proxy loss" in reasons["pml-proxy_anchor+pml-multi_similarity"]
    assert "one positive pair per class" in reasons["npair+batch_hard"]
    assert "quadruplet-capable miner" in reasons["quadruplet+batch_hard"]
    assert "only a quadruplet loss consumes" in reasons["contrastive+margohnm"]
    assert len(grid_plan.cells) + len(grid_plan.dropped) == 5 * 4


def test_every_cell_has_the_same_budget(grid_plan):
    b = grid_plan.budget
    assert (b.trials, b.folds, b.iterations, b.batch_size, b.seeds) == (3, 2, 100, 32, 4)
    assert b.total_iterations == 3 * 2 * 100 + 4 * 100
    assert grid_plan.total_iterations == len(grid_plan.cells) * b.total_iterations
    text = format_plan(grid_plan)
    table = text.split("\nsearch spaces")[0]  # the cells table; the search spaces name the cells again
    rows = [
        line
        for line in table.splitlines()
        if line.startswith("  ") and "+" in line.split()[0] and line.split()[0] in {c.id for c in grid_plan.cells}
    ]
    assert len(rows) == len(grid_plan.cells)
    assert {tuple(r.split()[1:7]) for r in rows} == {("3", "2", "100", "4", "1,000", "32,000")}
    assert "budget, the same for every cell: 3 trials x 2 fold(s) x 100 iterations + 4 seeds" in text


def test_time_estimate_uses_the_trunk_costs(grid_plan):
    conv4 = TRUNK_COSTS["conv4"]
    steps = grid_plan.total_iterations
    low = steps * conv4.step_s[0] * 32 / 128
    high = steps * conv4.step_s[1] * 32 / 128
    e = grid_plan.estimate
    assert low < e.low_s < e.high_s and e.high_s > high
    assert e.high_s < 3 * high  # evaluations and records add, but do not dominate here
    mlp = plan(parse_protocol(GRID.replace("trunk: conv4", "trunk: mlp")))
    assert mlp.estimate.high_s < e.low_s / 2  # an MLP step is ~30x cheaper; fixed costs remain


def test_quick_protocol_fits_in_two_hours_of_one_worker():
    p = plan(load_protocol(REPO / "protocols" / "omniglot-quick.yaml"))
    assert p.estimate.high_s < 120 * 60  # its two learned-metric cells rank 6 test sets by g: ~25 min of it
    ids = {c.id for c in p.cells}
    assert {
        "contrastive+none",
        "triplet+batch_all",
        "triplet+batch_hard",
        "triplet+semihard",
        "triplet+semihard-facenet",
        "triplet-fixed+hard",
        "quadruplet+margohnm",
        "quadruplet-learned+margohnm-w1",
        "lifted_structure+none",
        "npair+none",
        "infonce+none",
        "pml-multi_similarity+pml-multi_similarity",
    } <= ids


def test_plan_command(capsys):
    assert main(["plan", str(REPO / "protocols" / "omniglot-full.yaml")]) == 0
    out = capsys.readouterr().out
    assert "budget, the same for every cell" in out and "estimated time on this machine" in out


def test_a_method_added_to_the_registry_is_planned_from_its_fields(monkeypatch):
    """Nothing is known by name: a new dataset-level miner that supplies a loss parameter is planned, estimated
    and validated from its entry alone, like MargOHNM and the offline miner."""
    import dataclasses

    from bench import registry
    from bench.protocol import ProtocolError
    from bench.registry import _builtin

    base = registry.get("miner", "margohnm")
    entry = dataclasses.replace(
        base, name="my_margins", supplies=("alpha1",), scope="dataset", embeds_per_step=lambda p, n: 1000.0
    )
    monkeypatch.setattr(_builtin, "ENTRIES", (*_builtin.ENTRIES, entry))
    monkeypatch.setitem(_builtin.BY_KEY, ("miner", "my_margins"), entry)
    text = GRID.replace("{name: margohnm}]", "{name: margohnm}, {name: my_margins}]")
    p = plan(parse_protocol(text, "grid.yaml"))
    mine, theirs = p.cell("quadruplet+my_margins"), p.cell("quadruplet+margohnm")
    assert set(mine.search_space) == {"loss.alpha2", "miner.w1", "miner.w2"}
    assert set(theirs.search_space) == {"miner.w1", "miner.w2"}
    assert mine.dataset_level and not theirs.dataset_level
    assert p.estimates[mine.id].low_s > p.estimates[theirs.id].low_s  # its embedding cost is counted
    assert "contrastive+my_margins" in {d.cell for d in p.dropped}  # quadruplets: only for a quadruplet loss
    searched = text.replace(
        "    - {name: quadruplet}\n",
        "    - name: quadruplet\n      miners: [my_margins]\n"
        "      search_space: {alpha1: {type: float, low: 0.5, high: 1.5}}\n",
    )
    with pytest.raises(ProtocolError) as info:
        parse_protocol(searched, "grid.yaml")
    assert info.value.problems == [
        "grid.yaml:21: grid.losses[3].search_space.alpha1: 'alpha1' is supplied by the "
        "miner's tuples (my_margins) in every cell of quadruplet: searching it has no "
        "effect; remove it from search_space"
    ]
    assert parse_protocol(searched.replace("alpha1: {", "alpha2: {"), "grid.yaml").name == "grid"


def test_measured_step_time_and_budget_check_enter_the_estimate(grid_plan):
    """--step-ms replaces the cost table (a flat step time: no range); a budget check at 2x adds 2x the finals' steps."""
    protocol = grid_plan.protocol
    slow, fast = plan(protocol, step_s=0.2), plan(protocol, step_s=0.1)
    assert slow.estimate.low_s == slow.estimate.high_s
    b = grid_plan.budget
    steps = b.total_iterations * len(grid_plan.cells)
    assert slow.estimate.mid_s - fast.estimate.mid_s == pytest.approx(0.1 * steps, rel=1e-9)
    checked = plan(protocol, step_s=0.1, check_multiple=2)
    extra_steps = 2 * b.final_iterations * len(grid_plan.cells)
    assert checked.estimate.mid_s - fast.estimate.mid_s > 0.1 * extra_steps
    assert "with a budget check at 2x the finals" in format_plan(checked)
    assert "--step-ms" in format_plan(checked)


def test_a_loader_slower_than_the_trunk_bounds_each_step(grid_plan, tmp_path, capsys):
    """--loader-rate on an accelerator: a step takes the longer of the trunk's step and a batch's loading
    time, and the plan says which bounds; a loader faster than the trunk changes nothing. On the CPU the
    loader's workers decode on the trunk's cores: a step takes both, and each evaluated image its decoding."""
    protocol = grid_plan.protocol
    cuda = parse_protocol(GRID.replace("iterations: 100}", "iterations: 100, device: cuda}"))
    batch = grid_plan.budget.batch_size
    steps = grid_plan.budget.total_iterations * len(grid_plan.cells)
    base = plan(cuda, step_s=0.1)
    assert plan(cuda, step_s=0.1, loader_rate=batch / 0.05).estimate.mid_s == base.estimate.mid_s
    slow = plan(cuda, step_s=0.1, loader_rate=batch / 0.3)  # 0.3 s to load a batch, 0.1 s to train on it
    assert slow.estimate.mid_s - base.estimate.mid_s == pytest.approx(0.2 * steps, rel=1e-9)
    text = format_plan(slow)
    assert f"note: loader: {batch / 0.3:g} images/s feeds a batch of {batch} in 300 ms" in text
    assert "the loader bounds the training steps" in text and "(--loader-rate)" in text
    assert "the trunk bounds" in format_plan(plan(cuda, step_s=0.1, loader_rate=batch / 0.05))
    cpu_base, cpu = plan(protocol, step_s=0.1), plan(protocol, step_s=0.1, loader_rate=batch / 0.05)
    assert cpu.estimate.mid_s - cpu_base.estimate.mid_s > 0.05 * steps  # the loading added, and decoding
    assert "on the CPU a step takes both" in format_plan(cpu)
    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    assert main(["plan", str(path), "--no-measure", "--loader-rate", "nan"]) != 0
    assert "expected a number, got nan" in capsys.readouterr().err


def test_timed_methods_enter_each_cells_estimate(grid_plan):
    """--time-methods times every cell's loss and miner and adds them to that cell's steps only; a method
    slower than the trunk's step is named."""
    from bench.plan.method_cost import time_cell

    protocol = grid_plan.protocol
    base, timed = plan(protocol, step_s=1e-6), plan(protocol, step_s=1e-6, time_methods=True)
    assert set(timed.method_s) == {c.id for c in timed.cells if not c.dataset_level}
    steps = grid_plan.budget.total_iterations
    for c in timed.cells:
        added = timed.estimates[c.id].mid_s - base.estimates[c.id].mid_s
        assert added == pytest.approx(timed.method_s[c.id] * steps, rel=1e-9) and added > 0
    text = format_plan(timed)
    assert "loss+miner ms" in text and "note: quadruplet+margohnm's loss and miner take" in text
    # at 32 x 4, a quadruplet miner listing every violating quadruplet (a cap above their number) costs
    # many times the closed form that training uses: the figure follows the method as built
    wide = parse_protocol(GRID.replace("train_classes: 30", "train_classes: 40").replace("P: 8", "P: 32"), "w.yaml")
    cell = plan(wide).cell("quadruplet+margohnm")
    listed = Cell(**{**cell.__dict__, "miner_params": {**cell.miner_params, "max_tuples": 10**9}})
    assert time_cell(wide, listed) > 3 * time_cell(wide, cell)


def test_plan_time_methods_command(capsys):
    import json

    assert main(["plan", str(REPO / "protocols" / "omniglot-smoke.yaml"), "--time-methods", "--format", "json"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out) if r["status"] == "planned"]
    assert rows and all(r["method_ms"] is None or r["method_ms"] > 0 for r in rows)
    assert sum(r["method_ms"] is not None for r in rows) >= len(rows) - 2  # dataset-level miners are not timed


def test_a_cuda_protocol_is_estimated_in_gpu_hours(grid_plan):
    from bench.plan.cost import GPU_TRUNK_COSTS

    cuda = parse_protocol(GRID.replace("iterations: 100}", "iterations: 100, device: cuda}"))
    assert cuda.doc["training"]["device"] == "cuda"
    p = plan(cuda)
    text = format_plan(p)
    assert "GPU-hours on one GPU" in text and "measured on an H100" in text
    assert p.cost == GPU_TRUNK_COSTS["conv4"]
    assert p.estimate.mid_s < grid_plan.estimate.mid_s / 2  # an H100 step is ~10x a CPU's; fixed costs remain


def test_query_gallery_sides_count_the_gallery():
    from bench.plan.cost import DATASET_SIZES, dataset_size

    classes, images = dataset_size({"query": "market1501:query", "gallery": "market1501:gallery"}, None)
    assert classes == DATASET_SIZES["market1501:query"][0]
    assert images == pytest.approx(19732)


NO_AMX = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
AMX = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"


def test_a_bf16_estimate_says_the_table_is_fp32_and_whether_this_cpu_has_amx():
    """The CPU step costs are fp32's; bf16 is 2.1-2.5x faster with AMX, 1.2x without: plan says which, unless
    the step was measured (--step-ms)."""
    from bench.commands.plan import lacks_amx

    assert lacks_amx(NO_AMX) and not lacks_amx(AMX)
    assert not lacks_amx("Features\t: fp asimd\n")  # no x86 flags line: nothing known
    bf16 = plan(parse_protocol(GRID.replace("iterations: 100}", "iterations: 100, precision: bf16}"), "bf16.yaml"))
    assert bf16.protocol.doc["training"]["precision"] == "bf16"
    assert "this CPU has no AMX" in format_plan(bf16, cpuinfo=NO_AMX)
    assert "this CPU has AMX" in format_plan(bf16, cpuinfo=AMX)
    assert "step time above is fp32's" not in format_plan(plan(bf16.protocol, step_s=0.13), cpuinfo=NO_AMX)
    fp32 = parse_protocol(GRID)
    assert fp32.doc["training"]["precision"] == "fp32"
    assert "step time above is fp32's" not in format_plan(plan(fp32), cpuinfo=NO_AMX)


def test_the_trunk_is_timed_here_at_the_protocols_shape(grid_plan):
    """plan(measure=True) times the protocol's trunk on this machine at its batch and image size (no scaling),
    on the threads asked for; --step-ms overrides it; the estimate's steps follow the timed step."""
    import torch

    from bench.evaluation import evaluation_batch
    from bench.plan.cost import STEP_FIXED_S
    from bench.plan.measure import channels_of, measure_trunk

    protocol = grid_plan.protocol
    assert channels_of(protocol.spec.data) == 1  # Omniglot is stored grey
    m = measure_trunk(protocol, budget_s=0.5, threads=1, embed_batch=64)
    assert m.step_s > 0 and 1 <= m.steps <= 7 and m.threads == 1 and m.device == "cpu"
    assert m.embed_s > 0 and 16 <= m.embed_batch <= 64
    # timed as evaluation embeds (`bench.evaluation.embed`): on the CPU in its capped batches, whatever the
    # batch asked for (the trunk's bare forward at 512 made plan overestimate Conv-4's scoring ~4x)
    wide = measure_trunk(protocol, budget_s=2.0, threads=1, embed_batch=512)
    assert wide.embed_batch == evaluation_batch(torch.zeros(1, 1, 28, 28), 512, torch.device("cpu")) == 64
    # the embedding alone (an evaluation's estimate): no step timed, the embedding timed as above
    alone = measure_trunk(protocol, budget_s=0.5, threads=1, embed_batch=64, train_steps=False)
    assert alone.steps == 0 and alone.step_s != alone.step_s  # NaN: nothing to stand for a step's time
    assert alone.embed_s > 0 and 16 <= alone.embed_batch <= 64 and alone.slowdown >= 1.0  # the budget sizes it
    timed = plan(protocol, measure=True, threads=1)
    cost = timed.cost
    assert cost.threads == 1 and cost.ref_batch == 32 and cost.ref_pixels == 28 * 28 and cost.ref_hw == (28, 28)
    assert cost.step_s[0] == cost.step_s[1] and "measured on this machine" in cost.source
    flat = plan(protocol, step_s=cost.step_s[0])  # the same step given by hand: the same steps term
    steps = grid_plan.total_iterations
    stretched = steps * STEP_FIXED_S * (cost.slowdown - 1)  # a busy machine's slowdown stretches the untimed figures
    assert timed.estimate.mid_s - timed.sweep_s == pytest.approx(
        flat.estimate.mid_s - flat.sweep_s + stretched, abs=1e-6 * steps + 60 * cost.slowdown
    )  # embedding differs, a little
    assert plan(protocol, step_s=0.1, measure=True).cost.source == "--step-ms"  # given by hand: not timed
    text = format_plan(timed)
    assert "measured on this machine: median of" in text and "1 thread(s)" in text
    assert "assumes: the trunk's training step (fp32" in text and "`run --threads 1`" in text
    assert "not timed: the loss and miner" in text and "step time above is fp32's" not in text
    assert "built-in per-trunk table" in format_plan(grid_plan)


def test_a_sweeps_fixed_costs_are_counted_once():
    from bench.plan.cost import SWEEP_FIXED_S

    p = plan(parse_protocol(GRID), step_s=0.01)
    assert p.sweep_s > SWEEP_FIXED_S  # start-up and stores, plus the floor's evaluations
    assert p.estimate.mid_s == pytest.approx(p.sweep_s + sum(e.mid_s for e in p.estimates.values()))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_a_cuda_protocol_without_cuda_keeps_the_table_and_says_so():
    from bench.plan.cost import GPU_TRUNK_COSTS

    cuda = parse_protocol(GRID.replace("iterations: 100}", "iterations: 100, device: cuda}"))
    p = plan(cuda, measure=True)
    assert p.cost == GPU_TRUNK_COSTS["conv4"] and "no CUDA device" in p.cost_note
    assert "not measured here: the protocol trains on 'cuda' but no CUDA device" in format_plan(p)


def test_plan_command_measures_by_default_and_shows_search_spaces(capsys):
    import csv
    import io
    import json

    smoke = str(REPO / "protocols" / "omniglot-smoke.yaml")
    assert main(["plan", smoke, "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "measured on this machine: median of" in out and "assumes:" in out
    section = out.split("search spaces")[1].split("\n\n")[0]
    assert "  triplet+semihard            loss.margin float [0.01, 1] log; miner.margin float [0.01, 1] log" in section
    assert "  quadruplet+margohnm         miner.w1 float [0.6, 2]; miner.w2 float [0.1, 0.5]" in section
    assert "  triplet-fixed+hard          nothing (fixed parameters only)" in section
    assert main(["plan", smoke, "--no-measure"]) == 0
    assert "built-in per-trunk table" in capsys.readouterr().out
    assert main(["plan", smoke, "--no-measure", "--format", "json"]) == 0
    rows = {r["cell"]: r for r in json.loads(capsys.readouterr().out) if r["status"] == "planned"}
    assert rows["quadruplet+none"]["search_space"] == {
        "loss.alpha1": {"type": "float", "low": 0.6, "high": 1.5, "log": False},
        "loss.alpha2": {"type": "float", "low": 0.1, "high": 0.5, "log": False},
    }
    assert rows["triplet-fixed+hard"]["search_space"] == {}
    assert main(["plan", smoke, "--no-measure", "--format", "csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    infonce = next(r for r in table if r["cell"] == "infonce+none")
    assert json.loads(infonce["search_space"])["loss.temperature"]["log"] is True


def test_a_distribution_in_one_line():
    from bench.plan.space import describe_distribution, describe_space

    assert describe_distribution({"type": "float", "low": 0.01, "high": 1.0, "log": True}) == "float [0.01, 1] log"
    assert describe_distribution({"type": "int", "low": 1, "high": 8, "step": 2}) == "int [1, 8] step 2"
    assert describe_distribution({"type": "categorical", "choices": ["all", None, 3]}) == "{all, null, 3}"
    assert describe_space({}) == "nothing (fixed parameters only)"
    assert (
        describe_space(
            {"loss.a": {"type": "int", "low": 0, "high": 2}, "miner.b": {"type": "categorical", "choices": [1]}}
        )
        == "loss.a int [0, 2]; miner.b {1}"
    )


def test_figures_not_timed_are_stretched_by_the_slowdown_seen_while_timing(grid_plan):
    """On a busy machine the timed step already carries the load; the fixed figures (records, metrics, start-up)
    did not, so they are multiplied by the slowdown the timing saw (wall x threads / CPU time); the timed step is
    not multiplied again."""
    from dataclasses import replace

    from bench.plan.cost import estimate_cell, sweep_overhead_s
    from bench.plan.measure import measure_trunk
    from bench.plan.types import TrunkCost

    protocol, budget = grid_plan.protocol, grid_plan.budget
    cell = grid_plan.cells[0]
    untimed = TrunkCost((0.0, 0.0), 0.0, ref_batch=32, source="test", threads=1)
    busy = replace(untimed, slowdown=3.0)
    assert estimate_cell(protocol, cell, budget, busy).mid_s == pytest.approx(
        3 * estimate_cell(protocol, cell, budget, untimed).mid_s
    )
    assert sweep_overhead_s(protocol, budget, busy) == pytest.approx(3 * sweep_overhead_s(protocol, budget, untimed))
    stepped, stepped_busy = replace(untimed, step_s=(0.1, 0.1)), replace(busy, step_s=(0.1, 0.1))
    steps_s = 0.1 * budget.total_iterations  # the timed step's share: the same at any slowdown
    assert estimate_cell(protocol, cell, budget, stepped_busy).mid_s - steps_s == pytest.approx(
        3 * (estimate_cell(protocol, cell, budget, stepped).mid_s - steps_s)
    )
    assert measure_trunk(protocol, budget_s=0.3, threads=1).slowdown >= 1.0


def test_a_busy_machine_is_named_with_the_idle_time_of_the_same_work():
    """The plan prints what the estimate means on an idle machine (the estimate over the slowdown): the run's CPU
    time, which a changing load does not move; an unstretched plan prints no such line."""
    from dataclasses import replace

    from bench.clock import hms

    p = plan(parse_protocol(GRID), step_s=0.01)
    assert "idle machine" not in format_plan(p)
    busy = replace(p, cost=replace(p.cost, slowdown=4.0))
    assert (
        f"the step ran 4.0x its CPU time: the same work on an idle machine takes about {hms(p.estimate.mid_s / 4)}"
        in (format_plan(busy))
    )


@pytest.mark.parametrize("kernel", [True, False])
def test_a_learned_metric_cell_pays_for_ranking_by_g(kernel: bool, monkeypatch: pytest.MonkeyPatch):
    """Ranking by g runs the metric network on the test pairs (and validation pairs), one triangle of the
    set against itself, for every final seed and every seed of the cell's own floor: the plan counts it, or
    a learned cell's time is a quarter short; at the compiled kernel's pace where it can be built, else the
    torch tiles'."""
    from bench.plan.cost import LEARNED_S_PER_PAIR, LEARNED_S_PER_PAIR_KERNEL, learned_pairs, learned_s_per_pair

    if not kernel:
        monkeypatch.setenv("DMLBENCH_PAIR_KERNEL", "0")
    elif learned_s_per_pair() != LEARNED_S_PER_PAIR_KERNEL:
        pytest.skip("no C compiler here: the plan counts the torch tiles' pace")
    per_pair = LEARNED_S_PER_PAIR_KERNEL if kernel else LEARNED_S_PER_PAIR
    assert learned_s_per_pair() == per_pair
    p = plan(load_protocol(REPO / "protocols" / "omniglot-quick.yaml"), measure=False)
    euclidean = p.estimates["quadruplet+margohnm"].mid_s
    learned = p.estimates["quadruplet-learned-dp+margohnm-w1"].mid_s
    test_pairs = learned_pairs(13_180)
    assert test_pairs == 13_180 * 13_181 / 2  # a triangle: what it keeps fits MIRROR_ELEMENTS
    assert learned_pairs(60_502) == 60_502**2  # SOP's test set: every pair
    finals_and_floor = 2 * p.budget.seeds
    assert learned - euclidean >= finals_and_floor * test_pairs * per_pair
    assert learned - euclidean < 2 * (finals_and_floor + p.budget.tuning_runs) * test_pairs * per_pair


LOADER_PROTOCOL = """
name: files
data:
  pool: folder:{pool}
  split: {{test_classes: 2, seed: 0}}
  image_size: 12
  augment:
    train: [{{RandomResizedCrop: {{size: 12, scale: [0.5, 1.0]}}}}, RandomHorizontalFlip]
    eval: [{{Resize: {{size: 12}}}}, {{CenterCrop: {{size: 12}}}}]
  loader: {{workers: 0}}
  validation: {{folds: 2, use: 1}}
model: {{trunk: mlp, trunk_params: {{hidden: [16]}}, embedding_dim: 8, normalize: true}}
training: {{optimizer: adam, lr: 1.0e-3, P: 2, K: 2, iterations: 3}}
evaluation: {{metrics: [map_at_r], primary: map_at_r}}
tuning: {{trials: 1, startup_trials: 1}}
final: {{seeds: 1}}
grid:
  losses: [{{name: contrastive}}]
"""


def test_plan_times_the_training_loader_itself_on_image_files(tmp_path: Path) -> None:
    """Without --loader-rate, a measured plan times the protocol's own training loader where the images are
    files (its pipeline, its workers, P x K batches after a first) and bounds the steps by it; data that cannot
    be read are said in one note, not guessed."""
    import numpy as np
    from PIL import Image

    from bench.plan.measure import LOADER_BATCHES

    rng = np.random.default_rng(0)
    pool = tmp_path / "pool"
    for c in range(5):
        (pool / f"c{c}").mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(pool / f"c{c}" / f"{i}.jpg")
    protocol = parse_protocol(LOADER_PROTOCOL.format(pool=pool), "files.yaml")
    p = plan(protocol, step_s=0.1, measure=True)
    assert p.loader_note.startswith("loader: "), p.loader_note
    assert f"images/s, the training loader timed here (0 worker(s), {LOADER_BATCHES * 4} images)" in p.loader_note
    assert float(p.loader_note.split()[1]) > 0
    assert "to load a batch (the loader timed here)" in p.cost.source
    given = plan(protocol, step_s=0.1, measure=True, loader_rate=1e9)  # a rate given is not timed again
    assert "(--loader-rate)" in given.cost.source and "timed here" not in given.loader_note
    for f in pool.rglob("*.jpg"):
        f.unlink()
    gone = plan(protocol, step_s=0.1, measure=True)
    assert gone.loader_note.startswith("the loader was not timed ("), gone.loader_note
    assert "reading the data a step" in format_plan(gone)
