"""The ``kt`` command line."""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ktforge import __version__, formats
from ktforge.builder.recipes import load_recipes
from ktforge.files import UnsafePath, open_regular, shown

RECIPE_NAMES = tuple(r.name for r in load_recipes())  # best first

if TYPE_CHECKING:  # the converter loads only when `kt convert` runs
    from ktforge.checkpoints.convert import Plan

app = typer.Typer(
    name="kt",
    help="ktforge: build, verify and install the fastest correct MoE kernels for this machine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_DOCTOR_FAILED = 2


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"ktforge {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """ktforge command line."""


@app.command()
def doctor(
    json_output: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")] = False,
    list_checks: Annotated[bool, typer.Option("--list-checks", help="List the check ids and exit.")] = False,
    check: Annotated[list[str] | None, typer.Option("--check", help="Run only this check (repeatable).")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too (exit 1).")] = False,
    snapshot: Annotated[Path | None, typer.Option("--snapshot", help="Write everything seen to FILE.")] = None,
    from_file: Annotated[
        Path | None,
        typer.Option("--from", help="Replay a snapshot, /proc/cpuinfo, lscpu (text or -J), CPUID or sysctl dump."),
    ] = None,
) -> None:
    """Check every gate between this machine and fast, correct kernels.

    Exit codes: 0 no errors, 1 at least one error (or warning with --strict), 2 doctor failed.
    """
    from ktforge import doctor as doctor_checks

    if list_checks:
        for cid, category, title in doctor_checks.list_checks():
            typer.echo(f"{cid:28} {category:10} {title}")
        raise typer.Exit(0)
    try:
        from ktforge.builder.assessment import assess
        from ktforge.cli.render import render, use_color
        from ktforge.detect import evidence as evidence_mod
        from ktforge.detect.dumps import DumpFormatError
        from ktforge.doctor.schema import doctor_document, to_text

        try:
            ev = evidence_mod.from_file(from_file) if from_file else evidence_mod.collect_live()
        except DumpFormatError as exc:
            typer.echo(f"kt doctor: cannot read {from_file}: {exc}", err=True)
            raise typer.Exit(EXIT_DOCTOR_FAILED) from exc
        report = assess(ev)
        try:
            findings = doctor_checks.run_checks(report, check or None)
        except KeyError as exc:
            typer.echo(f"kt doctor: {exc.args[0]}", err=True)
            raise typer.Exit(EXIT_DOCTOR_FAILED) from exc
        if snapshot is not None:
            snapshot.write_text(to_text({**ev.to_snapshot(), "report": report}) + "\n")
        if json_output:
            typer.echo(to_text(doctor_document(report, findings)))
        else:
            render(report, findings, sys.stdout, use_color(sys.stdout))
            if snapshot is not None:
                typer.echo(f"snapshot written to {snapshot}")
        raise typer.Exit(doctor_checks.exit_code(findings, strict))
    except typer.Exit:
        raise
    except Exception as exc:  # the doctor must say what broke, not dump a traceback
        typer.echo(f"kt doctor failed: {type(exc).__name__}: {exc}", err=True)
        typer.echo("please report this with the output of `kt doctor --snapshot FILE`", err=True)
        raise typer.Exit(EXIT_DOCTOR_FAILED) from exc


def _verified_line(r: dict[str, Any]) -> str:
    """One verified kernel: backend, method, token count, kernel, error against the reference."""
    where = f"{r['backend']:7} {r['method']:5} T={r['tokens']:<3}"
    return f"  verified {where} {r['kernel']} (max rel. error {r['rel_err']:.1e})"


@app.command()
def build(
    recipe: Annotated[
        str,
        typer.Option(
            "--recipe", "--backend", help=f"auto, or a recipe: {', '.join(RECIPE_NAMES)} (--backend: its old name)."
        ),
    ] = "auto",
    plan_only: Annotated[bool, typer.Option("--plan", help="Print the plan and why; build nothing.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the plan (and result) as JSON.")] = False,
    target: Annotated[
        str | None,
        typer.Option(
            help="Build for another machine (e.g. sapphirerapids, znver4): a wheel in dist/, not installed here."
        ),
    ] = None,
    portable: Annotated[
        bool,
        typer.Option(
            "--portable",
            help="One wheel for every x86-64 (fleets, containers, package indexes): every ISA level, the best "
            "chosen at run time; in dist/, not installed here.",
        ),
    ] = False,
    source: Annotated[Path, typer.Option(help="The ktforge checkout to build.")] = Path(),
) -> None:
    """Plan, build, verify and install the kernels of one recipe.

    Exit codes: 0 built (or plan buildable), 1 the plan cannot be built or the build/verification failed,
    2 bad input (--source is no ktforge checkout).
    """
    from rich.console import Console

    from ktforge.builder import executor, planner
    from ktforge.builder.assessment import assess
    from ktforge.detect import evidence as evidence_mod

    source = source.resolve()
    if not _is_checkout(source):
        typer.echo(f"kt build: {shown(str(source))} is not a ktforge checkout; run it there or pass --source", err=True)
        raise typer.Exit(2)
    if portable and (target is not None or recipe != "auto"):
        typer.echo("kt build: --portable holds every level; it takes no --target or --recipe", err=True)
        raise typer.Exit(1)
    report = assess(evidence_mod.collect_live())
    try:
        plan = planner.make_portable_plan(report) if portable else planner.make_plan(report, recipe, target)
    except planner.PlanError as exc:
        typer.echo(f"kt build: {exc}", err=True)
        raise typer.Exit(1) from exc
    result: dict[str, Any] = {"plan": plan.to_json()}
    if plan_only or not plan.ok:
        if json_output:
            typer.echo(json.dumps({"schema_version": planner.PLAN_SCHEMA_VERSION, **plan.to_json()}, indent=1))
        else:
            typer.echo(planner.format_plan(plan))
        raise typer.Exit(0 if plan.ok else 1)
    console = Console(stderr=True, quiet=json_output)
    try:
        with console.status("building") as status:
            result.update(executor.carry_out(plan, source, lambda text: status.update(text)))
    except planner.PlanError as exc:
        typer.echo(f"kt build: {exc}", err=True)
        raise typer.Exit(1) from exc
    wheel, log = Path(result["wheel"]), result["log"]
    if json_output:
        typer.echo(json.dumps({"schema_version": planner.PLAN_SCHEMA_VERSION, **result}, indent=1))
        return
    typer.echo(planner.format_plan(plan))
    for r in result.get("verified", []):
        typer.echo(_verified_line(r))
    if portable:
        typer.echo(
            f"built {wheel}: one wheel for every x86-64; `pip install {wheel.name}` anywhere, `kt doctor` there "
            f"says which level runs (log: {log})"
        )
    elif target is None:
        typer.echo(f"installed {wheel} (log: {log}); next: kt bench --backend all")
    else:
        typer.echo(f"built {wheel} for {target}: copy it to that machine and pip install it there (log: {log})")


def _is_checkout(source: Path) -> bool:
    """Whether ``source`` holds ktforge's pyproject.toml: a regular file, UTF-8 TOML naming the
    project ktforge (a FIFO, a directory or binary bytes are not)."""
    from ktforge.resources import parse_toml

    try:
        with open_regular(source / "pyproject.toml") as handle:
            project = parse_toml(handle.read(1 << 20)).get("project")
    except (OSError, UnsafePath, ValueError):
        return False
    return isinstance(project, dict) and project.get("name") == "ktforge"


METHODS_TEXT = ",".join(formats.names())


def _csv(value: str, option: str | None = None) -> list[str]:
    """A comma-separated option's items; with ``option`` named, none at all ('' or ',') is bad
    input: one line, exit 2."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    if option is not None and not items:
        typer.echo(f"kt bench: {option}: none given in {shown(value)}", err=True)
        raise typer.Exit(2)
    return items


@app.command()
def bench(
    model: Annotated[str, typer.Option(help="Comma-separated models, or 'all'.")] = "qwen3-30b-a3b",
    method: Annotated[str, typer.Option(help=f"Comma-separated methods: {METHODS_TEXT}.")] = "bf16,int8,int4",
    backend: Annotated[
        str, typer.Option(help="Comma-separated backends, 'auto' or 'all' (every one that runs).")
    ] = "auto",
    tokens: Annotated[
        str | None, typer.Option(help="Comma-separated token counts (default: 1,4,16,64,128,512,2048).")
    ] = None,
    routing: Annotated[str, typer.Option(help="Comma-separated routings: uniform,zipf.")] = "uniform,zipf",
    threads: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated thread counts, e.g. 1,2 for the scaling (default: the CPUs this process may use)."
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(help="Timed runs per case (the median is reported).")] = 5,
    peer: Annotated[bool, typer.Option(help="Time a plain PyTorch bf16 loop beside each case.")] = True,
    max_weight_gib: Annotated[float | None, typer.Option(help="Memory for weights (default 45% of available).")] = None,
    group_size: Annotated[
        int, typer.Option("--group-size", help="int8g, int4, int4z and fp8 group size: 32, 64 or 128 (mxfp4: 32).")
    ] = 128,
    activations: Annotated[
        str,
        typer.Option(help="int8 activations' scales: per-block (a scale per block of K) or per-token."),
    ] = "per-block",
    json_output: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")] = False,
) -> None:
    """Measure one MoE layer of real models against this machine's roofline (peaks measured in the same run)."""
    import ktforge
    from ktforge import bench as bench_mod
    from ktforge.cli import bench_text

    names = list(bench_mod.model.models()) if model == "all" else _csv(model, "--model")
    unknown = [n for n in names if n not in bench_mod.model.models()]
    if unknown:
        typer.echo(
            f"kt bench: unknown model(s) {shown(', '.join(unknown))}; known: {', '.join(bench_mod.model.models())}",
            err=True,
        )
        raise typer.Exit(2)
    methods, routings = _csv(method, "--method"), _csv(routing, "--routing")
    token_counts = [] if tokens is None else _csv(tokens, "--tokens")
    thread_counts = [] if threads is None else _csv(threads, "--threads")
    try:
        options = bench_mod.check_options(
            names,
            methods,
            token_counts,
            routings,
            thread_counts,
            repeats,
            max_weight_gib,
            peer,
            group_size,
            activations,
        )
        info = ktforge.build_info()  # the import guard: a bad KTFORGE_BACKEND or build record stops here
    except (ValueError, RuntimeError, ImportError) as exc:
        typer.echo(f"kt bench: {exc}", err=True)
        raise typer.Exit(2) from None
    runnable = [b["name"] for b in info["backends"] if b["runs_here"] and b["name"] != "reference"]
    backends = runnable if backend == "all" else runnable[:1] if backend == "auto" else _csv(backend)
    if not backends:
        typer.echo(f"kt bench: --backend: none given; choose auto, all or from {', '.join(runnable)}", err=True)
        raise typer.Exit(2)
    if peer:
        import importlib.util

        if importlib.util.find_spec("torch") is None:  # not imported here: see bench.timing.TorchPeer
            typer.echo("kt bench: torch is not installed; running without the PyTorch peer (--no-peer)", err=True)
            options = replace(options, peer=False)
    header, results = _bench_run(replace(options, backends=tuple(backends)), json_output)
    if json_output:
        typer.echo(
            json.dumps({"schema_version": 2, "ktforge_version": __version__, **header, "results": results}, indent=1)
        )
    else:
        typer.echo(bench_text.format_summary(results) + bench_text.format_scaling(header.get("scaling", [])))


def _bench_run(options: Any, json_output: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Runs the benchmark, printing its rows as they come (unless --json); returns the header
    and the rows scored against the best peaks of the whole run."""
    from rich.progress import Progress

    from ktforge import bench as bench_mod
    from ktforge.cli import bench_text

    results: list[dict[str, Any]] = []
    header: dict[str, Any] = {}
    try:
        with Progress(transient=True, disable=json_output or not sys.stderr.isatty()) as progress:
            task = progress.add_task("measuring peaks", total=None)
            for event in bench_mod.run(options, lambda label: progress.update(task, description=label)):
                if isinstance(event, bench_mod.Header):
                    header = asdict(event)
                    if not json_output:
                        typer.echo(bench_text.format_header(header))
                elif isinstance(event, bench_mod.CaseDone):
                    results.append(asdict(event.result))
                    if not json_output:
                        typer.echo(bench_text.format_row(results[-1]))
                else:  # the rows above, against the best peaks of the whole run
                    results = [asdict(r) for r in event.results]
                    header.update(peaks=event.peaks, scaling=event.scaling)
    except ValueError as exc:  # a backend or method this machine cannot run, named with the reason
        typer.echo(f"kt bench: {exc}", err=True)
        raise typer.Exit(2) from None
    return header, results


@app.command()
def convert(
    input_dir: Annotated[
        Path, typer.Option("--input", help="Hugging Face checkpoint directory (config.json, *.safetensors).")
    ],
    output: Annotated[Path, typer.Option("--output", help="Directory for the converted layers and manifest.json.")],
    quant: Annotated[str, typer.Option("--quant", help="int8, int8g, int4, mxfp4 or bf16.")] = "int8",
    group_size: Annotated[
        int, typer.Option("--group-size", help="int8g and int4 group size: 32, 64 or 128 (mxfp4 has one: 32).")
    ] = 128,
    input_type: Annotated[str, typer.Option("--input-type", help="auto, bf16, fp16, fp32 or fp8.")] = "auto",
    layers: Annotated[
        str | None, typer.Option("--layers", help="MoE layers, e.g. 3 or 0-5 or 1,4,7-9 (default all).")
    ] = None,
    threads: Annotated[
        int | None, typer.Option(help="Quantization threads (default: the CPUs this process may use).")
    ] = None,
) -> None:
    """Quantize a checkpoint's routed experts into ktforge's format (resumable)."""
    from ktforge.checkpoints import convert as convert_mod

    try:
        plan = convert_mod.plan(input_dir, output, quant, group_size, input_type, layers)
    except convert_mod.OutputBusy as error:
        typer.echo(f"kt convert: {error}", err=True)
        raise typer.Exit(1) from None
    except ValueError as error:  # CheckpointError, ConversionError, SafetensorsError
        typer.echo(f"kt convert: {error}", err=True)
        raise typer.Exit(2) from None
    except OSError as error:
        typer.echo(f"kt convert: cannot read {error.filename or input_dir}: {error.strerror or error}", err=True)
        raise typer.Exit(2) from None
    with plan:  # the checkpoint's files and the output directory's lock
        _run_conversion(plan, output, quant, group_size, threads)


def _run_conversion(plan: Plan, output: Path, quant: str, group_size: int, threads: int | None) -> None:
    import os
    import time

    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    from ktforge import formats
    from ktforge.checkpoints import convert as convert_mod

    todo = plan.todo
    if not todo and (output / convert_mod.MANIFEST).is_file():
        typer.echo(f"kt convert: {output} already holds these {len(plan.layers)} layer(s); nothing to do", err=True)
        return
    total_bytes = sum(plan.source_bytes(layer) for layer in todo)
    skipped = len(plan.layers) - len(todo)
    arch = plan.checkpoint.arch.label
    typer.echo(
        f"kt convert: {arch}, {len(plan.layers)} MoE layer(s) x {plan.checkpoint.experts} experts -> {quant}"
        + (f" (group {group_size})" if formats.by_name(quant).grouped else "")
        + (f"; {skipped} already done, resuming" if skipped else ""),
        err=True,
    )
    interactive = sys.stderr.isatty()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    started = time.perf_counter()
    last_logged = [skipped]
    with Progress(*columns, disable=not interactive, transient=False) as progress:
        task = progress.add_task("converting", total=total_bytes)

        def on_progress(done: int, finished: int, label: str) -> None:
            progress.update(task, completed=done, description=f"{label} ({finished}/{len(plan.layers)} layers)")
            if not interactive and finished > last_logged[0]:
                last_logged[0] = finished
                typer.echo(f"  {finished}/{len(plan.layers)} layers, {done / 1e9:.2f} GB read", err=True)

        try:
            manifest = convert_mod.run(plan, threads or len(os.sched_getaffinity(0)), on_progress)
        except KeyboardInterrupt:
            typer.echo("kt convert: interrupted; finished layers are kept: run the same command to resume", err=True)
            raise typer.Exit(130) from None
        except ValueError as error:
            typer.echo(f"kt convert: {error}", err=True)
            raise typer.Exit(1) from None
        except ImportError as error:  # the kernels quantize: no extension, no conversion
            typer.echo(
                f"kt convert: the native extension cannot be loaded ({error}); build it: ./install.sh build", err=True
            )
            raise typer.Exit(1) from None
        except OSError as error:  # a full disk, a read-only or vanished directory
            where = error.filename or output
            typer.echo(
                f"kt convert: cannot write {where}: {error.strerror or error}; finished layers are kept, the layer "
                "being written was removed; free space or fix the directory, then run the same command again",
                err=True,
            )
            raise typer.Exit(1) from None
    seconds = time.perf_counter() - started
    rate = f", {total_bytes / seconds / 1e9:.2f} GB/s of input" if total_bytes and seconds > 0 else ""
    typer.echo(
        f"kt convert: {len(manifest['layers'])} layer(s) in {output} ({total_bytes / 1e9:.2f} GB read in "
        f"{seconds:.1f} s{rate})",
        err=True,
    )


class _BestEffortStream:
    """stderr for messages and progress: a closed or full stderr (``2>&-``, ``2>/dev/full``, a
    vanished terminal) must not stop a conversion; what cannot be written is dropped."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except (OSError, ValueError):
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()

    def isatty(self) -> bool:
        try:
            return bool(self._stream.isatty())
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _standard_fds_open() -> None:
    """A closed fd 0, 1 or 2 (``2>&-``) is opened on /dev/null: else the next file opened (a
    layer being written) would take its number and receive whatever is printed to it."""
    import os

    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - the process's own stderr, never closed


def main() -> None:
    _standard_fds_open()
    sys.stderr = _BestEffortStream(sys.stderr)
    app()
