"""docs/flags.md, written from the command lines' own parsers: each flag is described once, in its
argparse help (which `cli.EnvArgumentParser` ends with the flag's variable and default).

    python -m conduit_common.flagdoc            # write docs/flags.md (`make docs`)
    python -m conduit_common.flagdoc --check    # exit 1 with a diff when docs/flags.md is stale

The programs' modules are imported only when the page is written: this library imports none of them.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

# (console command, `python -m` form, module holding build_parser), in the order a reader meets them.
PROGRAMS = (
    ("conduit-stack", "python -m launcher.stack", "launcher.stack"),
    ("conduit-engine", "python -m engine_service", "engine_service.__main__"),
    ("conduit-shim", "python -m http_shim", "http_shim.options"),
)
DEFAULT_OUT = Path("docs/flags.md")
WIDTH = 118

INTRO = """\
# Command-line flags

<!-- Written by `make docs` (python -m conduit_common.flagdoc) from the programs' argparse parsers:
edit the flags' help there, not here. `make test` fails when this file is stale. -->

Installing the package (`pip install .`, or `make install`) puts three console commands on the PATH of its
venv; each is the same program as its `python -m` form, and `--help` prints what this page lists.

Every flag also reads an environment variable, for containers: `CONDUIT_<FLAG>` (`--max-batch-size`:
`CONDUIT_MAX_BATCH_SIZE`) unless its entry names another. A flag on the command line wins; an empty variable
counts as unset; switches take `1/true/yes/on` or `0/false/no/off`; repeatable flags take a comma-separated
list, which their flags replace (credentials excepted: the keys and tokens of both are accepted); a bad value
stops the start with an error naming the variable. The engine and the shim share some names
(`CONDUIT_HOST`, `CONDUIT_PORT`, `CONDUIT_LOG_LEVEL`, `CONDUIT_LOG_FORMAT`, `CONDUIT_DRAIN_S`): set them per
process. The launcher's variables (`MODEL`, `ENGINE_PORT`, ...) are the names `make run-stack` takes, and
the engine's and the shim's own `CONDUIT_*` variables reach them through it.
"""


def render() -> str:
    """The whole page."""
    parts = [INTRO]
    variables: list[tuple[str, str, str]] = []
    for command, module_form, module in PROGRAMS:
        parser = importlib.import_module(module).build_parser()
        parts.append(_program(command, module_form, parser))
        variables += [(name, command, _flag_name(action)) for action in _options(parser)
                      for name in getattr(action, "env_names", ())]
    parts.append(_variables(variables))
    return "\n".join(parts)


def _program(command: str, module_form: str, parser: argparse.ArgumentParser) -> str:
    lines = [f"## {command}", "", f"`{command}`, or `{module_form}`.", ""]
    if parser.description:
        lines += ["```", parser.description.strip(), "```", ""]
    formatter = parser._get_formatter()
    # The options first, then what follows them (the launcher's engine flags after `--`).
    groups = sorted(parser._action_groups, key=lambda group: group.title == "positional arguments")
    for group in groups:
        actions = [action for action in group._group_actions if action.help is not argparse.SUPPRESS
                   and action.dest != "help"]
        if not actions:
            continue
        if group.title not in ("options", "optional arguments", "positional arguments"):
            lines += [f"### {group.title}", ""]
            if group.description:
                lines += [*textwrap.wrap(group.description[0].upper() + group.description[1:] + ".", WIDTH), ""]
        for action in actions:
            lines += _entry(action, formatter._expand_help(action))
        lines.append("")
    return "\n".join(lines)


def _entry(action: argparse.Action, help_text: str) -> list[str]:
    """One flag as a list item, wrapped: `--flag METAVAR`: its help."""
    if action.option_strings:
        metavar = "" if action.nargs == 0 else " " + (action.metavar or action.dest.upper())
        if isinstance(action, argparse.BooleanOptionalAction):
            name = " / ".join(action.option_strings)
        else:
            name = ", ".join(action.option_strings) + metavar
    else:
        name = "-- " + (action.metavar or action.dest.upper())
    if action.choices is not None and action.metavar is None and not isinstance(action,
                                                                              argparse.BooleanOptionalAction):
        name = f"{', '.join(action.option_strings)} {{{','.join(map(str, action.choices))}}}"
    help_text = re.sub(r"<(?=[A-Za-z/])", "&lt;", help_text)  # <think> is text, not a tag Markdown would drop
    return textwrap.wrap(f"- `{name}`: {help_text}", WIDTH, subsequent_indent="  ", break_on_hyphens=False,
                         break_long_words=False)


def _options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    return (action for action in parser._actions if action.option_strings and action.dest != "help")


def _flag_name(action: argparse.Action) -> str:
    return next(flag for flag in action.option_strings if flag.startswith("--"))


def _variables(variables: list[tuple[str, str, str]]) -> str:
    lines = ["## Environment variables", "", "Each variable and the flag it sets.", ""]
    by_name: dict[str, list[str]] = {}
    for name, command, flag in variables:
        by_name.setdefault(name, []).append(f"{command} `{flag}`")
    for name in sorted(by_name):
        lines += textwrap.wrap(f"- `{name}`: {', '.join(by_name[name])}", WIDTH, subsequent_indent="  ")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conduit_common.flagdoc", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the page (default %(default)s)")
    parser.add_argument("--check", action="store_true", help="compare with the page instead of writing it")
    args = parser.parse_args(argv)
    page = render()
    if not args.check:
        args.out.write_text(page)
        return 0
    current = args.out.read_text() if args.out.exists() else ""
    if current == page:
        print(f"{args.out} is up to date")
        return 0
    sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), page.splitlines(True),
                                               str(args.out), "generated"))
    print(f"stale: {args.out}; run 'make docs'", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
