"""One command that checks and times Ithaca on one CUDA GPU, inside a 10-minute device call.

    python bench/gpu.py [--out DIR] [--only SECTION ...] [--budget SECONDS] [--cpu-smoke]

On the lent GPU machine (no network; diffusers, fastapi, uvicorn, pydantic, python-multipart and
imageio-ffmpeg travel as wheels that `bash scripts/gpu_wheels.sh` downloads into .whl/ here first), one call
of the device tool with `carry: [".whl"]` and this command:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 \
      && timeout 590 python3 bench/gpu.py --out $OUT

Sections run in order, correctness first; each has a time budget and is skipped (with the reason) when it
would not fit in what is left of --budget (540 s). The budgets add up to 1075 s (540 + 535), so the kit takes
two device calls (`--only` splits it: SPLIT below, in order; `modelled` reads the forward sections' figures,
so it stays in their call). A session lent 15 minutes of device time, the machine's start included, makes the
second call at once, while the machine is warm, with --budget at what `status` says is left less a minute: the
second call's sections come in the open issues' order, so what does not fit is the least needed (the last H200
run took 300 s for the 15 sections it had then). gpu.md (a section ready to paste into bench/RESULTS.md) and
gpu.json are rewritten in --out after every section, so a run cut short still leaves its numbers; the Markdown
is printed last. A section that leaves the CUDA context unusable (an illegal memory access in a kernel) fails
alone: the kit goes on with the rest in a fresh process (`--resume`). Without CUDA every section says so,
unless --cpu-smoke runs them all at toy sizes on the CPU (seconds: the numbers prove the code runs, not how
fast; tests/test_bench_gpu.py runs it).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench import gpu_batch, gpu_correct, gpu_hunyuan_vae, gpu_lora, gpu_modelled, gpu_speed, gpu_whole  # noqa: E402
from bench.common import at_least  # noqa: E402
from bench.entry import run_main  # noqa: E402
from bench.gpu_kit import Kit, Report, Skip, fmt  # noqa: E402

# a module of ours missing is a bug, not a skip
OURS = ("bench", "dit", "parallel", "server", "testing", "tests")
SMOKE_SCALE = 0.1  # toy sizes take a tenth of a section's GPU budget, so --cpu-smoke never skips for time


@dataclass(frozen=True)
class Section:
    name: str  # what --only takes
    title: str
    run: object  # (kit, report) → None
    budget_s: float  # seconds on an H100, compile warm-ups included


SECTIONS = (
    Section("attention", "local_attention per backend vs float64", gpu_correct.attention, 20),
    Section("fp8", "FP8 wire format; the FP8 layer's input quantiser and GEMM", gpu_correct.fp8_wire, 30),
    Section("fp8-attention", "FP8 attention vs float64, kernel vs emulation", gpu_correct.fp8_attention, 14),
    Section(
        "models", "Wan and HunyuanVideo-1.5 vs diffusers, same weights, small configs", gpu_correct.models, 30
    ),
    Section("pipeline", "tiny pipeline end to end vs the CPU", gpu_correct.pipeline, 25),
    Section("serve", "`ithaca serve --nproc 1` answers one job", gpu_correct.serve, 60),
    # + the FP8 parts: two quantisers and five launch settings of the kernel alone (~15 s)
    Section("attention-speed", "attention TFLOP/s per backend, fp8 too", gpu_speed.attention_speed, 40),
    Section(
        "shard",
        "Ulysses pack / FP8 quantise / unpack of one rank's share at P=8",
        gpu_speed.ulysses_shard,
        30,
    ),
    # the FP8 rows add 3 × (a recompile of one block + 6 forwards) to the bf16 rows' 30 s and 89 s (H100)
    Section("wan-1.3b", "Wan2.1-1.3B forward, ours vs diffusers, bf16 and FP8", gpu_speed.wan_1_3b, 100),
    Section("wan-14b", "Wan2.1-14B forward, ours vs diffusers, bf16 and FP8", gpu_speed.wan_14b, 180),
    Section("modelled", "MODELLED 8-GPU step time", gpu_modelled.modelled, 1),
    Section("overlap", "overlapped Ulysses, MODELLED exchanges", gpu_modelled.overlap, 10),
    # the second call: issue 28's sections first (the job by phase, the MP4 after the last frame, the decode),
    # then what was measured before or belongs to closed issues, so a short call cuts the least needed
    Section("job", "Wan2.1-1.3B job by phase", gpu_speed.job_phases, 40),
    # ~80 s on an H200: the 40-step CFG row times 2 steps and multiplies (bench/gpu_whole.py)
    Section("whole-job", "Wan2.1-14B 480p whole job by phase, 1 GPU + MODELLED 8", gpu_whole.whole_job, 100),
    # ~3.3 s per float32 decode (H100), 3 per row: 3 dtypes + 4 rows of settings
    Section("vae", "VAE decode per --vae-dtype and conv setting, 81 frames 480p", gpu_speed.vae_decode, 90),
    Section(
        "hunyuan-vae",
        "HunyuanVideo-1.5 VAE decode, whole video vs a latent frame at a time",
        gpu_hunyuan_vae.hunyuan_vae,
        45,
    ),  # fmt: skip
    Section("text", "text encode (UMT5-XXL)", gpu_speed.text_encode, 30),
    # the 14B's part: building it and copying its ~26 GB of block weights to the host and back a few times
    Section(
        "lora", "LoRA per request: a switch at Wan2.1-1.3B (bf16, FP8) and 14B", gpu_lora.lora_switch, 80
    ),
    # ~45 s on an H100 at the job section's 1.3 s per guided step of 81 frames
    Section("batch", "Wan2.1-1.3B jobs per minute, 1, 2 and 4 jobs per batch", gpu_batch.batch_jobs, 60),
    Section("hunyuan", "HunyuanVideo-1.5 480p forward, ours vs diffusers", gpu_speed.hunyuan, 90),
)


# the two device calls that run every section within the 540 s budget each (tests/test_bench_gpu.py)
SPLIT = (
    ("attention", "fp8", "fp8-attention", "models", "pipeline", "serve", "attention-speed", "shard",
     "wan-1.3b", "wan-14b", "modelled", "overlap"),
    ("job", "whole-job", "vae", "hunyuan-vae", "text", "lora", "batch", "hunyuan"),
)  # fmt: skip


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment(kit: Kit) -> dict:
    env = dict(
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        device=torch.cuda.get_device_name() if kit.cuda else f"CPU ({torch.get_num_threads()} threads)",
        torch=torch.__version__,
        cuda=torch.version.cuda,
        python=sys.version.split()[0],
        flash_attn=_version("flash-attn"),
        diffusers=_version("diffusers"),
        mode="--cpu-smoke (toy sizes)" if kit.smoke else "full sizes",
    )
    if kit.cuda:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        try:
            env["driver"] = subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            env["driver"] = f"unknown ({e})"
        env["cudnn"] = torch.backends.cudnn.version()
    return env


def slowdown_counters(smi_performance: str) -> dict[str, float]:
    """Seconds each clock slowdown reason has held the GPU since boot, from the "Clocks Event Reasons
    Counters" block of `nvidia-smi -q -d PERFORMANCE` ("SW Thermal Slowdown : 181785130 us" → 181.8 s)."""
    counters, inside = {}, False
    for line in smi_performance.splitlines():
        if line.strip().startswith("Clocks Event Reasons Counters"):
            inside = True
        elif inside and ":" in line and line.rstrip().endswith(" us"):
            name, value = (part.strip() for part in line.split(":", 1))
            counters[name] = int(value.removesuffix("us")) / 1e6
        elif inside and line.strip():
            break
    return counters


POWER_CAP = "SW Power Capping"


def read_slowdowns(kit: Kit) -> dict[str, float]:
    """The GPU's slowdown counters now ({} without CUDA or nvidia-smi): a section that ran while the GPU
    throttled for heat times slower than the chip is, and its heading says so."""
    if not kit.cuda:
        return {}
    try:
        smi = subprocess.run(
            ["nvidia-smi", "-q", "-d", "PERFORMANCE"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    return slowdown_counters(smi.stdout)


def throttled(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Seconds of each slowdown reason between two readings (the ones that moved; Sync Boost is not one)."""
    moved = {k: after[k] - before.get(k, after[k]) for k in after if k != "Sync Boost"}
    return {k: round(v, 1) for k, v in moved.items() if v >= 0.1}


def run_section(section: Section, kit: Kit, budget: float) -> dict:
    """Run one section; its status is pass, fail (a check failed or it raised) or skip (with why)."""
    report = Report(smoke=kit.smoke)
    start, counters = time.monotonic(), read_slowdowns(kit)
    status, why = "pass", ""
    if not kit.cuda and not kit.smoke:
        status, why = "skip", "needs CUDA (none here); --cpu-smoke runs it at toy sizes on the CPU"
    elif budget > kit.left():
        status, why = "skip", f"would not fit: budget {budget:.0f} s, {max(kit.left(), 0):.0f} s left"
    else:
        try:
            section.run(kit, report)
            status = "fail" if report.failed else "pass"
        except Skip as e:
            status, why = "skip", str(e)
        except Exception as e:  # noqa: BLE001 - a broken section is reported, the next one still runs
            if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] not in OURS:
                status, why = "skip", f"{e.name} not installed"  # an optional package (diffusers, fastapi…)
            else:
                status, why = "fail", f"{type(e).__name__}: {e}"
                traceback.print_exc()
    seconds = time.monotonic() - start
    slowed = throttled(counters, read_slowdowns(kit))
    return dict(
        title=section.title,
        status=status,
        why=why,
        seconds=seconds,
        budget_s=budget,
        throttled=slowed,
        **vars(report),
    )


def _row(cells) -> str:
    return "| " + " | ".join(fmt(c).replace("|", "\\|") for c in cells) + " |"


def markdown(env: dict, results: dict) -> str:
    where = (
        f"{env['device']}, driver {env.get('driver', '–')}, CUDA {env['cuda'] or '–'}, torch {env['torch']}"
    )
    out = [
        f"## {env['date']} — {where}",
        "",
        f"`python bench/gpu.py` ({env['mode']}); flash-attn: {env['flash_attn']}; diffusers: "
        f"{env['diffusers']}; Python {env['python']}.",
        "",
    ]
    for name, r in results.items():
        head = f"### {r['title']} (`{name}`): {r['status'].upper()}"
        out += [head + (f" — {r['why']}" if r["why"] else f" ({r['seconds']:.1f} s)"), ""]
        slowed = r.get("throttled") or {}
        what = ", ".join(f"{k} {v} s" for k, v in slowed.items())
        if any(k != POWER_CAP for k in slowed):
            out += [
                f"**The GPU throttled during this section** ({what}): its timings are low, not the chip's.",
                "",
            ]
        elif slowed:  # a full-load GEMM on an H100 meets its 700 W limit: that is the chip's own speed
            out += [f"At its power limit during this section ({what}).", ""]
        if r["checks"]:
            out += ["| check | error | limit | result |", "| --- | ---: | ---: | --- |"]
            for c in r["checks"]:
                result = "skip: " + c["why"] if c["ok"] is None else ("pass" if c["ok"] else "FAIL")
                out.append(_row([c["what"], c.get("value"), c.get("limit"), result]))
            out.append("")
        for t in r["tables"]:
            out += [
                f"{t['title']}",
                "",
                _row(t["columns"]),
                "| " + " | ".join("---" for _ in t["columns"]) + " |",
            ]
            out += [_row(row) for row in t["rows"]] + [""]
        for t in r["targets"]:
            verdict = {True: "met", False: "MISSED", None: "not judged (toy size or not measured)"}[t["met"]]
            sign = "≥" if t["higher"] else "≤"
            out.append(f"- target {t['what']} {sign} {t['limit']} {t['unit']}: {fmt(t['value'])} → {verdict}")
        out += [f"- {n}" for n in r["notes"]]
        if r["targets"] or r["notes"]:
            out.append("")
    return "\n".join(out)


def context_lost(kit: Kit) -> bool:
    """Whether this process can no longer run a CUDA kernel: a sticky error (an illegal memory access, a
    device-side assert) fails every later call in the process, so the kit goes on in a fresh one."""
    if not kit.cuda:
        return False
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device=kit.device).add(1).item() != 2
    except RuntimeError:  # torch.AcceleratorError is one
        return True


def restart(out: Path, rest: list[str], left: float) -> None:
    """Replace this process by the kit for the sections `rest`, keeping the results so far (--resume)."""
    print(f"[gpu.py] the CUDA context is lost: going on in a new process with {' '.join(rest)}", flush=True)
    argv = [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--budget", f"{left:.0f}"]
    os.execv(sys.executable, [*argv, "--resume", "--only", *rest])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="/tmp/ithaca-gpu", help="folder for gpu.md and gpu.json")
    p.add_argument("--only", nargs="+", choices=[s.name for s in SECTIONS], help="run these sections only")
    p.add_argument("--budget", type=at_least(0, float), default=540.0, help="seconds the whole kit may take")
    p.add_argument("--cpu-smoke", action="store_true", help="every section at toy sizes on the CPU")
    p.add_argument("--resume", action="store_true", help="add to the sections already in --out's gpu.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not args.cpu_smoke
    with tempfile.TemporaryDirectory(prefix="ithaca-gpu-") as tmp:
        kit = Kit(
            torch.device("cuda" if cuda else "cpu"), args.cpu_smoke, Path(tmp), time.monotonic() + args.budget
        )
        env, results = environment(kit), {}
        if args.resume:
            earlier = json.loads((out / "gpu.json").read_text())
            env, results = earlier["env"], earlier["sections"]
        names = [s.name for s in SECTIONS if not args.only or s.name in args.only]
        for section in SECTIONS:
            if section.name not in names:
                continue
            budget = section.budget_s * (SMOKE_SCALE if kit.smoke else 1)
            print(f"[gpu.py] {section.name} (budget {budget:.0f} s, {kit.left():.0f} s left)", flush=True)
            results[section.name] = run_section(section, kit, budget)
            r = results[section.name]
            print(f"[gpu.py] {section.name}: {r['status']} {r['why']} ({r['seconds']:.1f} s)", flush=True)
            (out / "gpu.json").write_text(json.dumps(dict(env=env, sections=results), indent=1, default=str))
            (out / "gpu.md").write_text(markdown(env, results) + "\n")
            rest = names[names.index(section.name) + 1 :]
            if r["status"] == "fail" and rest and context_lost(kit):
                restart(out, rest, kit.left())
    print(markdown(env, results))
    return 1 if any(r["status"] == "fail" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
