"""The `ithaca` console script end to end: `generate` writes a playable MP4, bad input exits 2 with the field
named, `parity --nproc 2` compares 1 rank with 2 (launched ranks, gloo on CPU) and prints each row as
its run ends; a bad setting is one line and exit code 2 before any rank starts."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dit.video import read_mp4
from testing import fake_ffmpeg

ITHACA = shutil.which("ithaca") or str(Path(sys.executable).parent / "ithaca")


def _run(*args, cwd, env=None):
    return subprocess.run([ITHACA, *args], capture_output=True, text=True, cwd=cwd, timeout=240,
                          env=os.environ | (env or {}))  # fmt: skip


def test_generate_writes_the_mp4_as_asked(tmp_path):
    """The README's first command; it loads only what the tiny model needs: Ithaca's own Wan VAE, UMT5 and
    sampler, not diffusers or transformers (seconds of imports), nor dynamo."""
    proc = _run("generate", "a red circle moving right", "--out", "video.mp4", cwd=tmp_path,
                env={"PYTHONPROFILEIMPORTTIME": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if "import time:" in line}
    heavy = {m for m in imported if m.split(".")[0] in ("diffusers", "transformers") or m == "torch._dynamo"}
    assert len(imported) > 500 and not heavy, sorted(heavy)
    said = [line for line in proc.stderr.splitlines() if "import time:" not in line]
    video = read_mp4(tmp_path / "video.mp4")
    assert video.frames.shape == (17, 64, 64, 3)  # the trained tiny model's defaults
    assert (video.fps, video.codec, video.pix_fmt) == (16.0, "h264", "yuv420p")
    assert "wrote video.mp4: 17 frames 64x64 @ 16 fps" in proc.stdout
    assert not [line for line in said if "warning" in line]  # every word of the prompt is one the model knows

    proc = _run("generate", "a fox", "--out", "small.mp4", "--frames", "5", "--height", "32", "--width", "48",
                "--steps", "2", "--fps", "8", "--negative-prompt", "blurry", "--guidance", "1",
                cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    video = read_mp4(tmp_path / "small.mp4")
    assert (video.frames.shape, video.fps) == ((5, 32, 48, 3), 8.0)
    warning = "ithaca generate: warning: the model does not know the words fox: it draws coloured shapes"
    assert warning in proc.stderr  # the tiny model declares its vocabulary (dit/tiny/model/vocabulary.json)
    assert "warning: the negative prompt is unused: guidance 1 runs no pass with it" in proc.stderr  # unsaid


def test_the_readmes_python_block_makes_the_clis_video(tmp_path, monkeypatch, capsys):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("### From Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md", "exec"), {})
    assert "step 12/12" in capsys.readouterr().out
    proc = _run("generate", "a yellow triangle moving up", "--seed", "7", "--out", "cli.mp4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (read_mp4(tmp_path / "video.mp4").frames == read_mp4(tmp_path / "cli.mp4").frames).all()


def test_a_video_that_cannot_be_made_is_one_line_exit_1_and_no_file(
    tmp_path, tmp_path_factory, monkeypatch, capsys
):
    from dit import vae_frames
    from dit.failures import GenerationFailed
    from server.cli import main

    def overflowed(video):
        raise GenerationFailed("the VAE decode in float16 gave non-finite values (an overflow): ...")

    monkeypatch.setattr(vae_frames, "quantize", overflowed)
    out = tmp_path / "video.mp4"
    assert main(["generate", "a red circle", "--out", str(out), "--steps", "2", "--frames", "5"]) == 1
    assert (
        "ithaca generate: error: the VAE decode in float16 gave non-finite values" in capsys.readouterr().err
    )
    assert not out.exists()
    monkeypatch.undo()

    # ffmpeg died of a full disk: a broken pipe, then the disk says why
    monkeypatch.setenv(
        "IMAGEIO_FFMPEG_EXE",
        fake_ffmpeg.fake_ffmpeg(tmp_path_factory.mktemp("bin"), fake_ffmpeg.DIES_MID_WRITE),
    )
    monkeypatch.setattr("shutil.disk_usage", lambda folder: SimpleNamespace(free=0))
    assert main(["generate", "a red circle", "--out", str(out), "--steps", "2", "--frames", "5"]) == 1
    said = capsys.readouterr().err.splitlines()[-1].removeprefix("ithaca generate: error: ")
    assert said == f"the MP4 was not written: its disk is full (0 KiB free in {tmp_path})"
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_out_the_writer_cannot_write_is_refused_before_the_model_loads(tmp_path, capsys):
    from server.cli import main

    (tmp_path / "folder.mp4").mkdir()
    (tmp_path / "file").write_text("x")
    for out, says in (
        ("video", "--out video: the video is an MP4; give a file name ending in .mp4"),
        (tmp_path / "folder.mp4", "folder.mp4 is a folder"),
        (tmp_path / "file" / "v.mp4", f"{tmp_path / 'file'} is a file, not a folder"),
    ):
        assert main(["generate", "a red circle", "--out", str(out)]) == 2
        assert says in capsys.readouterr().err


def test_a_node_rank_that_numbers_no_machine_is_refused(monkeypatch, capsys):
    from server.cli import main

    for node, says in (("1", "--node-rank 1: this run is one machine (node 0)"), ("-1", "--node-rank -1: ")):
        assert main(["generate", "a red circle", "--node-rank", node]) == 2
        assert says in capsys.readouterr().err
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")  # torchrun --nnodes 2
    assert main(["generate", "a red circle", "--node-rank", "2"]) == 2
    assert "--node-rank 2 is not one of the 2 machines, 0 to 1" in capsys.readouterr().err


def test_a_stopped_generate_leaves_no_rank_and_the_out_it_found(tmp_path):
    """SIGTERM to `ithaca generate --nproc 2` alone (not its process group): the launcher is told, every rank
    stops and cleans up (none runs on to write the video), and the --out that was there stays as it was."""
    import signal
    import time

    out = tmp_path / "kept.mp4"
    out.write_bytes(b"an earlier video")
    argv = [ITHACA, "generate", "a red circle moving right", "--nproc", "2", "--steps", "50",
            "--frames", "33", "--height", "256", "--width", "256", "--out", str(out)]  # fmt: skip
    parent = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def ranks() -> list[str]:  # this test's ranks, by their --out in the command line
        pids = [pid for pid in os.listdir("/proc") if pid.isdigit() and int(pid) != parent.pid]
        found = []
        for pid in pids:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if str(out).encode() in cmdline and b"local_group" not in cmdline:
                found.append(pid)
        return found

    deadline = time.monotonic() + 60
    while len(ranks()) < 2 and parent.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # the ranks past their start, into the model's load or the steps
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=60) == 128 + signal.SIGTERM, parent.stderr.read()
    said = parent.stderr.read().splitlines()  # once, by the command (ranks stopped while starting: nothing)
    assert said.count("ithaca generate: interrupted; no video written") == 1 and said[-1].endswith("written")
    deadline = time.monotonic() + 10
    while ranks() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ranks() == [] and out.read_bytes() == b"an earlier video"
    assert [p.name for p in tmp_path.iterdir()] == ["kept.mp4"]


def test_a_generate_stopped_while_its_ranks_start_says_so(monkeypatch, capsys, tmp_path):
    """Ranks that a SIGTERM reaches before they can say anything (importing torch) end silently: the
    command says it, once the launcher has stopped them (it exited 143 with nothing said)."""
    import signal

    import dit.cli
    from dit.cli_args import Interrupted
    from server.cli import main

    def stopped(nproc, argv):
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(dit.cli, "run_on_ranks", stopped)
    assert main(["generate", "a red circle", "--nproc", "2"]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "ithaca generate: interrupted; no video written\n"

    out = tmp_path / "v.mp4"

    def too_late(nproc, argv):  # the ranks had put the video in place: it said "no video written", 130
        out.write_bytes(b"the new video")
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(dit.cli, "run_on_ranks", too_late)
    assert main(["generate", "a red circle", "--nproc", "2", "--out", str(out)]) == 0
    assert capsys.readouterr().err == f"ithaca generate: interrupted once the video was written ({out})\n"


def test_ranks_stopped_in_their_checks_leave_the_word_to_their_command(monkeypatch, capsys):
    """A Ctrl-C that reached ranks of `generate --nproc N` still importing or checking: each said
    "interrupted" (nine lines at --nproc 8), and then the command did too."""
    import dit.cli
    from server.cli import main

    def stopped(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(dit.cli, "run_generate", stopped)
    monkeypatch.setenv("ITHACA_LOCAL_GROUP", "1")  # what parallel.local_group gives its ranks
    monkeypatch.setenv("RANK", "0")
    assert main(["generate", "a red circle"]) == 130 and capsys.readouterr().err == ""
    monkeypatch.delenv("ITHACA_LOCAL_GROUP")  # a launch by hand: rank 0 says it
    assert main(["generate", "a red circle"]) == 130
    assert capsys.readouterr().err == "ithaca generate: interrupted\n"


def test_a_serve_stopped_before_its_server_runs_says_so_in_the_logs_format(monkeypatch, capsys):
    """Ctrl-C during serve's checks (a Hub look-up, the layout): "interrupted" was plain text among a JSON
    collector's records."""
    import server.cli

    def stopped(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(server.cli, "serve", stopped)
    assert server.cli.main(["serve", "--log-format", "json"]) == 130
    said = json.loads(capsys.readouterr().err)
    assert (said["level"], said["message"]) == ("error", "ithaca serve: interrupted"), said


def test_a_sigterm_before_the_server_runs_is_said_and_exits_143():
    """serve's start-up (its checks, a Hub look-up) before uvicorn takes the signals: SIGTERM ended it with
    no word at all."""
    code = (
        "import os, signal, sys, time, server.cli\n"
        "def serve(args):\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(10)\n"
        "server.cli.serve = serve\n"
        "sys.exit(server.cli.main(['serve', '--log-format', 'json']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 143, proc
    assert json.loads(proc.stderr)["message"] == "ithaca serve: interrupted", proc.stderr


def test_a_world_size_left_in_the_shell_is_no_launch(monkeypatch, capsys):
    """`WORLD_SIZE=1 ithaca generate --nproc 2` ran on one rank (a rank of a launch has RANK too), and with
    --ulysses 2 said the degrees "do not fit --nproc 1"."""
    import dit.cli
    from parallel.local_group import launched
    from server.cli import main

    assert not launched({"WORLD_SIZE": "1"}) and launched({"WORLD_SIZE": "2", "RANK": "0"})
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("RANK", raising=False)
    ran = []
    monkeypatch.setattr(
        dit.cli, "run_on_ranks", lambda nproc, argv: ran.append(nproc) or SimpleNamespace(returncode=0)
    )
    assert main(["generate", "a red circle", "--nproc", "2", "--ulysses", "2"]) == 0 and ran == [2]


def test_a_stopped_parity_stops_every_mode_and_leaves_nothing(tmp_path):
    """SIGTERM to `ithaca parity` during a mode's run: that run's ranks stopped, then the run went on to the
    next mode and ended in a FAIL. Now the whole run stops: one line, exit 143, no rank, no folder left."""
    import signal
    import time

    temp = tmp_path / "temp"
    temp.mkdir()
    argv = [ITHACA, "parity", "--nproc", "2", "--modes", "alltoall,ring", "--steps", "30", "--frames", "17",
            "--height", "128", "--width", "128"]  # fmt: skip
    parent = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=os.environ | {"TMPDIR": str(temp)})  # fmt: skip

    def ranks() -> list[str]:  # the runs' processes, by their --out under this test's TMPDIR
        found = []
        for pid in (pid for pid in os.listdir("/proc") if pid.isdigit() and int(pid) != parent.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if str(temp).encode() in cmdline and b"alltoall" in cmdline and b"local_group" not in cmdline:
                found.append(pid)
        return found

    deadline = time.monotonic() + 120
    while len(ranks()) < 2 and parent.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)  # the ranks past their start
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=60) == 128 + signal.SIGTERM
    assert parent.stderr.read().splitlines()[-1] == "ithaca parity: interrupted"
    deadline = time.monotonic() + 10
    while ranks() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ranks() == [] and list(temp.iterdir()) == []


def test_a_stopped_one_rank_generate_leaves_no_partial_video(tmp_path):
    """SIGTERM to `ithaca generate` on one rank while its MP4 is being written: it killed the process, which
    left `.NAME.partial.mp4` and said nothing; it ends as Ctrl-C does."""
    import signal
    import time

    out, partial = tmp_path / "v.mp4", tmp_path / ".v.partial.mp4"
    argv = [ITHACA, "generate", "a red circle moving right", "--steps", "2", "--frames", "33",
            "--height", "256", "--width", "256", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not partial.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM  # it said 130, Ctrl-C's, of every signal
    assert proc.stderr.read().splitlines()[-1] == "ithaca generate: interrupted; no video written"
    assert list(tmp_path.iterdir()) == []


def test_a_generate_stopped_mid_denoising_says_so_on_a_line_of_its_own(tmp_path):
    """The progress bar's line ends first: the message came after the bar on its line, and the bar was drawn
    again below it (closed only at exit)."""
    import signal

    argv = [ITHACA, "generate", "a red circle moving right", "--steps", "50", "--frames", "33",
            "--height", "128", "--width", "128", "--out", str(tmp_path / "v.mp4")]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    said = ""
    while not re.search(r"\| [1-9]\d*/50", said) and proc.poll() is None:  # a step drawn: the bar is on
        said += proc.stderr.read(1)
    proc.send_signal(signal.SIGTERM)
    said += proc.stderr.read()
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert said.endswith("step/s]\nithaca generate: interrupted; no video written\n"), said[-200:]
    assert list(tmp_path.iterdir()) == []


def test_expert_settings_that_do_not_fit_the_model_are_refused_before_any_rank(tmp_path, capsys, monkeypatch):
    import dit.cli
    from server.cli import main

    assert main(["generate", "a red circle", "--offload-idle-expert"]) == 2  # as --guidance-2 is
    assert (
        "--offload-idle-expert is for two-expert models (Wan2.2 A14B); this model has one"
        in capsys.readouterr().err
    )
    monkeypatch.setattr(dit.cli, "run_on_ranks", lambda *a, **k: pytest.fail("ranks launched"))
    lora = tmp_path / "x.safetensors"
    lora.write_bytes(b"")  # refused for the model before the file is read
    assert (
        main(["generate", "a fox", "--preset", "tiny-moe-random", "--nproc", "2", "--lora", str(lora)]) == 2
    )
    assert "error: --lora: LoRAs on a two-expert model (Wan2.2 A14B)" in capsys.readouterr().err
    # it was said only once the model loaded: after the ranks started, and parity took it for a failed run
    assert main(["generate", "a fox", "--nproc", "2", "--guidance-2", "2"]) == 2
    assert "error: --guidance-2 is for two-expert models (Wan2.2 A14B)" in capsys.readouterr().err


def test_a_save_latents_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys):
    from server.cli import main

    out = str(tmp_path / "x.mp4")
    assert main(["generate", "a red circle", "--save-latents", str(tmp_path), "--out", out]) == 2
    assert f"--save-latents {tmp_path} is a folder; give a file name" in capsys.readouterr().err
    (tmp_path / "afile").write_text("")
    assert (
        main(["generate", "a red circle", "--save-latents", str(tmp_path / "afile/x.pt"), "--out", out]) == 2
    )
    assert "afile is a file, not a folder" in capsys.readouterr().err


def test_generate_rejects_bad_input(tmp_path):
    proc = _run("generate", "a fox", "--frames", "8", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--frames must be 4k+1 between 5 and 33, got 8" in proc.stderr
    assert not (tmp_path / "video.mp4").exists()


def _copy_of_tiny(tmp_path) -> Path:
    from dit.presets import SHIPPED

    return Path(shutil.copytree(SHIPPED["tiny"], tmp_path / "my-tiny"))


def test_a_folder_missing_a_part_is_refused_not_stood_in_for(tmp_path, capsys):
    """A pipeline folder without its vae/ or text_encoder/ made noise, or a video that ignored its prompt:
    the tiny random stand-ins took their place. Refused before any rank starts, and by load_pipeline, as are
    a part's config that is not JSON and weights cut short in a copy, each named."""
    from dit.pipeline import PipelineConfig, load_pipeline
    from server.cli import main

    def weightless(folder):
        for weights in (folder / "transformer").glob("*.safetensors"):
            weights.unlink()

    def cut_short(folder):  # a copy that stopped part way
        for weights in (folder / "transformer").glob("*.safetensors"):
            os.truncate(weights, 1000)

    breaks = {
        "model_index.json names vae/, which the folder lacks": lambda f: shutil.rmtree(f / "vae"),
        "names text_encoder/, which": lambda f: shutil.rmtree(f / "text_encoder"),
        "transformer/ holds no *.safetensors weights": weightless,
        "scheduler/scheduler_config.json is not JSON": lambda f: (
            f / "scheduler/scheduler_config.json"
        ).write_text("{"),
        "diffusion_pytorch_model.safetensors is not a readable safetensors file": cut_short,
        # parts rank 0 alone loads: on 2 ranks the other said a collective's traceback, exit 1
        "text_encoder/model.safetensors is cut short (5000 of its": lambda f: os.truncate(
            f / "text_encoder/model.safetensors", 5000
        ),
        "tokenizer/tokenizer.json is not JSON": lambda f: (f / "tokenizer/tokenizer.json").write_text("{bad"),
        "vae/config.json is not JSON": lambda f: (f / "vae/config.json").write_text("{bad"),
        # JSON of another kind: an AttributeError's traceback, exit 1
        "model_index.json is not a JSON object: it holds list [1, 2]": lambda f: (
            f / "model_index.json"
        ).write_text("[1, 2]"),
        "transformer/config.json is not a JSON object": lambda f: (f / "transformer/config.json").write_text(
            "[]"
        ),
        # a part linked in whose target is gone (a typo in the few-step recipe's `ln -s`): as absent
        "vae is a link to": lambda f: shutil.rmtree(f / "vae") or (f / "vae").symlink_to(f / "gone"),
    }
    for i, (said, damage) in enumerate(breaks.items()):
        folder = _copy_of_tiny(tmp_path / str(i))
        damage(folder)
        with pytest.raises(ValueError, match=re.escape(said)):
            load_pipeline(PipelineConfig(model=str(folder), device="cpu"))
        out = tmp_path / "x.mp4"
        argv = ["generate", "a red circle", "--model-path", str(folder), "--out", str(out), "--nproc", "2"]
        assert main(argv) == 2  # said before any rank starts
        assert said in capsys.readouterr().err and not out.exists()
    from dit.parts import check_parts

    folder = _copy_of_tiny(tmp_path / "notes")
    (folder / "NOTES.md").symlink_to(tmp_path / "gone.md")  # no part: no matter
    check_parts(folder)


def test_generate_names_its_exchange_and_warns_of_one_it_cannot_use(tmp_path):
    """A lossy --comm moves the latents: the result line names the exchange; with no Ulysses exchange in the
    layout (a ring alone) --comm went unused without a word."""
    video = ["--steps", "1", "--frames", "5", "--height", "32", "--width", "32", "--nproc", "2"]
    ring = _run(
        "generate", "a red circle", *video, "--ring", "2", "--comm", "fp8", "--out", "r.mp4", cwd=tmp_path
    )
    assert ring.returncode == 0, ring.stderr
    assert (
        "warning: --comm fp8 is Ulysses' exchange, and this layout has none (ulysses 1): unused"
        in ring.stderr
    )
    ulysses = _run("generate", "a red circle", *video, "--ulysses", "2", "--comm", "p2p", "--out", "u.mp4",
                   cwd=tmp_path)  # fmt: skip
    assert "ulysses 2 x ring 1 x cfg 1 over p2p (2 ranks)" in ulysses.stdout, ulysses.stdout + ulysses.stderr


def test_a_part_only_rank_0_loads_that_does_not_fit_is_one_line_on_any_ranks(tmp_path):
    """Weights that do not fit their config are found only as they load, and rank 0 alone loads the text
    encoder: the other rank ended in a collective's traceback (40 lines, exit 1)."""
    folder = _copy_of_tiny(tmp_path)
    config = folder / "text_encoder" / "config.json"
    config.write_text(config.read_text().replace('"d_model": 64', '"d_model": 128'))
    argv = [ITHACA, "generate", "a red circle", "--model-path", str(folder), "--nproc", "2", "--out",
            str(tmp_path / "v.mp4")]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if not line.startswith("layout:")]
    assert line.startswith("ithaca generate: error: text_encoder/: ") and "!= expected" in line, line


def test_a_weights_header_is_read_without_torch_and_its_data_counted(tmp_path):
    """What the parts check reads of a safetensors file: its header, and the size the header promises."""
    import json
    import struct

    from dit.parts import _check_safetensors

    def write(name: str, header, data: bytes = b"") -> Path:
        text = json.dumps(header).encode()
        (tmp_path / name).write_bytes(struct.pack("<Q", len(text)) + text + data)
        return tmp_path / name

    entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    _check_safetensors(write("whole.safetensors", {"a": entry, "__metadata__": {"format": "pt"}}, b"x" * 8))
    with pytest.raises(ValueError, match=r"short.safetensors is cut short \(\d+ of its \d+ bytes\)"):
        _check_safetensors(write("short.safetensors", {"a": entry}, b"x" * 4))
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 20)
    for path in (write("odd.safetensors", {"a": [1, 2]}), tmp_path / "junk.safetensors"):
        with pytest.raises(ValueError, match="is not a readable safetensors file"):
            _check_safetensors(path)


def test_a_request_mistake_is_reported_before_any_model_code_loads(tmp_path):
    """The limits come from the folder's configs and card: diffusers, transformers (and the peft diffusers
    pulls in) are never imported, which is what made a wrong --frames take the model's load time."""
    folder = _copy_of_tiny(tmp_path)
    script = f"""
import sys
from server.cli import main
for argv in (["--frames", "8"], ["--height", "70", "--width", "90"], ["--model-path", {str(folder)!r},
             "--frames", "37"], ["--steps", "51"]):
    assert main(["generate", "a fox", *argv]) == 2, argv
loaded = sorted({{"diffusers", "transformers", "peft"}} & set(sys.modules))
assert not loaded, loaded
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "ithaca generate: error: --frames must be 4k+1 between 5 and 33, got 8",
        "ithaca generate: error: --height and --width must be multiples of 16 between 16 and 256, got 70 "
        "and 90",
        "ithaca generate: error: --frames must be 4k+1 between 5 and 33, got 37",  # the copy's own card
        "ithaca generate: error: --steps must be an integer between 1 and 50, got 51",
    ]


@pytest.mark.parametrize(
    "message,said",
    [
        ("fps must be an integer between 1 and 60", "--fps must be an integer between 1 and 60"),
        ("height and width must be multiples of 16", "--height and --width must be multiples of 16"),
        ("guidance_scale must be between 1.0 and 20.0", "--guidance must be between 1.0 and 20.0"),
        (
            "image: this image-to-video model needs a first-frame image",
            "--image: this image-to-video model needs a first-frame image",
        ),
        ("not a folder and not in the Hugging Face cache", "not a folder and not in the Hugging Face cache"),
    ],
)
def test_errors_name_the_flags(message, said):
    from dit.cli_args import in_flags

    assert in_flags(message) == said


def test_a_copied_model_folder_keeps_its_defaults(tmp_path, capsys):
    """A copy of the shipped folder given by --model-path is the tiny model, defaults and limits included
    (its ithaca.json), not a generic Wan folder (81 frames of 480×832)."""
    from dit.model_card import read_card, write_card
    from dit.pipeline import GenerationRequest
    from dit.presets import SHIPPED
    from dit.shape import request_limits
    from dit.tiny.train import TrainConfig, card_limits
    from server.cli import main

    folder = _copy_of_tiny(tmp_path)
    limits = request_limits(str(folder))
    assert (limits.default_frames, limits.default_height, limits.default_width) == (17, 64, 64)
    assert (limits.default_steps, limits.default_guidance, limits.max_frames) == (12, 3.0, 33)
    assert limits == request_limits("tiny")
    # the shipped card is the one the trainer writes for the shipped training settings
    trained = TrainConfig(**json.loads((SHIPPED["tiny"] / "training.json").read_text()))
    (tmp_path / "written").mkdir()
    write_card(tmp_path / "written", card_limits(trained))
    assert read_card(tmp_path / "written") == read_card(SHIPPED["tiny"])

    out = tmp_path / "copy.mp4"
    argv = ["generate", "a red circle", "--model-path", str(folder), "--steps", "1", "--out", str(out)]
    assert main(argv) == 0
    assert read_mp4(out).frames.shape == (17, 64, 64, 3)
    assert f"wrote {out}: 17 frames 64x64 @ 16 fps, 1 step," in capsys.readouterr().out

    card = json.loads((folder / "ithaca.json").read_text())
    for bad, says in (({**card, "frames": 9}, "unknown key 'frames'"),
                      ({**card, "default_frames": 37}, "default_frames 37 is outside min_frames 5 to max"),
                      ({**card, "max_size": "big"}, "max_size must be a number, got 'big'")):  # fmt: skip
        (folder / "ithaca.json").write_text(json.dumps(bad))
        line = _preflight_error(model_path=str(folder), request=GenerationRequest("a fox"))
        assert line.startswith(f"{folder / 'ithaca.json'}: ") and says in line, line


@pytest.mark.slow
def test_parity_two_ranks_prints_each_row_as_its_run_ends(tmp_path):
    # texts that start with "-" reach the runs as text (they were taken for options: the reference run failed)
    # bfloat16: the ring drifts (its blocks round on their own), held to --fp8-tol; it failed at 2e-2
    argv = ["parity", "--nproc", "2", "--modes", "alltoall,cfg,hybrid,cfg,ring", "--steps", "2",
            "--frames", "5", "--height", "32", "--width", "48", "--json", "--prompt=-a red circle",
            "--negative-prompt=-blurry", "--dtype", "bfloat16"]  # fmt: skip
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen([ITHACA, *argv], cwd=tmp_path, **pipes)
    try:
        said = proc.stderr.readline()  # what every run is, then the table: on stderr as it grows (--json)
        progress = [proc.stderr.readline() for _ in range(3)]
        still_running = proc.poll() is None  # the cfg run has not started yet
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, out + said + "".join(progress) + err
    assert (
        said.startswith("each run: ithaca generate --preset tiny --dtype bfloat16 ")
        and "-- '-a red circle'" in said
    )
    assert progress[0].split()[:2] == ["mode", "ranks"], progress
    assert progress[1].split()[:3] == ["reference", "1", "1x1x1"], progress
    assert progress[2].split()[:3] == ["alltoall", "2", "2x1x1"] and progress[2].rstrip().endswith("ok")
    assert still_running, "the first mode's row came only once every run had ended"
    assert err.splitlines()[-1] == "parity: 3 of 4 modes match 1 rank, 1 skipped"  # cfg named twice: run once
    report = json.loads(out)  # stdout holds the one JSON document
    rows = {row["mode"]: row for row in report["rows"]}
    assert report["ok"] and rows["alltoall"]["status"] == rows["cfg"]["status"] == "ok"
    assert rows["alltoall"]["layout"] == "2x1x1" and rows["cfg"]["layout"] == "1x1x2"
    assert rows["cfg"]["latents_rel"] <= 1e-5 and rows["cfg"]["frames_max_abs"] <= 1
    assert rows["hybrid"]["status"] == "skipped"  # needs 4 ranks
    assert rows["ring"]["status"] == "ok" and (rows["ring"]["tol"], rows["cfg"]["tol"]) == (0.5, 2e-2)
    assert (rows["ring"]["frames_tol"], rows["cfg"]["frames_tol"]) == (None, 2)  # the ring's frames unchecked
    assert report["runs"][0] == "generate" and "--dtype" in report["runs"]


def test_a_parity_whose_reference_run_refuses_its_settings_exits_2(tmp_path):
    """A prompt longer than the text encoder takes is known once the run's tokenizer loads: its refusal is
    the user's mistake (exit 2, as generate's), not a failed run (exit 1)."""
    proc = _run("parity", "--nproc", "2", "--modes", "alltoall", "--prompt", "a " * 40, cwd=tmp_path)
    assert proc.returncode == 2 and "the 1-rank reference run failed" in proc.stderr, proc.stderr
    assert "tokens long" in proc.stderr


def test_generate_picks_the_hunyuan_family_from_the_preset(tmp_path):
    proc = _run("generate", 'a neon sign reading "OPEN"', "--preset", "tiny-joint", "--out", "joint.mp4",
                "--frames", "5", "--height", "32", "--width", "48", "--steps", "2", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert read_mp4(tmp_path / "joint.mp4").frames.shape == (5, 32, 48, 3)
    assert "warning" not in proc.stderr  # a model that declares no vocabulary is never warned about
    proc = _run("generate", "a fox", "--preset", "tiny-joint", "--height", "40", cwd=tmp_path)
    assert proc.returncode == 2 and "height must be a multiple of 16" in proc.stderr  # ×16 VAE


def _preflight_error(**settings) -> str:
    from dit.preflight import preflight

    with pytest.raises(ValueError) as e:
        preflight(**settings)
    return str(e.value)


def test_preflight_names_the_option_and_what_it_allows(tmp_path):
    from dit.request import GenerationRequest

    (tmp_path / "empty").mkdir()
    (tmp_path / "other" / "transformer").mkdir(parents=True)
    (tmp_path / "other" / "transformer" / "config.json").write_text(
        '{"_class_name": "FluxTransformer2DModel"}'
    )
    cases = [  # settings → what the one line says
        (dict(preset="tiny2"), "--preset 'tiny2' is not one of hunyuanvideo-1.5-480p-t2v, tiny, tiny-i2v"),
        (dict(model_path=str(tmp_path / "missing")), "missing: no such folder"),
        (dict(model_path=str(tmp_path / "empty")), "empty: not a model folder (a diffusers pipeline folder"),
        (dict(model_path=str(tmp_path / "other")), "no pipeline for model class 'FluxTransformer2DModel'"),
        (
            dict(attn_backend="fast"),
            "--attn-backend 'fast' is not one of auto, flash, cudnn, sdpa, math, fp8",
        ),
        (dict(device="gpu0"), "--device 'gpu0' is not a device; allowed: cpu, cuda, cuda:N"),
        (dict(device="cuda:99"), "--device cuda:99: "),  # no CUDA here, or fewer than 100 GPUs
        (dict(text_encoder_device="tpu"), "--text-encoder-device 'tpu' is not a device"),
        (dict(dtype="fp16"), "--dtype 'fp16' is not one of float32, bfloat16, float16"),
        (dict(vae_dtype="bf16"), "--vae-dtype 'bf16' is not one of float32, bfloat16, float16"),
        (dict(comm="nccl"), "--comm 'nccl' is not one of alltoall, fp8, p2p, p2p+fp8 (each optionally +over"),
        # named as the flag it is (it read "sampler must be 'euler', got 'renoise'")
        (dict(preset="tiny-joint", sampler="renoise"), "--sampler renoise: this model samples with euler"),
        (dict(comm="p2p+overlap1"), "--comm 'p2p+overlap1' is not one of"),
        (dict(sampler="ddim"), "--sampler 'ddim' is not one of unipc, euler"),
        (dict(nproc=0), "--nproc must be a positive integer, got 0"),
        (dict(nproc=4, cfg=3), "--cfg must be 1 or 2"),
        (dict(nproc=4, ulysses=3), "do not fit --nproc 4: ulysses=3 x ring=1 x cfg=1 does not divide world "
                                   "size 4; valid ulysses x ring x cfg for world size 4: 1x1x1, 2x1x1"),
        (dict(nproc=6, ring=4), "do not fit --nproc 6: ring=4 x cfg=1 does not divide world size 6"),
        # one video: ranks without work of their own (a second replica made the same video again)
        (dict(nproc=2, ulysses=1, request=GenerationRequest("fox")), "use 1 of the 2 ranks, and the others"),
        (dict(nproc=2, cfg=2, request=GenerationRequest("fox", guidance_scale=1.0)), "--cfg 2 runs the neg"),
        # found in the ranks before: "4 heads cannot split over ulysses=5"
        (dict(nproc=5, ulysses=5), "do not fit this model: ulysses 5 is more than its 4 attention heads"),
        (dict(nproc=5, cfg=1), "ulysses 5 is more than its 4 attention heads"),  # ulysses: the ranks left
        (dict(warmup=((64, 64, 9), (63, 64, 9))), "--warmup 63x64x9: height must be a multiple of 16"),
        (dict(flow_shift=-1.0), "--flow-shift must be a number above 0 (Wan 480p: 3, 720p: 5), got -1.0"),
        (dict(flow_shift=float("nan")), "--flow-shift must be a number above 0"),
        (dict(timesteps="750,1000"), "--timesteps must be integers in (0, 1000], strictly decreasing"),
        (dict(timesteps="5,3"), "--timesteps 5,3 are sampled with --sampler euler or renoise, not the "
                                "model's sampler, unipc"),
        (dict(timesteps="5,3", sampler="unipc"), "not --sampler unipc"),
    ]  # fmt: skip
    for settings, message in cases:
        line = _preflight_error(**settings)
        assert message in line and "\n" not in line, (settings, line)
    # CFG has two branches: "1x1x3", which --cfg refuses, is no longer offered
    assert _preflight_error(nproc=3, cfg=2).endswith(
        "valid ulysses x ring x cfg for world size 3: 1x1x1, 3x1x1, 1x3x1"
    )
    if not __import__("torch").cuda.is_available():
        assert "no CUDA device here" in _preflight_error(device="cuda")
        assert "--attn-backend flash needs a CUDA device" in _preflight_error(attn_backend="flash")
        assert "--attn-backend cudnn needs a CUDA device" in _preflight_error(attn_backend="cudnn")
    from dit.preflight import preflight

    preflight(preset="tiny-joint", device="cpu", nproc=8, ulysses=2, ring=2, cfg=2, comm="p2p+fp8")


@pytest.mark.parametrize(
    "argv, env, says",
    [
        (["generate", "a fox", "--nproc", "4", "--ulysses", "3"], {}, "--ulysses/--ring/--cfg do not fit"),
        (["generate", "a fox", "--model-path", "nowhere"], {}, "--model-path nowhere: no such folder"),
        (["parity", "--device", "cuda:99"], {}, "ithaca parity: error: --device cuda:99: "),
        (["parity", "--modes", "hybrid", "--nproc", "3"], {}, "no mode of --modes runs on --nproc 3: hybrid "
                                                              "needs an even --nproc of at least 4"),
        (["parity", "--modes", "alltoall", "--nproc", "5"], {}, "alltoall needs ulysses 5, more than the "
                                                                "model's 4 heads"),  # it ran 5 ranks to fail
        (["parity", "--nproc", "1"], {}, "--nproc must be 2 or more"),  # one rank against one: "all match"
        (["serve"], {"ITHACA_PORT": "70000"}, "ithaca serve: error: ITHACA_PORT: must be 0 to 65535"),
        (["generate", "a fox", "--out", "video"], {}, "--out video: the video is an MP4"),
        (["serve", "--attn-backend", "fast"], {}, "ithaca serve: error: --attn-backend 'fast' is not one of"),
        (["serve"], {"ITHACA_NPROC": "abc"}, "ithaca serve: error: ITHACA_NPROC: 'abc' is not an integer"),
        # a log collector's JSON, not plain text among its records
        (["serve", "--log-format", "json"], {"ITHACA_NPROC": "abc"},
         '"level": "error", "logger": "ithaca", "message": "ithaca serve: error: ITHACA_NPROC: \'abc\' is'),
        (["serve", "--attn-backend", "fast"], {"ITHACA_LOG_FORMAT": "json"},
         '"message": "ithaca serve: error: --attn-backend \'fast\' is not one of'),
        # argparse's own, and the variable in capitals as the setting takes it: plain text
        (["serve", "--log-format=json", "--port", "abc"], {},
         '"message": "ithaca serve: error: argument --port: \'abc\' is not an integer'),
        (["serve", "--nproc", "0"], {"ITHACA_LOG_FORMAT": "JSON"}, '"level": "error"'),
        (["serve"], {"ITHACA_WARMUP": "480x832"}, "ITHACA_WARMUP: '480x832' is not HEIGHTxWIDTHxFRAMES"),
        # Arabic-Indic digits: taken as 64
        (["serve", "--warmup", "٦٤x64x17"], {}, "--warmup: '٦٤x64x17' is not HEIGHTxWIDTHxFRAMES"),
        # HTTP drops a header's end spaces: a server no client could use (every request refused)
        (["serve", "--api-key", "  "], {}, "argument --api-key: has a space or tab at an end, which HTTP"),
        (["serve"], {"ITHACA_API_KEY": "k\t"}, "ITHACA_API_KEY: has a space or tab at an end"),
        (["serve", "--api-key", "ключ"], {}, "argument --api-key: must be printable ASCII (letters, digits"),
        (["serve", "--data-dir", "/dev/null/d"], {}, "--data-dir /dev/null/d: /dev/null is a file, not a"),
        # said as the command's, whose --help lists its flags (it was "ithaca: error: ... see ithaca --help")
        (["generate", "a fox", "--stpes", "4"], {},
         "ithaca generate: error: unrecognized arguments: --stpes 4 (see ithaca generate --help)"),
        # found before the model loads (after, on --nproc 2), and no --out folder is left: it was made first
        (["generate", "  ", "--nproc", "2", "--out", "nd/x.mp4"], {}, "prompt must be a non-empty string"),
        (["generate", "a red circle " * 6, "--out", "nd/x.mp4", "--ulysses", "1", "--ring", "1",
          "--cfg", "1"], {}, "prompt is 19 tokens long; the text encoder accepts at most 16"),
        # found before the ranks start (it took them 10 s)
        (["generate", "a fox", "--preset", "tiny-i2v-random", "--nproc", "2"], {}, "--image: this image-to-"),
        # read by the ranks: float()'s message, naming nothing, once they ran; -5: torch's traceback
        (["generate", "a fox", "--nproc", "2"], {"ITHACA_DIST_TIMEOUT": "abc"},
         "ithaca generate: error: ITHACA_DIST_TIMEOUT must be a number of seconds above 0, not 'abc'"),
        (["serve"], {"ITHACA_DIST_TIMEOUT": "-5"}, "ITHACA_DIST_TIMEOUT must be a number of seconds above 0"),
        # each process had a database of its own: a traceback a supervisor round, without end
        (["serve", "--db", ":memory:"], {}, "argument --db: must name a file the server's processes share"),
        # --store took it, and --db was dropped in silence
        (["serve", "--store", "sqlite:///s.db"], {"ITHACA_DB": "d.db"}, "--db and --store both name the job"),
    ],
)  # fmt: skip
def test_a_mistake_is_one_line_and_exit_code_2(tmp_path, argv, env, says):
    proc = subprocess.run([ITHACA, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env=os.environ | env)  # fmt: skip
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []  # no server data dir, no video


def test_an_out_folder_that_is_a_link_to_nowhere_is_refused_before_the_run(tmp_path):
    """The writer could not make it: a traceback once the whole run was done (the check looked past it)."""
    from dit.cli import check_latents, check_out

    (tmp_path / "out").symlink_to(tmp_path / "gone")
    for check, flag in ((check_out, "--out"), (lambda path: check_latents(path, "v.mp4"), "--save-latents")):
        with pytest.raises(ValueError, match=f"^{flag} .*out is a link to .*gone, which does not exist$"):
            check(str(tmp_path / "out" / "sub" / "v.mp4"))


def test_out_names_that_cannot_be_the_video_are_refused_before_the_run(tmp_path):
    """A name the file system cannot hold ran the whole job, then failed twice over (the hidden partial name,
    9 bytes longer, first); `.mp4` alone was asked to end in .mp4; --save-latents naming the video replaced
    it, and the run said it wrote the video."""
    from dit.cli import check_latents, check_out

    with pytest.raises(ValueError, match=r"^--out: the file name is 255 bytes; this file system takes 246"):
        check_out(str(tmp_path / ("a" * 251 + ".mp4")))
    check_out(str(tmp_path / ("a" * 242 + ".mp4")))
    with pytest.raises(ValueError, match="^--out: the file name is 304 bytes"):  # it was a traceback
        check_out(str(tmp_path / ("a" * 300 + ".mp4")))
    with pytest.raises(ValueError, match=r"^--out .*/\.mp4: give the video a name before \.mp4$"):
        check_out(str(tmp_path / ".mp4"))
    with pytest.raises(ValueError, match="^--save-latents .*v.mp4 is the video's own file"):
        check_latents(str(tmp_path / "v.mp4"), str(tmp_path / "." / "v.mp4"))
    with pytest.raises(ValueError, match="^--save-latents: the file name is 300 bytes; .* takes 255"):
        check_latents(str(tmp_path / ("l" * 300)), "v.mp4")


def test_a_folder_holding_a_package_of_ours_is_refused_before_the_ranks_start(tmp_path):
    """`python -m` puts the working folder first on a rank's import path: the ranks ran an older checkout's
    `server/` found there, beside the API process's installed one."""
    (tmp_path / "server").mkdir()
    (tmp_path / "server" / "__init__.py").write_text("raise SystemExit(3)")
    for argv in (["generate", "a fox", "--nproc", "2"], ["serve", "--port", "0"]):
        proc = subprocess.run([ITHACA, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"the folder this starts in, {tmp_path}, holds server/__init__.py" in proc.stderr
    from parallel.local_group import check_start_folder

    check_start_folder(["server"], Path(__file__).parents[1])  # the checkout this runs: its own
    image = tmp_path / "app"  # an image's sources beside its installed copy: the same code (it was refused)
    shutil.copytree(Path(__file__).parents[1] / "server", image / "server")
    check_start_folder(["server"], image)


def test_serve_on_a_port_in_use_says_so_before_starting_workers(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [ITHACA, "serve", "--host", "127.0.0.1", "--port", str(port)]
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"ithaca serve: error: --host 127.0.0.1 --port {port}: Address already in use\n"
    assert list(tmp_path.iterdir()) == []  # no data dir: nothing started


def test_degrees_are_checked_before_any_rank_starts(monkeypatch, capsys):
    import dit.cli
    from server.cli import main

    def no_launch(*args, **kwargs):
        raise AssertionError("ranks launched")

    monkeypatch.setattr(dit.cli, "run_on_ranks", no_launch)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["generate", "a fox", "--nproc", "4", "--ulysses", "3"]) == 2
    assert capsys.readouterr().err.startswith(
        "ithaca generate: error: --ulysses/--ring/--cfg do not fit --nproc 4"
    )
    with pytest.raises(SystemExit) as e:  # argparse's own mistakes: one line too, without the usage block
        main(["generate", "a fox", "--steps", "many"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == (
        "ithaca generate: error: argument --steps: invalid int value: 'many' (see ithaca generate --help)\n"
    )
    with pytest.raises(SystemExit) as e:  # the API's rule, before any rank (it ran, or spoke after the load)
        main(["generate", "a fox", "--nproc", "2", "--cache", "fbcache:1e-2"])
    assert e.value.code == 2 and "argument --cache: cache must be off, fbcache, or" in capsys.readouterr().err


def test_help_describes_every_option_with_its_default():
    from dit.cli import add_subcommands

    subparsers = argparse.ArgumentParser().add_subparsers()
    add_subcommands(subparsers)
    for name in ("generate", "parity"):
        parser = subparsers.choices[name]
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            assert action.help, (name, action.dest)
            # by identity: 0 == False, and --seed's 0 went unsaid
            if (
                action.default is not None
                and action.default is not False
                and action.default not in ("", argparse.SUPPRESS)
            ):
                assert f"(default: {action.default})" in text, (name, action.dest)


def test_help_of_every_command_and_subcommand_prints():
    """`--help` formats every help string (a bare "%" in one once crashed `ithaca serve --help`)."""
    from server.cli import build_parser
    from server.config import add_arguments

    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {"ithaca": parser.format_help()}
    helps |= {name: sub.format_help() for name, sub in subparsers.choices.items()}
    worker = argparse.ArgumentParser(prog="python -m server.worker")  # as server.worker.main builds it
    add_arguments(worker, worker_only=True)
    helps["worker"] = worker.format_help()
    assert set(helps) == {"ithaca", "generate", "parity", "serve", "plan", "worker"}
    assert "under 1 % of the job's time" in " ".join(helps["serve"].split())
    assert all("--vae-dtype" in helps[name] for name in ("generate", "parity", "serve", "worker"))
    for name, text in helps.items():
        assert "usage:" in text, name
        # a default said twice, "(default DATA_DIR/jobs.db) [env ITHACA_DB; default None]", or as nothing
        flat = " ".join(text.split())
        assert "default None" not in flat and "(default: )" not in flat, name
    serve = " ".join(helps["serve"].split())  # a help that speaks of a default without stating its own
    assert "[env ITHACA_PRESET; default tiny]" in serve and "[env ITHACA_DEVICE; default cpu]" in serve


def test_help_and_the_api_import_no_torch():
    """`ithaca --help` and the API app (an API-only box's start, `--no-workers`) read settings, presets and
    layouts only: `import torch` (seconds) is left to what needs a model (`dit`/`parallel` export their names
    lazily, parallel.lazy; the prompt tokenizer loads the model's family at the first prompt)."""
    code = (
        "import json, sys, server.app, server.cli\n"
        "try:\n    server.cli.main(['serve', '--help'])\n"
        "finally:\n    print(json.dumps(sorted(sys.modules)), file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "usage: ithaca serve" in proc.stdout, proc.stderr[-2000:]
    imported = set(json.loads(proc.stderr.splitlines()[-1]))
    assert {"server.app", "dit.settings", "parallel.plan"} <= imported
    assert not {m for m in imported if m.split(".")[0] in ("torch", "diffusers", "transformers")}
    import dit
    import parallel

    assert dit.parallelize.__module__ == "dit.sequence_parallel" and callable(parallel.attention)
    assert parallel.kernels.local_attention is parallel.local_attention  # a submodule, as an eager __init__
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        parallel.nothing  # noqa: B018
