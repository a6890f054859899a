"""Compiler benchmark: a large, realistic definition tree, compiled cold and after one-file edits.

Generates (deterministically) 100 models, 1,000 tools and 1,000 agents spread
over ~1,200 YAML files in nested folders, with instruction files and tool
scripts that count in digests, then measures:

- yaml parse only: read every YAML file and `yaml.load_all` it with PyYAML's
  CSafeLoader, the floor any YAML-based compiler stands on (same run, same
  machine, so the ratios travel better than the absolute figures);
- cold compile: a fresh `Compiler`, best and median of a few runs;
- one-file recompile: the same `Compiler` after editing one agent file's
  description (a different file each time), median of ~20 edits;
- no-change recompile: the same `Compiler` again with nothing edited.

Each row gives wall times (best, median) and the median CPU time of this
process, which a busy machine inflates less; the header shows the load.

Targets: cold compile <= 1 s, one-file recompile <= 50 ms (wall medians). When one is
missed (or with `--profile`), the top cProfile hotspots of that measure are
printed. `--check` makes a missed target exit 1; `--out DIR` keeps the tree.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from server.compiler.compiler import Compiler

AGENTS, TOOLS, MODELS = 1000, 1000, 100
TEAMS = 20  # folders under agents/ and tools/
TOOLS_PER_FILE = 5
MODELS_PER_FILE = 10
SCRIPTS = 20
COLD_RUNS = 5
EDITS = 20
COLD_TARGET_S = 1.0
RECOMPILE_TARGET_S = 0.050

WORDS = (
    "account", "invoice", "order", "customer", "ticket", "report", "metric", "search", "index",
    "cache", "deploy", "build", "release", "incident", "alert", "budget", "forecast", "contract",
    "review", "summary", "draft", "schedule", "meeting", "calendar", "note", "document", "policy",
    "access", "audit", "backup", "restore", "migrate", "sync", "export", "import", "queue", "job",
)


# --- the tree -----------------------------------------------------------------


def _q(text: str) -> str:
    """A YAML double-quoted scalar."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def _model_doc(rng: random.Random, i: int) -> str:
    name = f"model-{i:03d}"
    kind = ("openai", "anthropic", "scripted")[i % 3]
    head = f"kind: Model\nname: {name}\ndescription: {_sentence(rng, 6)}\nprovider: {kind}\n"
    if kind == "scripted":
        return head + (
            "script:\n"
            f"  - when: \"(?i)\\\\b{rng.choice(WORDS)}\\\\b\"\n"
            f"    reply: {_q(_sentence(rng, 8))}\n"
            "  - when: \"(?i)^run (.+)\"\n"
            "    tool_call: { name: some_tool, arguments: { q: \"{input}\" } }\n"
            f"default: {_q(_sentence(rng, 10))}\n"
        )
    model = "gpt-4o-mini" if kind == "openai" else "claude-sonnet-4"
    body = f"model: {model}\ntemperature: {rng.choice([0, 0.2, 0.7])}\ncontext_window: 128000\n"
    if kind == "openai" and i % 2:
        body += f"base_url: https://llm-{i % 7}.internal.example/v1\napi_key: ${{LLM_KEY_{i % 7}}}\n"
    earlier = [j for j in range(max(0, i - 12), i) if j % 3 != 2]  # no scripted fallbacks, no cycles
    if earlier and rng.random() < 0.4:
        body += f"fallbacks: [{', '.join(f'model-{j:03d}' for j in rng.sample(earlier, 1))}]\n"
    return head + body + f"timeout_s: {rng.choice([30, 60, 120])}\nretries: {rng.choice([1, 2, 3])}\n"


def _schema(rng: random.Random, params: list[str]) -> str:
    lines = ["input_schema:", "  type: object", "  properties:"]
    for p in params:
        lines.append(f"    {p}: {{ type: string, description: {_q(_sentence(rng, 5))} }}")
    lines.append("    limit: { type: integer, minimum: 1, maximum: 100 }")
    lines.append(f"  required: [{', '.join(params)}]")
    return "\n".join(lines) + "\n"


def _tool_doc(rng: random.Random, i: int, depth: int) -> str:
    params = rng.sample(["q", "id", "region", "owner", "status"], rng.choice([1, 2]))
    head = f"kind: Tool\nname: tool-{i:04d}\ndescription: {_sentence(rng, 9)}\n" + _schema(rng, params)
    if i % 2:
        path = "/".join("{" + p + "}" for p in params)
        return head + (
            "http:\n"
            f"  method: {rng.choice(['GET', 'POST'])}\n"
            f"  url: https://api-{i % 13}.example.com/v2/{rng.choice(WORDS)}/{path}\n"
            "  headers:\n"
            f"    Authorization: \"Bearer ${{API_TOKEN_{i % 13}}}\"\n"
            "    Accept: application/json\n"
            f"  timeout_s: {rng.choice([10, 20, 30])}\n"
            f"permission: {rng.choice(['allow', 'allow', 'ask'])}\n"
        )
    script = "../" * depth + f"scripts/tool_{i % SCRIPTS:02d}.py"
    argv = ", ".join(["python3", script, *(f'"--{p}={{{p}}}"' for p in params)])
    return head + f"command:\n  argv: [{argv}]\n  timeout_s: {rng.choice([5, 15, 30])}\n"


def _agent_doc(rng: random.Random, i: int, team: int, with_file: bool) -> str:
    lines = [
        "# generated by bench/compile.py",
        "kind: Agent",
        f"name: agent-{i:04d}",
        f"description: {_sentence(rng, 10)}",
        f"model: model-{rng.randrange(MODELS):03d}",
        f"tools: [{', '.join(f'tool-{t:04d}' for t in rng.sample(range(TOOLS), rng.choice([2, 3])))}]",
    ]
    if with_file:
        lines.append(f"instructions_file: ../../prompts/team-{team:02d}/agent-{i:04d}.md")
    else:
        lines.append("instructions: |")
        lines += [f"  {_sentence(rng, 12)}" for _ in range(rng.randint(3, 8))]
    if i > 10 and rng.random() < 0.1:
        lines.append(f"agents: [agent-{rng.randrange(i):04d}]")  # lower index only: no cycles
    lines.append(f"max_steps: {rng.choice([5, 10, 20])}")
    if rng.random() < 0.3:
        lines.append(f"on_busy: {rng.choice(['enqueue', 'interrupt'])}")
    return "\n".join(lines) + "\n"


def generate(root: Path, seed: int = 1) -> list[Path]:
    """Write the tree under `root`; returns the agent files (the ones edited later)."""
    rng = random.Random(seed)
    (root / "scripts").mkdir(parents=True)
    for s in range(SCRIPTS):
        (root / "scripts" / f"tool_{s:02d}.py").write_text(f"import sys\nprint({s}, sys.argv[1:])\n")
    (root / "models").mkdir()
    for f in range(MODELS // MODELS_PER_FILE):
        docs = [_model_doc(rng, i) for i in range(f * MODELS_PER_FILE, (f + 1) * MODELS_PER_FILE)]
        (root / "models" / f"pool-{f:02d}.yaml").write_text("---\n".join(docs))
    for f in range(TOOLS // TOOLS_PER_FILE):
        folder = root / "tools" / f"team-{f % TEAMS:02d}" / ("http" if f % 3 else "ops")
        folder.mkdir(parents=True, exist_ok=True)
        docs = [_tool_doc(rng, i, 3) for i in range(f * TOOLS_PER_FILE, (f + 1) * TOOLS_PER_FILE)]
        (folder / f"{rng.choice(WORDS)}-{f:03d}.yaml").write_text("---\n".join(docs))
    agent_files = []
    for i in range(AGENTS):
        team = i % TEAMS
        with_file = i % 3 == 0
        if with_file:
            prompt = root / "prompts" / f"team-{team:02d}" / f"agent-{i:04d}.md"
            prompt.parent.mkdir(parents=True, exist_ok=True)
            prompt.write_text("\n\n".join(_sentence(rng, 20) for _ in range(4)) + "\n")
        path = root / "agents" / f"team-{team:02d}" / f"agent-{i:04d}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_agent_doc(rng, i, team, with_file))
        agent_files.append(path)
    _age(root)
    return agent_files


def _age(root: Path) -> None:
    """Date every file a minute back: a tree at rest, not one written this instant."""
    past = time.time() - 60
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            os.utime(os.path.join(dirpath, name), (past, past))


# --- measuring ----------------------------------------------------------------


@dataclass
class Figure:
    label: str
    samples: list[tuple[float, float]]  # (wall, CPU) seconds
    target: float | None = None

    @property
    def best(self) -> float:
        return min(wall for wall, _ in self.samples)

    @property
    def median(self) -> float:
        return statistics.median(wall for wall, _ in self.samples)

    @property
    def cpu_median(self) -> float:
        return statistics.median(cpu for _, cpu in self.samples)

    @property
    def missed(self) -> bool:
        return self.target is not None and self.median > self.target


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU time of one call: the CPU figure is steadier on a busy machine."""
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


def yaml_parse_all(files: list[Path]) -> int:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    count = 0
    for path in files:
        count += sum(1 for doc in yaml.load_all(path.read_text(encoding="utf-8"), Loader=loader) if doc)
    return count


def _edit(path: Path, n: int) -> None:
    lines = path.read_text().split("\n")
    lines = [f"description: Edited for the benchmark, edit {n}." if ln.startswith("description:") else ln
             for ln in lines]
    path.write_text("\n".join(lines))


def measure(root: Path, agent_files: list[Path], cold_runs: int, edits: int) -> dict[str, Figure]:
    yaml_files = sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml"))
    documents = yaml_parse_all(yaml_files)
    expected = AGENTS + TOOLS + MODELS
    if documents != expected:
        raise SystemExit(f"generated {documents} documents, expected {expected}")
    figures = {"yaml": Figure("yaml parse only (CSafeLoader)",
                              [_timed(lambda: yaml_parse_all(yaml_files)) for _ in range(cold_runs)])}
    cold = []
    for _ in range(cold_runs):
        cold.append(_timed(lambda: Compiler(root).compile()))
    figures["cold"] = Figure("cold compile", cold, COLD_TARGET_S)
    compiler = Compiler(root)
    before = compiler.compile()
    if len(before) != expected:
        raise SystemExit(f"compiled {len(before)} definitions, expected {expected}")
    figures["noop"] = Figure("no-change recompile",
                             [_timed(compiler.compile) for _ in range(max(5, edits // 4))])
    step = max(1, len(agent_files) // edits)
    # blind: the compiler checks every file itself (a reload request, SIGHUP)
    figures["blind"] = Figure(f"one-file recompile, blind ({edits})",
                              _edits(compiler, agent_files, range(edits), step, told=False))
    # told: what the file watcher does in `corral serve`, passing the changed paths
    figures["edit"] = Figure(f"one-file recompile, watcher ({edits})",
                             _edits(compiler, agent_files, range(edits, 2 * edits), step, told=True),
                             RECOMPILE_TARGET_S)
    after = compiler.compile()
    changed = sum(1 for d in after if before.get(d.kind, d.name).digest != d.digest)
    if changed < edits:
        raise SystemExit(f"{2 * edits} edits changed only {changed} digests: the recompile missed edits")
    if after.digests() != Compiler(root).compile().digests():
        raise SystemExit("the incremental recompiles disagree with a fresh compile")
    return figures


def _edits(compiler: Compiler, agent_files: list[Path], numbers: range, step: int, told: bool) -> list[float]:
    samples = []
    for n in numbers:
        path = agent_files[(n * step) % len(agent_files)]
        _edit(path, n)
        samples.append(_timed(lambda p=path: compiler.compile([p] if told else None)))
    return samples


# --- reporting ------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:9.1f} ms"


def report(figures: dict[str, Figure], files: int, out: io.TextIOBase) -> None:
    base = figures["yaml"].median
    print(f"\ncompile benchmark: {AGENTS} agents, {TOOLS} tools, {MODELS} models in {files} YAML files",
          file=out)
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    busy = "  (busy machine: wall times are inflated; see the CPU column)" if load > cores else ""
    print(f"load average {load:.1f} on {cores} CPUs{busy}", file=out)
    header = f"{'measure':34} {'best':>12} {'median':>12} {'CPU median':>12} {'x yaml':>7} {'target':>12}"
    print(header + "  status", file=out)
    for fig in figures.values():
        target = _ms(fig.target) if fig.target is not None else " " * 12
        status = "" if fig.target is None else ("MISSED" if fig.missed else "ok")
        print(f"{fig.label:34} {_ms(fig.best)} {_ms(fig.median)} {_ms(fig.cpu_median)} "
              f"{fig.median / base:7.2f} {target}  {status}", file=out)
    print("(wall times unless said; x yaml: median over the median time to yaml-parse every file; "
          "targets judged on the wall median)", file=out)


def profile(label: str, fn: Callable[[], object], out: io.TextIOBase, top: int = 18) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    profiler.disable()
    buf = io.StringIO()
    stats = pstats.Stats(profiler, stream=buf)
    stats.sort_stats("tottime").print_stats(top)
    print(f"\n--- cProfile, {label}: top {top} by own time ---", file=out)
    body = buf.getvalue()
    print(body[body.find("   ncalls"):].rstrip(), file=out)


def _profile_missed(root: Path, agent_files: list[Path], figures: dict[str, Figure],
                    force: bool, out: io.TextIOBase) -> None:
    if force or figures["cold"].missed:
        profile("cold compile", lambda: Compiler(root).compile(), out)
    if force or figures["edit"].missed:
        compiler = Compiler(root)
        compiler.compile()

        def edits() -> None:
            for n in range(10):
                _edit(agent_files[n * 7], 1000 + n)
                compiler.compile()

        profile("10 one-file recompiles", edits, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench compile", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=COLD_RUNS, help="cold compile runs")
    parser.add_argument("--edits", type=int, default=EDITS, help="one-file edits to time")
    parser.add_argument("--profile", action="store_true", help="profile even when targets are met")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--out", type=Path, help="generate into this directory (must not exist) and keep it")
    args = parser.parse_args(argv)
    out = sys.stdout
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        root = args.out.resolve() if args.out else Path(tmp) / "definitions"
        agent_files = generate(root)
        files = sum(1 for p in root.rglob("*") if p.suffix in (".yaml", ".yml"))
        figures = measure(root, agent_files, args.runs, args.edits)
        report(figures, files, out)
        _profile_missed(root, agent_files, figures, args.profile, out)
    missed = [f.label for f in figures.values() if f.missed]
    if missed:
        print(f"\ntargets missed: {', '.join(missed)}", file=out)
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
