"""Command lines where every flag also reads an environment variable (for containers and Make).

`EnvArgumentParser.add_argument` gives each option a variable: `env="NAME"` (or several names, the
first documented, the others kept for compatibility), else CONDUIT_<DEST>, e.g. --max-batch-size
reads CONDUIT_MAX_BATCH_SIZE. The variable's value goes through the flag's own conversion: `type=`
and `choices=`; true/false for switches (1/true/yes/on, 0/false/no/off); comma-separated items for
repeatable flags. An empty variable counts as unset, a flag on the command line wins over it (a
repeatable flag replaces the variable's list, unless `env_adds=True`: sets of credentials take the
values of both), and a bad value is a usage error that names the variable. The help of each flag
ends with its variable and its default.

The variables are read when the arguments are parsed, not when the parser is built, and `--help`
shows the built-in default, never a variable's value (it may be a secret).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

ENV_PREFIX = "CONDUIT_"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
_UNSET = object()


def prog_name(command: str, module: str) -> str:
    """How the user started us, for usage lines: the console command, or `python -m module`."""
    return command if os.path.basename(sys.argv[0]) == command else f"python -m {module}"


class _EnvFlags:
    """add_argument with `env=`, for the parser and its argument groups alike."""

    def add_argument(self, *flags: str, env: str | Sequence[str] | None = None, env_adds: bool = False,
                     **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*flags, **kwargs)  # type: ignore[misc]
        if not action.option_strings or action.default is argparse.SUPPRESS:
            return action  # positionals and --help take no variable
        if action.nargs == 0 and not isinstance(action.default, bool):
            raise ValueError(f"{flags[0]}: a switch needs a True/False default to read a variable")
        if env_adds and not _repeatable(action):
            raise ValueError(f"{flags[0]}: only a repeatable flag can add to its variable")
        # Read by parse_known_args (and the tests).
        action.env_names = (env,) if isinstance(env, str) else tuple(env or (ENV_PREFIX + action.dest.upper(),))
        action.env_adds = env_adds
        action.help = _help_with_env(action)
        return action


class _EnvGroup(_EnvFlags, argparse._ArgumentGroup):
    pass


class EnvArgumentParser(_EnvFlags, argparse.ArgumentParser):
    """An ArgumentParser whose options (groups' included) each read an environment variable."""

    def add_argument_group(self, *args: Any, **kwargs: Any) -> argparse._ArgumentGroup:
        group = _EnvGroup(self, *args, **kwargs)  # what ArgumentParser.add_argument_group does, with our group
        self._action_groups.append(group)
        return group

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        # argparse starts from what is already on the namespace: a flag replaces a value there, and
        # a repeatable flag appends to a list there. Lists that flags replace are filled in after.
        namespace = argparse.Namespace() if namespace is None else namespace
        unless_flagged = []
        for action in self._actions:
            if not getattr(action, "env_names", None) or hasattr(namespace, action.dest):
                continue
            value = self._from_env(action)
            if value is _UNSET:
                continue
            if _repeatable(action) and not action.env_adds:
                unless_flagged.append((action, value))
            else:
                setattr(namespace, action.dest, value)
        namespace, extras = super().parse_known_args(args, namespace)
        for action, value in unless_flagged:
            if getattr(namespace, action.dest) is action.default:  # a flag would have made a new list
                setattr(namespace, action.dest, value)
        return namespace, extras

    def _from_env(self, action: argparse.Action) -> Any:
        found = [(name, value) for name in action.env_names if (value := os.environ.get(name, "").strip())]
        if not found:
            return _UNSET
        if _repeatable(action):
            return [self._convert(action, name, item.strip())
                    for name, raw in found for item in raw.split(",") if item.strip()]
        return self._convert(action, *found[0])

    def _convert(self, action: argparse.Action, name: str, raw: str) -> Any:
        if action.nargs == 0:
            word = raw.lower()
            if word not in TRUE_WORDS + FALSE_WORDS:
                self.error(f"environment variable {name}: expected one of {'/'.join(TRUE_WORDS + FALSE_WORDS)}, "
                           f"got {raw!r}")
            return word in TRUE_WORDS
        convert = action.type or str
        try:
            value = convert(raw)  # type: ignore[operator]
        except argparse.ArgumentTypeError as exc:  # the conversion's own words (a bound, say)
            self.error(f"environment variable {name}: {exc}")
        except (TypeError, ValueError):
            kind = getattr(convert, "__name__", repr(convert))
            self.error(f"environment variable {name}: invalid {kind} value: {raw!r}")
        if action.choices is not None and value not in action.choices:
            self.error(f"environment variable {name}: invalid choice: {raw!r} "
                       f"(choose from {', '.join(map(str, action.choices))})")
        return value


def _repeatable(action: argparse.Action) -> bool:
    return isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*")


def _help_with_env(action: argparse.Action) -> str:
    help_text = action.help or ""
    variable = "env " + " or ".join(action.env_names)
    if _repeatable(action):
        variable += ", comma-separated" + (", added to the flags" if action.env_adds else "")
    elif action.nargs == 0:
        variable += ", true/false"
    default = action.default
    if "default" in help_text.lower() or default is None or default == []:
        note = variable  # no default, or the help already tells it
    elif isinstance(default, bool):
        note = f"{variable}; default {'on' if default else 'off'}"
    else:
        note = f"{variable}; default {default}"
    note = note.replace("%", "%%")  # argparse %-formats help strings
    return f"{help_text} ({note})" if help_text else f"({note})"
