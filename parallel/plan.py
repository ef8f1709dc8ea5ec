"""Choosing a layout: the bytes each ulysses × ring × cfg layout moves, its modelled step time, and the rule
`--ulysses/--ring/--cfg auto` follows. Pure arithmetic: no process group, no model code; a model's facts come
in as numbers (`Shape`; dit/shape.py reads them from a preset or folder).

Bytes come from the message shapes parallel/ builds (tests/test_bench_gpu.py checks them against
`parallel.count_comm` on real gloo runs): per self-attention, Ulysses sends the fused Q/K/V buffer
`pack_qkv` → [U, 3, L, ⌈H/U⌉, D] and gets the output back through `pack_out` → [U, L, ⌈H/U⌉, D] (L = S/(R·U)
tokens per rank), keeping its own 1/U of each; the ring passes its stacked K/V span [2, U·L, ⌈H/U⌉, D] R−1
times; CFG parallel all-gathers each step's fp32 noise prediction once. FP8 sends D payload bytes plus a
4-byte scale per (token, head) row instead of 2·D. With heads not divisible by U a rank owns ⌈H/U⌉ or ⌊H/U⌋
of them; the bytes are the busiest rank's (⌈H/U⌉ heads), an upper bound for the others.

The time model: compute splits over the sp ranks (linear layers and cross-attention by tokens, attention by
heads, so the slowest rank does ⌈H/U⌉ heads' attention) except the text tokens' own work, which every rank
repeats (cross-attention's text K/V projections; joint text's projections and feed-forward); communication
does not overlap compute; every byte crosses its link at the nominal per-direction bandwidth (within a node
unless the group spans nodes).
"""

from __future__ import annotations

from dataclasses import dataclass

BF16 = 2
FP32 = 4
AUTO = "auto"
# Layouts whose modelled step times are this close count as equal: the model's assumptions are coarser.
TIE = 0.01
# One GPU's forward for `plan`: the Wan2.1-14B figure bench/RESULTS.md measured (H100, bf16, compiled),
# scaled to other shapes by FLOPs.
REFERENCE_SECONDS = 2.82


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# Classifier-free guidance has two branches (prompt, negative prompt): at most one rank each.
CFG_DEGREES = (1, 2)


def fit_degrees(world: int, ulysses: int | None, ring: int, cfg: int) -> tuple[int, int, int]:
    """(ulysses, ring, cfg) for `world` ranks (ulysses None: what the others leave), or a ValueError listing
    every layout that fits. Pure, so a launcher can check degrees before any process group exists."""

    def bad(msg):
        choices = [
            (u, r, c)
            for c in _divisors(world)
            if c in CFG_DEGREES
            for r in _divisors(world // c)
            for u in _divisors(world // c // r)
        ]
        listed = ", ".join(f"{u}x{r}x{c}" for u, r, c in choices)
        return ValueError(f"{msg}; valid ulysses x ring x cfg for world size {world}: {listed}")

    for name, val in (("ring", ring), ("cfg", cfg), ("ulysses", ulysses if ulysses is not None else 1)):
        if not isinstance(val, int) or val < 1:
            raise bad(f"{name}={val!r} must be a positive integer")
    if world % (ring * cfg):
        raise bad(f"ring={ring} x cfg={cfg} does not divide world size {world}")
    if ulysses is None:
        ulysses = world // (ring * cfg)
    if world % (ulysses * ring * cfg):
        raise bad(f"ulysses={ulysses} x ring={ring} x cfg={cfg} does not divide world size {world}")
    return ulysses, ring, cfg


@dataclass(frozen=True)
class Layout:
    name: str
    ulysses: int
    ring: int = 1
    cfg: int = 1

    @classmethod
    def of(cls, ulysses: int, ring: int, cfg: int) -> Layout:
        return cls(f"ulysses {ulysses} × ring {ring} × cfg {cfg}", ulysses, ring, cfg)

    @property
    def sp(self) -> int:
        return self.ulysses * self.ring


@dataclass(frozen=True)
class Shape:
    """What the plan needs of a model and the video it makes."""

    name: str
    heads: int
    head_dim: int
    layers: int
    ffn: int  # the feed-forward's hidden width
    tokens: int  # image tokens of the video (the sequence the ranks split)
    latent_elements: int  # of the noise prediction CFG parallel all-gathers (fp32) each step
    guided: bool  # guidance != 1: two forwards per step (prompt and negative prompt)
    text_tokens: int = 0  # the prompt's tokens as the model attends to them (padded or at most)
    joint_text: bool = False  # text joins the self-attention (HunyuanVideo-1.5); else cross-attention (Wan)

    def flops(self) -> tuple[float, float, float]:
        """(attention, by tokens, on every rank) FLOPs of one forward, at 2 FLOPs a multiply-add. Attention
        (split by heads): QKᵀ and PV, 4·(S+T)²·d per layer with joint text, else 4·S²·d. By tokens: per
        image token and layer the Q/K/V/output and cross-attention Q/output projections (6·d²) and the
        feed-forward (2·d·ffn), plus cross-attention against T text keys (4·T·d). On every rank: the text
        K/V projections of cross-attention (4·T·d² a layer), or joint text tokens' own projections and
        feed-forward."""
        d, S, T = self.heads * self.head_dim, self.tokens, self.text_tokens
        per_token = 2 * (6 * d * d + 2 * d * self.ffn)
        if self.joint_text:
            attention, by_tokens, everywhere = 4 * (S + T) ** 2 * d, S * per_token, T * per_token
        else:
            attention, by_tokens, everywhere = 4 * S * S * d, S * (per_token + 4 * T * d), 4 * T * d * d
        return self.layers * attention, self.layers * by_tokens, self.layers * everywhere


# Wan2.1-14B at 480p/81 frames (UMT5's 512 padded text tokens): the shape REFERENCE_SECONDS was measured on.
REFERENCE = Shape(
    "Wan2.1-14B 480p/81 frames", 40, 128, 40, 13824, 32760, 16 * 21 * 60 * 104, True, text_tokens=512
)


def estimated_forward(shape: Shape) -> float:
    """Seconds of one forward on one H100, bf16: REFERENCE_SECONDS scaled by FLOPs."""
    return REFERENCE_SECONDS * sum(shape.flops()) / sum(REFERENCE.flops())


@dataclass(frozen=True)
class Links:
    """Per-direction bandwidth, bytes/s, within a node and across nodes."""

    intra: float = 450e9  # NVLink 4
    inter: float = 50e9  # 400 Gb/s (InfiniBand NDR) per GPU

    def describe(self) -> str:
        return f"{self.intra / 1e9:g} GB/s within a node, {self.inter / 1e9:g} GB/s across nodes"


def messages(layout: Layout, S: int, H: int, D: int, fp8: bool = False, elt: int = BF16) -> dict[str, int]:
    """Bytes of one self-attention call's messages as `parallel.count_comm` counts them (a Ulysses
    all-to-all: its whole buffer; a ring pass: what is sent); `elt` bytes per element."""
    U, R = layout.ulysses, layout.ring
    L = -(-S // layout.sp)
    heads = -(-H // U)  # per rank, the most any rank owns
    row = D + 4 if fp8 else D * elt  # bytes per (token, head) row on the wire
    out = {}
    if U > 1:
        out["all_to_all"] = (3 + 1) * L * U * heads * row
    if R > 1:
        out["send"] = (R - 1) * 2 * U * L * heads * D * elt
    return out


def link_bytes(layout: Layout, S: int, H: int, D: int, fp8: bool = False) -> float:
    """Bytes one rank puts on its links per self-attention: all-to-all less the chunk it keeps."""
    m = messages(layout, S, H, D, fp8)
    return m.get("all_to_all", 0) * (layout.ulysses - 1) / layout.ulysses + m.get("send", 0)


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    heads_per_rank: int  # on the slowest rank
    compute_s: float  # one forward on the slowest rank
    bytes_per_forward: float  # one rank puts on its links
    comm_s: float  # per forward
    bytes_per_step: float
    step_s: float | None  # None: cfg 2 without guidance (nothing for the second half to do)


def estimate(
    layout: Layout,
    shape: Shape,
    forward_s: float,
    links: Links = Links(),
    node: int | None = None,
    fp8: bool = False,
) -> Estimate:
    """One denoising step under `layout`, one forward of the whole model taking `forward_s` on one GPU;
    `node` ranks per node (None: one node)."""
    node = node or layout.sp * layout.cfg
    attention, by_tokens, everywhere = shape.flops()
    heads = -(-shape.heads // layout.ulysses)
    # attention waits for the rank with the most heads; the text tokens' own work is not split
    busiest = attention * heads * layout.ulysses / shape.heads
    compute = (
        forward_s * ((busiest + by_tokens) / layout.sp + everywhere) / (attention + by_tokens + everywhere)
    )
    m = messages(layout, shape.tokens, shape.heads, shape.head_dim, fp8)
    a2a = m.get("all_to_all", 0) * (layout.ulysses - 1) / layout.ulysses
    # ulysses is innermost: a group of U (or U·R, or the replica) contiguous ranks stays inside a node
    # when it divides the node
    ulysses_bw = links.intra if node % layout.ulysses == 0 else links.inter
    ring_bw = links.intra if node % layout.sp == 0 else links.inter
    comm = shape.layers * (a2a / ulysses_bw + m.get("send", 0) / ring_bw)
    per_forward = shape.layers * (a2a + m.get("send", 0))
    forwards = 2 if shape.guided and layout.cfg == 1 else 1
    step_bytes, step = forwards * per_forward, forwards * (compute + comm)
    if layout.cfg == 2:
        gathered = shape.latent_elements * FP32
        step_bytes += gathered
        step += gathered / (links.intra if node % (layout.sp * 2) == 0 else links.inter)
    useful = shape.guided or layout.cfg == 1
    return Estimate(layout, heads, compute, per_forward, comm, step_bytes, step if useful else None)


def candidates(world: int) -> list[Layout]:
    """Every ulysses × ring × cfg layout of `world` ranks in one replica (cfg 1 or 2)."""
    return [
        Layout.of(u, world // c // u, c)
        for c in CFG_DEGREES
        if world % c == 0
        for u in range(1, world // c + 1)
        if world // c % u == 0
    ]


def parse_degree(text: str) -> int | str:
    """A degree as a flag or variable gives it: an integer, or "auto"."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer or auto") from None


def requested(ulysses, ring, cfg) -> tuple:
    """The degrees asked for (each an int, "auto" or None: not given) as `choose` takes them: with no
    integer given every degree not given is auto (the default); with one, the others not given keep their
    fixed defaults (ulysses: what remains, ring 1, cfg 1)."""
    if not any(isinstance(v, int) for v in (ulysses, ring, cfg)):
        return tuple(AUTO if v is None else v for v in (ulysses, ring, cfg))
    if ring == AUTO and ulysses is None:  # "what remains" is unknown until the ring is chosen
        ulysses = AUTO
    return ulysses, 1 if ring is None else ring, 1 if cfg is None else cfg


def needs_model(ulysses, ring, cfg) -> bool:
    """Whether resolving these degrees needs the model's shape (some degree is auto)."""
    return AUTO in requested(ulysses, ring, cfg)


def check_fixed(world: int, ulysses, ring, cfg) -> None:
    """`fit_degrees`' ValueError when the degrees given as integers cannot fit `world` ranks (the auto ones
    taken as 1, what any auto choice can shrink to); needs no model."""
    ulysses, ring, cfg = requested(ulysses, ring, cfg)
    for name, value in (("ulysses", ulysses), ("ring", ring), ("cfg", cfg)):
        if value not in (None, AUTO) and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name}={value!r} must be a positive integer or auto")
    fit_degrees(
        world, None if ulysses in (None, AUTO) else ulysses, *(1 if v == AUTO else v for v in (ring, cfg))
    )


@dataclass(frozen=True)
class Choice:
    layout: Layout
    reason: str  # "as given", or why auto chose it

    def line(self) -> str:
        return f"layout: {self.layout.name} ({self.reason})"


def choose(
    world: int,
    shape: Shape | None,
    ulysses=None,
    ring=None,
    cfg=None,
    *,
    node: int | None = None,
    links: Links = Links(),
) -> Choice:
    """The layout for `world` ranks (one replica). Degrees: an int, "auto", or None (not given; see
    `requested`). Auto follows the rule:
    1. cfg 2 when the model is guided and the ranks it leaves split evenly, else 1 (CFG parallel costs one
       all-gather of the prediction per step, against two sequence-parallel forwards);
    2. the other n ranks: Ulysses degrees U that divide n and the node (a Ulysses group inside one node) with
       U ≤ heads are allowed, the ring takes the rest (across nodes, or past the head count). Among the
       allowed, the least modelled step time; times within TIE count as equal, and among those a U that
       divides the heads, then the larger U (fewer ring passes).
    Impossible fixed degrees raise `fit_degrees`' ValueError listing the valid ones. `shape` may be None when
    no degree is auto."""
    ulysses, ring, cfg = requested(ulysses, ring, cfg)
    fixed = [v for v in (ulysses, ring, cfg) if v != AUTO]
    node = node or world
    if world % node:
        raise ValueError(f"{node} ranks per node do not divide the world size {world}")
    check_fixed(world, ulysses, ring, cfg)  # every layout considered below then fits
    if len(fixed) == 3:
        return Choice(Layout.of(*fit_degrees(world, ulysses, ring, cfg)), "as given")
    if world == 1:
        return Choice(Layout.of(1, 1, 1), "auto: one rank")
    forward = estimated_forward(shape)
    why = []
    if cfg == AUTO:
        fixed_sp = (ulysses if isinstance(ulysses, int) else 1) * (ring if isinstance(ring, int) else 1)
        cfg = 2 if shape.guided and world % (2 * fixed_sp) == 0 else 1
        why.append(
            "guided, so CFG parallel" if cfg == 2
            else "unguided, so no CFG parallel" if not shape.guided
            else "guided, but the ranks do not split in two, so no CFG parallel" if fixed_sp == 1
            else f"guided, but the {fixed_sp} sequence ranks given leave no second branch, so no CFG parallel"
        )  # fmt: skip
    n = world // cfg
    if ulysses == AUTO and ring == AUTO:
        allowed = [u for u in range(1, n + 1) if n % u == 0 and node % u == 0 and u <= shape.heads]
    elif ulysses == AUTO:
        allowed = [n // ring]
    else:  # ring auto or what remains: set by the Ulysses degree, itself what the ring leaves when not given
        allowed = [n // ring if ulysses is None else ulysses]
    est = {u: estimate(Layout.of(u, n // u, cfg), shape, forward, links, node) for u in allowed}
    step = {u: e.step_s if e.step_s is not None else float("inf") for u, e in est.items()}
    best = min(step.values())
    equal = [u for u in allowed if step[u] <= best * (1 + TIE)]
    u = max(equal, key=lambda u: (shape.heads % u == 0, u))
    if ulysses == AUTO and ring == AUTO:
        why.append(_why_ulysses(u, n, node, shape.heads, allowed, step))
    elif AUTO in (ulysses, ring):  # the other degree was given: this one is what it leaves
        given = f"ring {ring}" if ulysses == AUTO else f"ulysses {ulysses}"
        why.append(f"ulysses {u} × ring {n // u}: what the {given} given leaves of {n} ranks")
    return Choice(Layout.of(u, n // u, cfg), "auto: " + "; ".join(why))


def _why_ulysses(u: int, n: int, node: int, heads: int, allowed: list[int], step: dict) -> str:
    if n == 1:
        return "one rank for each branch"
    top = max(allowed)
    said = f"{n} ranks left, Ulysses within the node, {heads} heads"
    if u < top:
        return (
            f"{said}: ulysses {top} would give the slowest rank {-(-heads // top)} heads, modelled "
            f"{step[top]:.3g} s/step against {step[u]:.3g} s for ulysses {u} × ring {n // u}"
        )
    if n // u == 1:
        return said
    return f"{said}: ring {n // u} " + ("across nodes" if n > node else f"past {heads} heads")


def table(
    world: int,
    shape: Shape,
    *,
    node: int | None = None,
    links: Links = Links(),
    forward_s: float | None = None,
) -> list[Estimate]:
    """Every candidate layout's estimate, fastest first (cfg 2 without guidance last)."""
    forward = estimated_forward(shape) if forward_s is None else forward_s
    rows = [
        estimate(layout, shape, forward, links, node)
        for layout in candidates(world)
        if layout.ulysses <= shape.heads
    ]
    return sorted(rows, key=lambda e: (e.step_s is None, e.step_s or 0.0, -e.layout.cfg, -e.layout.ulysses))
