"""Latency-bandwidth (alpha-beta) model of the gradient all-reduce, and the plan it picks.

The trainer reduces its gradients with the collectives of `jia_jax.allreduce`: per bucket, one
all-reduce over every GPU (`flat`), or reduce-scatter inside the node, all-reduce of 1/gpu of the
bytes across nodes and all-gather inside the node (`hierarchical`), or either by bucket size
(`hybrid`). This module predicts their time from a few numbers per link level:

  * `launch_s`: fixed cost of one collective (kernel launch and NCCL's base latency);
  * `alpha_s`: latency of one step of a ring on that level (one message hop);
  * `beta_bytes_per_s`: bandwidth one GPU gets on that level. For the network it is the GPU's share
    of its node's NICs (NIC rate x NICs per node / GPUs per node).

A ring all-reduce of B bytes over n GPUs takes `launch + 2(n-1) alpha + 2(n-1)/n B / beta`; a
reduce-scatter or all-gather `launch + (n-1) alpha + (n-1)/n B / beta` (Thakur et al. 2005; the form
of NCCL's own tuning model). Across nodes a flat ring makes `2(node-1)` of its steps over the
network and is limited by the slower of NVLink and the node's NIC bandwidth; NCCL may also run a
tree, `launch + 2((gpu-1) alpha_intra + ceil(log2 node) alpha_inter) + 2 B / beta`, and takes the
faster (`algorithms`). The network level is `inter` as the `gpu` concurrent all-reduces of
`hierarchical` share it, and `flat_inter` (where measured apart, else `inter`) as one flat
all-reduce over every GPU uses it: NCCL's sockets between hosts emulated on one machine carry a
4-GPU ring faster per node than two concurrent 2-GPU rings (`scripts/bench/link.py`).

Backward fills the buckets one after another, and with `comm.overlap` each bucket's all-reduce runs
while backward computes the layers below it; only the bucket backward fills last (the stem side)
necessarily runs after backward. So a plan's exposed communication is

    exposed = t(last bucket) + (1 - overlap) * sum(t(other buckets))

where `overlap` is the measured fraction of the earlier buckets' time hidden behind backward
(`CommModel.overlap`); without `comm.overlap` (and for 'xla') every bucket is exposed, `exposed =
sum(t)`, and so is every bucket reduced in the hierarchical stages across two mesh levels, which
XLA runs synchronously after backward (`overlappable`). Compute comes from a measured step time
on one device:

    step = compute + exposed + step_overhead.

`resolve` turns `comm.strategy='auto'` and `comm.bucket_bytes` / `comm.hybrid_crossover_bytes`
= -1 (`AUTO_BYTES`) into the plan with the least predicted exposed communication;
`predict_strategies` gives every strategy's plan and `auto`'s choice for one mesh. The calibration
(fitted by `scripts/calibrate_comm.py` from `docs/benchmarks/*.json`) is package data,
`jia_jax/comm_calibration.json`: `load_model` reads a cluster's links from it (the intra-node fit
and a published fabric), `load_emulated_hosts` the levels fitted on one machine split into hosts
(`scripts/bench/link.py`), and `network_model` picks one of them by `comm.network`'s name. Pure
Python: no JAX needed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any

from jia_jax import bucketing

STRATEGIES = ("flat", "hierarchical", "hybrid")
AUTO = "auto"
# ml_collections fields are typed by their default: an int field takes no string, so "auto" for a
# byte count is spelled -1 (`--config.comm.bucket_bytes=-1`).
AUTO_BYTES = -1
MIB = 1 << 20
# Tensor-fusion thresholds `resolve` tries: 1 MiB ... 512 MiB.
BUCKET_GRID = tuple(MIB << k for k in range(10))
WIRE_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, bucketing.FP8_WIRE: 1}
ALGORITHMS = ("ring", "tree")
CALIBRATION_FILE = "comm_calibration.json"
# `comm.network` naming the links fitted on one machine split into hosts (`load_emulated_hosts`);
# "" names the calibration's default fabric.
EMULATED = "emulated"
# Two predicted times closer than this (relative) are a tie; ties go to the simpler plan.
_TIE = 1e-9
# `resolve` takes a more complex strategy (hierarchical over flat, hybrid over hierarchical) only
# when it is predicted at least this much faster: below it the difference rests on how the fixed
# cost splits into launch and per-step latency, which one-host benchmarks cannot separate.
SIMPLER_MARGIN = 0.05


@dataclasses.dataclass(frozen=True)
class Link:
    """One level of the interconnect as one GPU sees it."""

    alpha_s: float  # latency of one ring step on this level
    beta_bytes_per_s: float  # bandwidth one GPU gets on this level


@dataclasses.dataclass(frozen=True)
class CommModel:
    """Link parameters of a cluster and how its steps overlap communication.

    Attributes:
      intra: the level inside a node (NVLink, PCIe).
      inter: the level across nodes (the network), per GPU, when every GPU of a node runs its own
        all-reduce across nodes at once (`hierarchical`'s middle stage).
      launch_s: fixed cost of one collective.
      algorithms: all-reduce algorithms the collective library may pick from ("ring", "tree").
      overlap: fraction of the time of the buckets before the last that backward hides, with
        `comm.overlap` (measured; 0 = none).
      step_overhead_s: fixed cost per multi-device step beyond compute and gradient reduction.
      flat_inter: the network as one flat all-reduce over every GPU uses it (per GPU: the node's
        share / GPUs per node), where measured apart from `inter`; None: `inter`.
    """

    intra: Link
    inter: Link
    launch_s: float
    algorithms: tuple[str, ...] = ALGORITHMS
    overlap: float = 0.0
    step_overhead_s: float = 0.0
    flat_inter: Link | None = None

    def __post_init__(self):
        unknown = set(self.algorithms) - set(ALGORITHMS)
        if unknown or "ring" not in self.algorithms:
            raise ValueError(f"algorithms must include 'ring', within {ALGORITHMS}; got {unknown}.")
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"overlap is a fraction in [0, 1], got {self.overlap}.")

    def single_host(self) -> CommModel:
        """The same model with the node axis on the intra-node link (a 2-D mesh on one host)."""
        return dataclasses.replace(self, inter=self.intra, flat_inter=None)


def allreduce_s(nbytes: float, node: int, gpu: int, model: CommModel) -> float:
    """One flat all-reduce of `nbytes` per GPU over `node` x `gpu` GPUs (the fastest algorithm)."""
    return _allreduce_s(nbytes, node, gpu, model, model.flat_inter or model.inter)


def _allreduce_s(nbytes: float, node: int, gpu: int, model: CommModel, net: Link) -> float:
    """`allreduce_s` with the network level `net`."""
    n = node * gpu
    if n == 1:
        return 0.0
    # Across nodes the ring's traffic crosses each node's NICs once per pass: the node's share of
    # the network (gpu x per-GPU rate) bounds it, as NVLink does inside.
    bw = model.intra.beta_bytes_per_s
    if node > 1:
        bw = min(bw, gpu * net.beta_bytes_per_s)
    inter_steps = 2 * (node - 1)
    latency = (2 * (n - 1) - inter_steps) * model.intra.alpha_s + inter_steps * net.alpha_s
    times = [model.launch_s + latency + 2 * (n - 1) / n * nbytes / bw]
    if "tree" in model.algorithms and node > 1:
        depth = math.ceil(math.log2(node))
        tree_latency = 2 * ((gpu - 1) * model.intra.alpha_s + depth * net.alpha_s)
        times.append(model.launch_s + tree_latency + 2 * nbytes / bw)
    return min(times)


def scatter_or_gather_s(nbytes: float, n: int, link: Link, launch_s: float) -> float:
    """A ring reduce-scatter (or all-gather) over `n` GPUs of one level; `nbytes` is the full
    buffer (the scatter's input, the gather's output)."""
    if n == 1:
        return 0.0
    return launch_s + (n - 1) * link.alpha_s + (n - 1) / n * nbytes / link.beta_bytes_per_s


def hierarchical_s(nbytes: float, node: int, gpu: int, model: CommModel) -> float:
    """Reduce-scatter over `gpu`, all-reduce of 1/gpu of the bytes over `node`, all-gather over
    `gpu`. The `gpu` all-reduces across nodes run at once and share each node's NICs, so each
    gets one GPU's share of `model.inter` (one GPU per node). Where a level has one member,
    `allreduce._hierarchical_sum` runs one all-reduce over the other level instead."""
    if node == 1 or gpu == 1:
        return allreduce_s(nbytes, node, gpu, model)
    inside = 2 * scatter_or_gather_s(nbytes, gpu, model.intra, model.launch_s)
    return inside + _allreduce_s(nbytes / gpu, node, 1, model, model.inter)


def bucket_elements(
    leaf_sizes: Sequence[int],
    bucket_bytes: int,
    itemsize: int,
    first_bucket_bytes: int = 0,
    last_bucket_bytes: int = 0,
) -> list[int]:
    """Elements per bucket: the greedy packing of `jia_jax.allreduce.plan_buckets`.

    `leaf_sizes` are element counts in the order the leaves are packed (backward order). A leaf
    joins the current bucket while the bucket stays within `bucket_bytes` (in the wire dtype;
    the first bucket within `first_bucket_bytes` unless 0, the last leaves within
    `last_bucket_bytes` a last bucket of their own unless 0); a larger leaf gets a bucket of its
    own; empty leaves are skipped.
    """
    limits = (bucket_bytes, first_bucket_bytes, last_bucket_bytes)
    if min(limits) < 0:
        raise ValueError(f"bucket sizes must be >= 0, got {limits}.")
    groups = bucketing.greedy_buckets(leaf_sizes, itemsize, *limits)
    return [sum(leaf_sizes[p] for p in positions) for positions in groups]


def bucket_s(
    elements: int, itemsize: int, hierarchical: bool, node: int, gpu: int, model: CommModel
) -> float:
    """Time to reduce one bucket of `elements` wire values with either collective."""
    if hierarchical and node > 1 and gpu > 1:
        padded = -(-elements // gpu) * gpu  # reduce-scatter pads to a multiple of gpu
        return hierarchical_s(padded * itemsize, node, gpu, model)
    return allreduce_s(elements * itemsize, node, gpu, model)


def bucket_times(
    strategy: str,
    buckets: Sequence[int],
    itemsize: int,
    crossover_bytes: int,
    node: int,
    gpu: int,
    model: CommModel,
) -> list[float]:
    """Time to reduce each of `buckets` (elements each, in backward order) with a strategy."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}.")
    return [
        bucket_s(
            elements,
            itemsize,
            bucketing.reduces_hierarchically(strategy, elements * itemsize, crossover_bytes),
            node,
            gpu,
            model,
        )
        for elements in buckets
    ]


def overlappable(
    strategy: str,
    buckets: Sequence[int],
    itemsize: int,
    crossover_bytes: int,
    node: int,
    gpu: int,
) -> list[bool]:
    """Whether backward can hide each bucket's reduction (`exposed_s`). Not where the bucket is
    reduced in the hierarchical stages on a mesh of two levels: XLA merges those buckets'
    reduce-scatters into one synchronous reduce-scatter after backward, and the all-reduce across
    nodes after it is synchronous too (the recorded schedule of the 2 x 2 `hierarchical` rows,
    docs/scaling.md)."""
    two_levels = node > 1 and gpu > 1
    hierarchical = [
        bucketing.reduces_hierarchically(strategy, n * itemsize, crossover_bytes) for n in buckets
    ]
    return [not (two_levels and h) for h in hierarchical]


def plan_s(
    strategy: str,
    buckets: Sequence[int],
    itemsize: int,
    crossover_bytes: int,
    node: int,
    gpu: int,
    model: CommModel,
) -> float:
    """Time to reduce `buckets` (elements each) one after another with a strategy."""
    return sum(bucket_times(strategy, buckets, itemsize, crossover_bytes, node, gpu, model))


def exposed_s(
    times: Sequence[float], overlap: float, hideable: Sequence[bool] | None = None
) -> float:
    """Communication not hidden by backward: the last bucket's time (backward fills it last, so it
    starts after backward) and `1 - overlap` of the others' (all of those `hideable` marks False,
    see `overlappable`). `overlap=0` gives the total."""
    if not times:
        return 0.0
    hideable = [True] * len(times) if hideable is None else hideable
    return times[-1] + sum(
        t * (1.0 - overlap if h else 1.0) for t, h in zip(times[:-1], hideable[:-1])
    )


def plan_reduction(
    strategy: str,
    buckets: Sequence[int],
    itemsize: int,
    crossover_bytes: int,
    node: int,
    gpu: int,
    model: CommModel,
    overlap: float,
) -> tuple[list[float], float]:
    """Each bucket's reduction time (`bucket_times`) and the part of them backward does not hide
    (`exposed_s` with `overlap`, the buckets `overlappable` marks exposed whole)."""
    times = bucket_times(strategy, buckets, itemsize, crossover_bytes, node, gpu, model)
    hideable = overlappable(strategy, buckets, itemsize, crossover_bytes, node, gpu)
    return times, exposed_s(times, overlap, hideable)


def xla_s(nbytes: float, num_allreduces: int, node: int, gpu: int, model: CommModel) -> float:
    """`comm.strategy='xla'`: XLA picks and combines the all-reduces itself. Approximated as
    `num_allreduces` equal flat all-reduces (the count read off the compiled program)."""
    if num_allreduces < 1:
        return 0.0
    return num_allreduces * allreduce_s(nbytes / num_allreduces, node, gpu, model)


def step_s(compute_s: float, exposed: float, model: CommModel, devices: int) -> float:
    """Predicted step time: compute, the exposed communication (`exposed_s`), fixed overhead."""
    if devices == 1:
        return compute_s
    return compute_s + exposed + model.step_overhead_s


@dataclasses.dataclass(frozen=True)
class Plan:
    """A resolved communication plan and its predicted cost.

    `comm_s` is the predicted reduction time per step and `exposed_s` the part of it backward does
    not hide (`exposed_s()`; both None for 'xla', which the model does not plan); `step_s` is
    compute + exposed communication + overhead (None without a compute time).
    """

    strategy: str
    bucket_bytes: int
    hybrid_crossover_bytes: int
    comm_s: float | None
    step_s: float | None = None
    buckets: int | None = None
    exposed_s: float | None = None

    def summary(self) -> str:
        """One log line."""
        comm = "not modelled"
        if self.comm_s is not None:
            comm = f"{self.comm_s * 1e3:.3f} ms/step, {self.exposed_s * 1e3:.3f} ms exposed"
        step = "" if self.step_s is None else f", step {self.step_s * 1e3:.2f} ms"
        return (
            f"comm plan: {self.strategy}, bucket {self.bucket_bytes / MIB:g} MiB"
            f" ({self.buckets} buckets), hybrid crossover {self.hybrid_crossover_bytes / MIB:g}"
            f" MiB; predicted reduction {comm}{step}"
        )


def _read(calibration: Mapping[str, Any] | str | None) -> Mapping[str, Any]:
    """A calibration as a dict: given, read from a JSON path, or the package's own (None)."""
    if calibration is None:
        return json.loads(resources.files("jia_jax").joinpath(CALIBRATION_FILE).read_text())
    if isinstance(calibration, str):
        with open(calibration) as f:
            return json.load(f)
    return calibration


def load_model(
    calibration: Mapping[str, Any] | str | None = None,
    fabric: str | None = None,
    single_host: bool = False,
) -> CommModel:
    """Builds a `CommModel` from a calibration (a dict, a JSON path, or the packaged file).

    Args:
      calibration: the output of `scripts/calibrate_comm.py`; None reads the package's own.
      fabric: name of the inter-node fabric in the calibration's `fabrics` (default: its
        `default_fabric`).
      single_host: every GPU is on one host (the node axis rides the intra-node link too).
    """
    calibration = _read(calibration)
    intra = calibration["intra"]
    name = fabric or calibration["default_fabric"]
    if name not in calibration["fabrics"]:
        raise ValueError(
            f"Unknown fabric {name!r}; the calibration has {sorted(calibration['fabrics'])}."
        )
    net = calibration["fabrics"][name]
    model = CommModel(
        intra=Link(intra["alpha_s"], intra["beta_bytes_per_s"]),
        inter=Link(net["alpha_s"], net["beta_bytes_per_s"]),
        launch_s=intra["launch_s"],
        algorithms=tuple(net.get("algorithms", ALGORITHMS)),
        overlap=calibration["overlap"]["value"],
        step_overhead_s=calibration["step_overhead_s"]["value"],
    )
    return model.single_host() if single_host else model


def load_emulated_hosts(
    calibration: Mapping[str, Any] | str | None = None, setting: str | None = None
) -> CommModel:
    """The two-level model of hosts emulated on one machine: the links and the launch cost as
    `scripts/calibrate_comm.py` fitted them for one NCCL setting (default: the calibration's
    `default_emulated`, the setting of `scripts/launch_local.sh --hosts`), `flat_inter` where the
    fit has it; NCCL may run a ring or a tree; overlap and step overhead as in `load_model`."""
    calibration = _read(calibration)
    fits = calibration["emulated_hosts"]
    name = setting or calibration["default_emulated"]
    if name not in fits:
        raise ValueError(f"No emulated-host fit {name!r}; the calibration has {sorted(fits)}.")
    fit = fits[name]
    flat = fit.get("flat_inter")
    return CommModel(
        intra=Link(fit["intra"]["alpha_s"], fit["intra"]["beta_bytes_per_s"]),
        inter=Link(fit["inter"]["alpha_s"], fit["inter"]["beta_bytes_per_s"]),
        launch_s=fit["launch_s"],
        overlap=calibration["overlap"]["value"],
        step_overhead_s=calibration["step_overhead_s"]["value"],
        flat_inter=None if flat is None else Link(flat["alpha_s"], flat["beta_bytes_per_s"]),
    )


def network_names(calibration: Mapping[str, Any] | str | None = None) -> tuple[str, ...]:
    """The values `comm.network` may take: "" (the default fabric), `EMULATED`, each fabric."""
    return ("", EMULATED, *sorted(_read(calibration)["fabrics"]))


def network_model(
    network: str,
    calibration: Mapping[str, Any] | str | None = None,
    single_host: bool = False,
) -> CommModel:
    """The links `comm.network` names: "" the calibration's default fabric, `EMULATED` the hosts
    emulated on one machine (`load_emulated_hosts`), else a fabric of the calibration. With
    `single_host` (every device in one process) there is no network: NVLink carries both levels,
    whatever the name (which is still checked).

    Raises:
      ValueError: `network` is none of `network_names`.
    """
    calibration = _read(calibration)
    allowed = network_names(calibration)
    if network not in allowed:
        raise ValueError(
            f"comm.network={network!r} is not one of {allowed}: '' is the calibration's default "
            f"fabric ({calibration['default_fabric']!r}), {EMULATED!r} the links fitted on one "
            "machine split into hosts (scripts/launch_local.sh --hosts), the others published "
            "fabrics."
        )
    if single_host:
        return load_model(calibration, single_host=True)
    if network == EMULATED:
        return load_emulated_hosts(calibration)
    return load_model(calibration, fabric=network or None)


def _candidates(requested: Any, auto: Any, grid: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(grid) if requested == auto else (requested,)


def resolve(
    comm: Any,
    *,
    node: int,
    gpu: int,
    leaf_sizes: Sequence[int],
    compute_s: float | None = None,
    model: CommModel | None = None,
    single_host: bool = False,
) -> Plan:
    """Resolves `comm.strategy='auto'` and `comm.bucket_bytes` / `comm.hybrid_crossover_bytes`
    = `AUTO_BYTES` (-1) to the plan with the least predicted exposed communication (`exposed_s`:
    with `comm.overlap`, the last bucket and `1 - model.overlap` of the others; without, all of
    them); explicit values win.

    Candidates: strategies flat, hierarchical, hybrid; buckets `BUCKET_GRID`; crossovers 0 and
    `BUCKET_GRID`. Within a strategy ties go to the smaller bucket and crossover; a later strategy
    replaces an earlier one only when predicted `SIMPLER_MARGIN` faster. On one device nothing is
    reduced: 'auto' becomes 'xla' (no packing code in the step).

    Args:
      comm: the config's `comm` block (`strategy`, `bucket_bytes`, `dtype`,
        `hybrid_crossover_bytes`, `overlap`, True where absent as in the config, and
        `first_bucket_bytes` and `last_bucket_bytes`, 0 where absent).
      node, gpu: the mesh shape.
      leaf_sizes: element count of every gradient leaf, in the order backward produces them.
      compute_s: measured step time on one device at this per-device batch, for `Plan.step_s`.
      model: the link model; None loads the packaged calibration.
      single_host: all devices on one host, so the node axis is on the intra-node link; used only
        when `model` is None.

    Example (in the trainer, once the mesh and the parameter shapes are known):

        leaves = jax.tree.leaves(abstract_params)
        order = call_order.backward_leaf_order(model, image_shape)
        plan = comm_model.resolve(
            config.comm, node=mesh.shape["node"], gpu=mesh.shape["gpu"],
            leaf_sizes=[leaves[i].size for i in order],
            model=comm_model.network_model(
                config.comm.network, single_host=jax.process_count() == 1))
        with config.unlocked():
            config.comm.strategy = plan.strategy
            config.comm.bucket_bytes = plan.bucket_bytes
            config.comm.hybrid_crossover_bytes = plan.hybrid_crossover_bytes
        logging.info(plan.summary())
    """
    if comm.dtype not in WIRE_ITEMSIZE:
        raise ValueError(f"comm.dtype must be one of {sorted(WIRE_ITEMSIZE)}, got {comm.dtype!r}.")
    itemsize = WIRE_ITEMSIZE[comm.dtype]
    model = model or load_model(single_host=single_host)
    # The fp8 wire's two collectives move the bytes of a ring all-reduce of 1-byte values between
    # one GPU of each node; across nodes of several GPUs its flat all-to-all sends more than a
    # ring (every GPU's chunks cross the network), which the ring model does not price: the
    # model plans it hierarchical (its inside stages, in the gradients' dtype, priced at 1 byte).
    fp8 = bucketing.is_fp8_wire(comm.dtype)
    strategies = _candidates(comm.strategy, AUTO, ("hierarchical",) if fp8 else STRATEGIES)
    if set(strategies) - {*STRATEGIES, "xla"}:
        raise ValueError(f"comm.strategy must be 'auto', 'xla' or one of {STRATEGIES}.")
    buckets = _candidates(comm.bucket_bytes, AUTO_BYTES, BUCKET_GRID)
    crossovers = _candidates(comm.hybrid_crossover_bytes, AUTO_BYTES, (0, *BUCKET_GRID))
    if node * gpu == 1:
        # Nothing crosses a link; keep explicit values and the cheapest code path (for the fp8
        # wire an explicit strategy, which on one device returns the gradients as they are: XLA's
        # would sum them in fp8).
        strategy = comm.strategy
        if strategy == AUTO:
            strategy = strategies[0] if fp8 else "xla"
        return Plan(strategy, max(buckets), max(crossovers), 0.0, compute_s, None, 0.0)
    if strategies == ("xla",):
        # XLA's own collectives are not planned here; the bucket fields are then unused.
        return Plan("xla", max(buckets), max(crossovers), None, None, None)
    # Without `comm.overlap` every bucket waits where it starts: all of it is exposed.
    overlap = model.overlap if getattr(comm, "overlap", True) else 0.0
    limits = getattr(comm, "first_bucket_bytes", 0), getattr(comm, "last_bucket_bytes", 0)

    plan = _fastest(strategies, buckets, crossovers,
                    lambda bucket: bucket_elements(leaf_sizes, bucket, itemsize, *limits),
                    lambda strategy, bucket, crossover, sizes: _costed(
                        strategy, bucket, crossover, sizes, itemsize, node, gpu, model, overlap))
    step = None if compute_s is None else step_s(compute_s, plan.exposed_s, model, node * gpu)
    return dataclasses.replace(plan, step_s=step)


def _fastest(
    strategies: Sequence[str],
    buckets: Sequence[int],
    crossovers: Sequence[int],
    sizes_for: Callable[[int], list[int]],
    cost: Callable[[str, int, int, list[int]], Plan],
) -> Plan:
    """`resolve`'s choice among the candidates: each strategy's fastest bucket (and crossover,
    for hybrid), ties to the earlier; then the first strategy unless a later one is predicted
    `SIMPLER_MARGIN` faster."""
    best: dict[str, Plan] = {}
    for strategy in strategies:
        for bucket in buckets:
            sizes = sizes_for(bucket)
            for crossover in crossovers if strategy == "hybrid" else crossovers[:1]:
                c = cost(strategy, bucket, crossover, sizes)
                if strategy not in best or c.exposed_s < best[strategy].exposed_s * (1 - _TIE):
                    best[strategy] = c
    plan = best[strategies[0]]
    for strategy in strategies[1:]:
        if best[strategy].exposed_s < plan.exposed_s * (1 - SIMPLER_MARGIN):
            plan = best[strategy]
    return plan


def _costed(
    strategy: str,
    bucket: int,
    crossover: int,
    elements: Sequence[int],
    itemsize: int,
    node: int,
    gpu: int,
    model: CommModel,
    overlap: float,
) -> Plan:
    """A candidate plan (`elements` per bucket) with its reduction time and exposed part."""
    times, exposed = plan_reduction(
        strategy, elements, itemsize, crossover, node, gpu, model, overlap
    )
    return Plan(strategy, bucket, crossover, sum(times), None, len(elements), exposed)


def predict_strategies(
    model: CommModel,
    *,
    node: int,
    gpu: int,
    leaf_sizes: Sequence[int],
    dtype: str,
    bucket_bytes: int,
    hybrid_crossover_bytes: int,
    compute_s: float | None = None,
    overlap: bool = True,
) -> dict[str, Plan]:
    """Each strategy's predicted plan on a `node` x `gpu` mesh, the trainer's gradients packed
    into `bucket_bytes` buckets of `dtype` (hybrid: hierarchical below the crossover), and
    'auto': what `resolve` picks with strategy, buckets and crossover all on auto (as
    `scripts/bench/step.py` runs it), all with `comm.overlap=overlap`. `compute_s` (the
    one-device step) adds `Plan.step_s`."""
    plans = {}
    for strategy in (*STRATEGIES, AUTO):
        auto = strategy == AUTO
        comm = types.SimpleNamespace(
            strategy=strategy,
            bucket_bytes=AUTO_BYTES if auto else bucket_bytes,
            hybrid_crossover_bytes=AUTO_BYTES if auto else hybrid_crossover_bytes,
            dtype=dtype,
            overlap=overlap,
        )
        plans[strategy] = resolve(
            comm, node=node, gpu=gpu, leaf_sizes=leaf_sizes, compute_s=compute_s, model=model
        )
    return plans
