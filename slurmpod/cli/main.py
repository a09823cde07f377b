"""The `slurmpod` entry point: lazy subcommands and the one error handler.

Subcommands are imported only when invoked, so `slurmpod --help` and a submit stay fast on a
login node (numpy, msgspec, jinja2 and paramiko load only where needed).
"""

from __future__ import annotations

import importlib
import sys

import click

from slurmpod import __version__
from slurmpod.errors import INTERNAL_EXIT_CODE, SlurmpodError

# name -> "module:attribute" of a click command or group.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "topo": ("slurmpod.cli.topo:topo", "Generate, show and check site topology artefacts."),
    "sandbox": ("slurmpod.cli.sandbox:sandbox", "Run a real Slurm on this machine."),
    "plan": ("slurmpod.cli.plan:plan", "Validate a Megatron run spec and plan it on the site."),
    "calibrate": ("slurmpod.cli.calibrate:calibrate",
                  "Fit the performance model and memory reserve to site jobs."),
    "render": ("slurmpod.cli.submit:render", "Render the sbatch script for a run spec."),
    "submit": ("slurmpod.cli.submit:submit", "Plan, render and submit a run."),
    "mfu": ("slurmpod.cli.mfu:mfu", "MFU and throughput from a Megatron log."),
    "hook": ("slurmpod.cli.hook:hook", "Accounting hooks run by jobs and slurmctld."),
    "report": ("slurmpod.cli.report:report", "Efficiency reports per job and across the fleet."),
    "demo": ("slurmpod.cli.demo:demo", "End-to-end run on the embedded sandbox."),
    "runs": ("slurmpod.cli.runs:runs", "Your runs: state, attempt, progress, MFU, ETA."),
    "logs": ("slurmpod.cli.runs:logs", "Print (or follow) a run's log, one attempt or rank."),
    "cancel": ("slurmpod.cli.runs:cancel", "Cancel a run, optionally saving a checkpoint first."),
    "simulate": ("slurmpod.cli.simulate:simulate", "Goodput of a long run under node failures."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = SUBCOMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, _, attr = entry[0].partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return _unavailable(cmd_name, entry[1])
            raise
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help from the table, without importing every subcommand.
        rows = [(name, SUBCOMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _unavailable(name: str, help_text: str) -> click.Command:
    @click.command(name=name, help=help_text)
    def _cmd() -> None:
        raise SlurmpodError(f"`slurmpod {name}` is not available in this build")

    return _cmd


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="slurmpod")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """slurmpod: Slurm for AI clusters of whole 8-GPU nodes on rail-optimised fabrics."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        rc = cli.main(args=args, prog_name="slurmpod", standalone_mode=False)
    except SlurmpodError as exc:
        if debug:
            _print_traceback()
        click.echo(f"slurmpod: error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("slurmpod: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("slurmpod: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # a bug: say so, briefly, unless --debug
        if debug:
            _print_traceback()
        else:
            click.echo(
                f"slurmpod: internal error: {type(exc).__name__}: {exc} (rerun with --debug)",
                err=True,
            )
        sys.exit(INTERNAL_EXIT_CODE)
    sys.exit(rc if isinstance(rc, int) else 0)


def _print_traceback() -> None:
    import traceback  # lazy: ~4 ms of every start-up, for --debug

    traceback.print_exc()


if __name__ == "__main__":
    main()
