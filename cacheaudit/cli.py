"""The `cacheaudit` command: parse, call the library, render. Decisions live elsewhere.

The commands live in modules by concern (`cli_audit`, `cli_records`, `cli_cache`, `cli_env`,
`cli_diff`), what they share in `cli_shared`, the checks of their input in `cli_checks`; this
module is the app they are registered on, in the order `cacheaudit --help` lists them, and how
the process ends."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Annotated

import typer

from cacheaudit import cli_audit, cli_cache, cli_diff, cli_env, cli_records
from cacheaudit import cli_checks as checks
from cacheaudit.exceptions import CacheAuditError, ExitCode

app = typer.Typer(
    name="cacheaudit",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Audit the compile caches of GPU kernel JIT runtimes: which compiler, which options, "
    "fresh or cached, and did every input that changed enter the key.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
shim_app = typer.Typer(help="Install and inspect the compiler shim.", no_args_is_help=True)
app.add_typer(shim_app, name="shim")


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"cacheaudit {version('cacheaudit')}")
        except PackageNotFoundError:  # pragma: no cover - run from a source tree
            typer.echo("cacheaudit (version unknown: not installed)")
        raise typer.Exit(ExitCode.CLEAN)


@app.callback()
def _top(version: Annotated[bool, typer.Option(
        "--version", callback=_show_version, is_eager=True,
        help="Print the version and exit.")] = False) -> None:
    """Audit the compile caches of GPU kernel JIT runtimes."""


# Registered in the order `cacheaudit --help` lists them.
app.command()(cli_records.report)
app.command()(cli_audit.scan)
app.command("verify")(cli_audit.verify_command)
app.command()(cli_cache.evict)
app.command()(cli_cache.stats)
app.command()(cli_audit.explain)
app.command(context_settings=cli_records.RUN_CONTEXT)(cli_records.run)
app.command()(cli_records.combine)
app.command()(cli_env.snapshot)
app.command("diff")(cli_diff.diff)
app.command()(cli_env.demo)
shim_app.command("install", help=cli_env.SHIM_INSTALL_HELP)(cli_env.shim_install)


class _Terminated(BaseException):
    """SIGTERM or SIGHUP, raised where the main thread is, so that every `finally` runs: the
    children cacheaudit started are killed and its temporary directories removed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _terminate(signum: int, _frame: object) -> None:
    from cacheaudit.shimrun import kill_own_children

    kill_own_children()
    raise _Terminated(signum)


@contextlib.contextmanager
def _terminable() -> Iterator[None]:
    import signal

    # A signal the caller ignores (nohup) stays ignored.
    previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGHUP)
                if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    """Entry point: library errors become one line and a documented exit status."""
    with _terminable():
        try:
            status = _main(argv)
            sys.stdout.flush()
        except _Terminated as exc:
            sys.stderr.write(f"cacheaudit: terminated by signal {exc.signum}\n")
            return 128 + exc.signum
        except BrokenPipeError:
            return checks.quiet_broken_pipe()
        except SystemExit as exc:
            if checks.is_broken_pipe(exc):
                return checks.quiet_broken_pipe()
            raise
        return status


def _click_group(argv: list[str] | None) -> typer.core.TyperGroup:
    """The click group of `app`, in which only the command this argv invokes is built.

    Building a command reads its function's signature and evaluates every annotation (typer's
    `get_params_from_function`): ~4 ms a command, 50 ms for all of them, which `--help` and
    every command would pay. The others are stand-ins carrying what the group's listing shows
    (the name, the help, `hidden`, `deprecated`), in the registration order; the sub-groups
    (`shim`) are built whole. No top-level option takes a value, so the first argument that
    does not start with "-" is the command click will look up."""
    args = sys.argv[1:] if argv is None else argv
    wanted = next((arg for arg in args if not arg.startswith("-")), None)
    registered = app.registered_commands
    app.registered_commands = [info for info in registered if _command_name(info) == wanted]
    try:
        group = typer.main.get_command(app)
    finally:
        app.registered_commands = registered
    assert isinstance(group, typer.core.TyperGroup)
    built = dict(group.commands)
    group.commands = {name: built.pop(name, None) or _stand_in(info, name)
                      for info in registered for name in (_command_name(info),)}
    group.commands.update(built)
    return group


def _command_name(info: typer.models.CommandInfo) -> str:
    return info.name or typer.main.get_command_name(info.callback.__name__)  # type: ignore[union-attr]


def _stand_in(info: typer.models.CommandInfo, name: str) -> typer.core.TyperCommand:
    """What the group's help listing reads of a command not invoked (typer's own choice of
    help text: the given help, cleaned, else the function's docstring)."""
    import inspect

    shown = inspect.cleandoc(info.help) if info.help is not None else inspect.getdoc(
        info.callback)
    return typer.core.TyperCommand(name=name, help=shown, short_help=info.short_help,
                                   hidden=info.hidden, deprecated=info.deprecated,
                                   rich_markup_mode=None)


def _main(argv: list[str] | None) -> int:
    from cacheaudit import scratch

    # What a cacheaudit process killed outright (a shim, a scan) left in TMPDIR.
    scratch.sweep()
    command = _click_group(argv)
    try:
        status = command.main(args=argv, prog_name="cacheaudit", standalone_mode=False)
    except CacheAuditError as exc:
        sys.stderr.write(f"cacheaudit: error: {exc}\n")
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort as exc:
        # click turns Ctrl-C into Abort: the shell's convention for SIGINT, not a usage error.
        if isinstance(exc.__context__, KeyboardInterrupt):
            sys.stderr.write("cacheaudit: interrupted\n")
            return ExitCode.INTERRUPTED
        sys.stderr.write("cacheaudit: aborted\n")
        return ExitCode.USAGE
    except KeyboardInterrupt:
        sys.stderr.write("cacheaudit: interrupted\n")
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        raise
    except Exception as exc:  # click's own usage errors, and the unexpected
        # typer vendors click in some releases: recognise its exceptions by shape, not class.
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None),
                                                                  int):
            if type(exc).__name__ == "NoArgsIsHelpError":
                exc.show()  # type: ignore[attr-defined]  # the help itself, as asked
            else:
                sys.stderr.write(checks.usage_line(exc))  # type: ignore[arg-type]
            return ExitCode.USAGE
        if os.environ.get("CACHEAUDIT_DEBUG"):
            raise
        sys.stderr.write(f"cacheaudit: internal error: {type(exc).__name__}: {exc} "
                         "(set CACHEAUDIT_DEBUG=1 for a traceback)\n")
        return ExitCode.INTERNAL
    return status if isinstance(status, int) else ExitCode.CLEAN
