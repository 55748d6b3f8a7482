"""``tao hooks install|uninstall TARGET``: put TAO's hooks into an agent harness's settings.

Targets register themselves in :data:`TARGETS` with :func:`target`: one function that gets a
:class:`HookRequest` and returns the file :class:`Change`\\ s it wants (it reads, never writes).
This module applies them: ``--dry-run`` prints a unified diff and writes nothing; otherwise each
changed file is first copied to ``<file>.tao.bak`` and then replaced atomically. Nothing is
written when nothing changes, so installing twice changes nothing the second time. JSON helpers
(:func:`read_json`, :func:`json_change`, :func:`merge_hooks`, :func:`remove_hooks`) serve any
target whose settings nest hooks the Claude Code way (OpenHands' ``.openhands/hooks.json``
does too).

``claude-code``. Settings files (https://code.claude.com/docs/en/settings and
https://code.claude.com/docs/en/hooks, "Configuration"): ``--scope user``
``~/.claude/settings.json``, ``project`` ``.claude/settings.json``, ``local``
``.claude/settings.local.json`` (not committed). Under ``hooks``, each event holds a list of
matcher groups ``{"matcher": ..., "hooks": [{"type": "command", "command": ..., "timeout":
seconds, "async": bool}]}``; ``matcher`` applies to the tool events (tool name; ``*`` is every
tool) and to SessionStart (its source), and is left out for the others. ``async: true`` runs a
command hook in the background without blocking Claude (hooks reference, "Run hooks in the
background"); it is set everywhere except SessionEnd, which runs as Claude Code exits. We add
one group per event with our command (``<absolute path of tao> hook claude`` unless
``--command``), timeout 5 s, and keep every other hook. Ours are recognised by their command:
the ``--command`` given, or any command that runs ``tao hook claude``; uninstall removes exactly
those, and the groups and events it leaves empty. When the result equals the content saved in
``<file>.tao.bak`` (the file as it was before the install), that text is written back
verbatim, so an install followed by an uninstall restores the file byte for byte.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

from shared.cli.ops import OpsError

__all__ = [
    "BACKUP_SUFFIX",
    "TARGETS",
    "Change",
    "HookRequest",
    "HooksError",
    "add_hooks_parsers",
    "default_command",
    "json_change",
    "merge_hooks",
    "read_json",
    "remove_hooks",
    "runs_tao_hook",
    "target",
]

BACKUP_SUFFIX = ".tao.bak"
HOOK_TIMEOUT_S = 5
Action = Literal["install", "uninstall"]
Scope = Literal["user", "project", "local"]
SCOPES: tuple[Scope, ...] = ("user", "project", "local")


class HooksError(OpsError):
    """A settings file that cannot be read or changed: one line, exit 2."""


@dataclass(frozen=True, slots=True)
class HookRequest:
    """What a target is asked to do: ``action`` at ``scope``, hooks running ``command`` (None:
    the target's default), project files under ``cwd``, user files under ``home``."""

    action: Action
    scope: Scope
    command: str | None
    cwd: Path
    home: Path


@dataclass(frozen=True, slots=True)
class Change:
    """File ``path`` goes from ``before`` to ``after`` (``None``: absent / delete)."""

    path: Path
    before: str | None
    after: str | None


Target = Callable[[HookRequest], list[Change]]
TARGETS: dict[str, Target] = {}


def target(name: str) -> Callable[[Target], Target]:
    """Register ``fn`` as ``tao hooks install|uninstall <name>``."""

    def register(fn: Target) -> Target:
        TARGETS[name] = fn
        return fn

    return register


# -- helpers for targets -------------------------------------------------------------------------


def default_command(token: str, argv0: str | None = None, path: str | None = None) -> str:
    """The hook command: plain ``tao hook <token>`` when ``tao`` on ``PATH`` (``path``) is the
    running one, so the installed hook survives a moved or rebuilt clone; else ``<absolute
    path of the running tao> hook <token>`` (a harness need not share this shell's PATH),
    else ``tao`` on PATH by its path, else plain ``tao``."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    running: str | None = None
    if argv0 and Path(argv0).name == "tao" and os.access(argv0, os.X_OK):
        running = os.path.abspath(argv0)
    on_path = shutil.which("tao", path=path)
    if on_path is not None and (
        running is None or os.path.realpath(on_path) == os.path.realpath(running)
    ):
        return f"tao hook {token}"
    return f"{shlex.quote(running or 'tao')} hook {token}"


def command_note(command: str) -> str | None:
    """A line for the installer's output when ``command`` names ``tao`` by an absolute path
    (it breaks if that install moves): how to keep it working."""
    try:
        exe = shlex.split(command)[0]
    except (ValueError, IndexError):
        return None
    if not os.path.isabs(exe):
        return None
    return (
        f"note: the hooks run {exe}; after moving or deleting that install, run "
        "`tao hooks install` again (or put tao on PATH, or pass --command)"
    )


def runs_tao_hook(command: str, token: str) -> bool:
    """Whether ``command`` runs ``tao hook <token>`` (any path to ``tao``)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    return len(words) >= 3 and Path(words[0]).name == "tao" and words[-2:] == ["hook", token]


def read_json(path: Path) -> tuple[str | None, dict[str, Any]]:
    """(text, object) of a JSON settings file; (None, {}) when it does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, {}
    except (OSError, UnicodeDecodeError) as exc:
        raise HooksError(f"{path}: cannot read: {exc}") from None
    if not text.strip():
        return text, {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise HooksError(f"{path}: not valid JSON ({exc}); nothing changed") from None
    if not isinstance(value, dict):
        raise HooksError(f"{path}: expected a JSON object; nothing changed")
    return text, value


def _loads(text: str | None) -> object:
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        return None


def _dump(value: Mapping[str, Any], like: str | None) -> str:
    """``value`` as JSON, indented like ``like`` (2 spaces by default), newline-terminated."""
    indent = 2
    for line in (like or "").splitlines()[1:]:
        stripped = line.lstrip(" ")
        if stripped and len(stripped) < len(line):
            indent = len(line) - len(stripped)
            break
    return json.dumps(value, indent=indent, ensure_ascii=False) + "\n"


def json_change(path: Path, before: str | None, value: Mapping[str, Any]) -> Change:
    """The change that makes ``path`` hold ``value``: none when it already does; the backup's
    text when that holds exactly ``value``; deleting the file when ``value`` is empty and no
    backup exists (we created the file); else ``value`` indented like the file."""
    if before is not None and _loads(before) == value:
        return Change(path, before, before)
    try:
        saved: str | None = path.with_name(path.name + BACKUP_SUFFIX).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        saved = None
    if saved is not None and _loads(saved) == value:
        return Change(path, before, saved)
    if not value and saved is None:
        return Change(path, before, None)
    return Change(path, before, _dump(value, before))


def _hooks_of(settings: Mapping[str, Any], path: Path) -> dict[str, Any]:
    hooks = settings.get("hooks", {})
    if not isinstance(hooks, dict):
        raise HooksError(f"{path}: hooks: expected an object; nothing changed")
    for event, groups in hooks.items():
        if not isinstance(groups, list):
            raise HooksError(f"{path}: hooks.{event}: expected a list; nothing changed")
    return hooks


def _entries(group: Any) -> list[Any] | None:
    entries = group.get("hooks") if isinstance(group, dict) else None
    return entries if isinstance(entries, list) else None


def remove_hooks(
    settings: Mapping[str, Any], ours: Callable[[Any], bool], path: Path
) -> dict[str, Any]:
    """``settings`` without the hook entries ``ours`` recognises; the groups, events and
    ``hooks`` object this empties are dropped, anything that was empty before is kept."""
    out = dict(settings)
    if "hooks" not in settings:
        return out
    hooks = _hooks_of(settings, path)
    new_hooks: dict[str, Any] = {}
    for event, groups in hooks.items():
        kept_groups: list[Any] = []
        for group in groups:
            entries = _entries(group)
            if entries is None:
                kept_groups.append(group)
                continue
            kept = [e for e in entries if not ours(e)]
            if len(kept) == len(entries):
                kept_groups.append(group)
            elif kept:
                kept_groups.append({**group, "hooks": kept})
        if kept_groups or not groups:
            new_hooks[event] = kept_groups
    if new_hooks or not hooks:
        out["hooks"] = new_hooks
    else:
        del out["hooks"]
    return out


def merge_hooks(
    settings: Mapping[str, Any],
    groups: Mapping[str, dict[str, Any]],
    ours: Callable[[Any], bool],
    path: Path,
) -> dict[str, Any]:
    """``settings`` with exactly one group of ours per event of ``groups``: unchanged when
    that is already so, else our old entries are removed and the new groups appended."""
    hooks = _hooks_of(settings, path)
    found = [
        (event, group)
        for event, event_groups in hooks.items()
        for group in event_groups
        if any(ours(e) for e in _entries(group) or [])
    ]
    if sorted(found, key=lambda eg: eg[0]) == sorted(groups.items(), key=lambda eg: eg[0]):
        return dict(settings)
    base = remove_hooks(settings, ours, path)
    new_hooks = dict(_hooks_of(base, path))
    for event, group in groups.items():
        new_hooks[event] = [*new_hooks.get(event, []), group]
    return {**base, "hooks": new_hooks}


# -- targets -------------------------------------------------------------------------------------

CLAUDE_EVENTS: tuple[tuple[str, bool, bool], ...] = (
    # (event, has a matcher, async)
    ("PreToolUse", True, True),
    ("PostToolUse", True, True),
    ("PostToolUseFailure", True, True),
    ("SessionStart", True, True),
    ("SessionEnd", False, False),
    ("Stop", False, True),
    ("UserPromptSubmit", False, True),
)
_CLAUDE_FILES: dict[Scope, tuple[str, ...]] = {
    "user": (".claude", "settings.json"),
    "project": (".claude", "settings.json"),
    "local": (".claude", "settings.local.json"),
}


def claude_settings_path(scope: Scope, cwd: Path, home: Path) -> Path:
    """The Claude Code settings file of ``scope``."""
    return (home if scope == "user" else cwd).joinpath(*_CLAUDE_FILES[scope])


@target("claude-code")
def claude_code(req: HookRequest) -> list[Change]:
    """Claude Code: command hooks running ``tao hook claude`` (module docstring)."""
    path = claude_settings_path(req.scope, req.cwd, req.home)
    command = req.command or default_command("claude")
    before, settings = read_json(path)

    def ours(entry: Any) -> bool:
        cmd = entry.get("command") if isinstance(entry, dict) else None
        return isinstance(cmd, str) and (cmd == command or runs_tao_hook(cmd, "claude"))

    if req.action == "uninstall":
        return [json_change(path, before, remove_hooks(settings, ours, path))]
    groups: dict[str, dict[str, Any]] = {}
    for event, matcher, is_async in CLAUDE_EVENTS:
        entry: dict[str, Any] = {"type": "command", "command": command, "timeout": HOOK_TIMEOUT_S}
        if is_async:
            entry["async"] = True
        groups[event] = {"matcher": "*", "hooks": [entry]} if matcher else {"hooks": [entry]}
    return [json_change(path, before, merge_hooks(settings, groups, ours, path))]


# -- OpenCode, OpenHands, mini-swe-agent ----------------------------------------------------------
#
# ``opencode``: copies TAO's plugin (shared/harness/opencode_plugin/tao.ts) to
# ``.opencode/plugins/tao.ts`` (``--scope project``) or ``~/.config/opencode/plugins/tao.ts``
# (``user``; ``$XDG_CONFIG_HOME`` when set): OpenCode loads every .ts/.js file there
# (https://opencode.ai/docs/plugins, "Discover"). Uninstall deletes it. A ``tao.ts`` there that
# is not TAO's is refused.
#
# ``openhands``: ``.openhands/hooks.json`` of the project (``--scope project``) or of the home
# directory (``user``; OpenHands reads the first of the two that exists,
# ``openhands/sdk/hooks/config.py`` ``HookConfig.load``). The file nests hooks like Claude Code's
# settings under ``hooks`` (PascalCase events), or holds the events at the top level, PascalCase
# or snake_case (``pre_tool_use``); we write into whichever the file uses, under the spelling an
# event already has there (OpenHands refuses an event spelled both ways), and create new files
# as ``{"hooks": {...}}`` with PascalCase keys, which every SDK version reads. Our groups run
# ``tao hook openhands`` with matcher ``*``, timeout 5 s and ``"async": true`` (run in the
# background, never blocking: docs.openhands.dev/openhands/usage/customization/hooks; older
# SDKs ignore the key and wait for the hook) on PreToolUse, PostToolUse, Stop and
# UserPromptSubmit, and synchronously on SessionEnd (background hooks are stopped at session end).
#
# ``mini-swe-agent``: writes a config overlay (``tao-mini-swe-agent.yaml`` in the project, or
# ``~/.config/mini-swe-agent/tao.yaml``) that swaps the environment for
# :class:`shared.harness.miniswe_env.TaoEnvironment`; the user adds it after their own config
# (``mini -c mini.yaml -c tao-mini-swe-agent.yaml``: mini-swe-agent merges ``-c`` files in
# order). Uninstall deletes it; a file there that is not TAO's is refused.

OPENCODE_PLUGIN = "tao.ts"
_OPENCODE_MARK = "TAO plugin for OpenCode"
OPENHANDS_EVENTS: tuple[tuple[str, bool], ...] = (
    # (event, async)
    ("PreToolUse", True),
    ("PostToolUse", True),
    ("Stop", True),
    ("UserPromptSubmit", True),
    ("SessionEnd", False),
)
_MINISWE_MARK = "# TAO: mini-swe-agent reports its commands to TAO"


def _no_local(name: str, scope: Scope) -> None:
    if scope == "local":
        raise HooksError(f"{name} has no local scope; use --scope project or --scope user")


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise HooksError(f"{path}: cannot read: {exc}") from None


def opencode_plugin_source() -> str:
    """The plugin TAO ships (``shared/harness/opencode_plugin/tao.ts``)."""
    from importlib.resources import files

    plugin = files("shared.harness").joinpath("opencode_plugin", OPENCODE_PLUGIN)
    return plugin.read_text(encoding="utf-8")


def opencode_plugin_path(scope: Scope, cwd: Path, home: Path) -> Path:
    """Where the plugin goes for ``scope``."""
    _no_local("opencode", scope)
    if scope == "project":
        return cwd / ".opencode" / "plugins" / OPENCODE_PLUGIN
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    config = Path(xdg) if os.path.isabs(xdg) else home / ".config"
    return config / "opencode" / "plugins" / OPENCODE_PLUGIN


@target("opencode")
def opencode(req: HookRequest) -> list[Change]:
    """OpenCode: TAO's plugin file in a plugins directory (section comment above)."""
    path = opencode_plugin_path(req.scope, req.cwd, req.home)
    before = _read_text(path)
    if before is not None and _OPENCODE_MARK not in before:
        raise HooksError(f"{path}: exists and is not TAO's plugin; nothing changed")
    after = None if req.action == "uninstall" else opencode_plugin_source()
    return [Change(path, before, after)]


def openhands_hooks_path(scope: Scope, cwd: Path, home: Path) -> Path:
    """The ``.openhands/hooks.json`` of ``scope``."""
    _no_local("openhands", scope)
    return (home if scope == "user" else cwd) / ".openhands" / "hooks.json"


def _snake(event: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in event).lstrip("_")


@target("openhands")
def openhands(req: HookRequest) -> list[Change]:
    """OpenHands: command hooks running ``tao hook openhands`` (section comment above)."""
    path = openhands_hooks_path(req.scope, req.cwd, req.home)
    command = req.command or default_command("openhands")
    before, settings = read_json(path)
    nested = "hooks" in settings or not settings
    container: dict[str, Any] = settings if nested else {"hooks": settings}
    hooks = _hooks_of(container, path)

    def ours(entry: Any) -> bool:
        cmd = entry.get("command") if isinstance(entry, dict) else None
        return isinstance(cmd, str) and (cmd == command or runs_tao_hook(cmd, "openhands"))

    if req.action == "uninstall":
        result = remove_hooks(container, ours, path)
    else:
        snake = any(key[:1].islower() for key in hooks)
        groups: dict[str, dict[str, Any]] = {}
        for event, is_async in OPENHANDS_EVENTS:
            key = event if event in hooks or not snake else _snake(event)
            if key not in hooks and _snake(event) in hooks:
                key = _snake(event)
            entry: dict[str, Any] = {
                "type": "command",
                "command": command,
                "timeout": HOOK_TIMEOUT_S,
            }
            if is_async:
                entry["async"] = True
            groups[key] = {"matcher": "*", "hooks": [entry]}
        result = merge_hooks(container, groups, ours, path)
    value = result if nested else result.get("hooks", {})
    return [json_change(path, before, value)]


_MINISWE_FILES: dict[Scope, tuple[str, ...]] = {
    "project": ("tao-mini-swe-agent.yaml",),
    "user": (".config", "mini-swe-agent", "tao.yaml"),
}


def miniswe_overlay() -> str:
    """The mini-swe-agent config overlay that wraps the environment."""
    return (
        f"{_MINISWE_MARK} (written by `tao hooks install mini-swe-agent`).\n"
        "# Use it after your own config: mini -c mini.yaml -c <this file> (docs/harnesses.md).\n"
        "environment:\n"
        "  environment_class: shared.harness.miniswe_env.TaoEnvironment\n"
        "  # The environment to wrap: local, docker, singularity, or a module.Class path.\n"
        "  inner_class: local\n"
    )


@target("mini-swe-agent")
def mini_swe_agent(req: HookRequest) -> list[Change]:
    """mini-swe-agent: a config overlay using TAO's environment wrapper (section comment)."""
    _no_local("mini-swe-agent", req.scope)
    path = (req.home if req.scope == "user" else req.cwd).joinpath(*_MINISWE_FILES[req.scope])
    before = _read_text(path)
    if before is not None and not before.startswith(_MINISWE_MARK):
        raise HooksError(f"{path}: exists and is not TAO's overlay; nothing changed")
    after = None if req.action == "uninstall" else miniswe_overlay()
    return [Change(path, before, after)]


# -- applying ------------------------------------------------------------------------------------


def _diff(change: Change) -> str:
    lines = difflib.unified_diff(
        (change.before or "").splitlines(keepends=True),
        (change.after or "").splitlines(keepends=True),
        fromfile=str(change.path) if change.before is not None else "/dev/null",
        tofile=str(change.path) if change.after is not None else "/dev/null",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _write(change: Change) -> Path | None:
    """Back up and replace one file; returns the backup path (None: there was no file)."""
    path = change.path
    backup: Path | None = None
    try:
        if change.before is not None:
            backup = path.with_name(path.name + BACKUP_SUFFIX)
            backup.write_text(change.before, encoding="utf-8")
        if change.after is None:
            path.unlink(missing_ok=True)
            return backup
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(change.after, encoding="utf-8")
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        tmp.replace(path)
    except OSError as exc:
        raise HooksError(f"{path}: cannot write: {exc.strerror or exc}") from None
    return backup


def apply(changes: Iterable[Change], *, dry_run: bool, verb: str, name: str, out: TextIO) -> None:
    """Print or write ``changes`` (module docstring), one line per file."""
    for change in changes:
        if change.before == change.after:
            out.write(f"{name}: {change.path} already {verb}; nothing to do\n")
        elif dry_run:
            out.write(_diff(change) or f"{name}: {change.path}: no textual change\n")
        else:
            backup = _write(change)
            saved = f" (backup {backup})" if backup is not None else ""
            out.write(f"{name}: {verb} in {change.path}{saved}\n")
    out.flush()


def _cmd_hooks(args: argparse.Namespace, out: TextIO) -> int:
    req = HookRequest(
        action=args.action,
        scope=args.scope,
        command=args.hook_command,
        cwd=Path.cwd(),
        home=Path(os.environ.get("HOME") or Path.home()),
    )
    changes = TARGETS[args.target](req)
    verb = "installed" if args.action == "install" else "uninstalled"
    apply(changes, dry_run=args.dry_run, verb=verb, name=f"tao hooks {args.action}", out=out)
    token = _COMMAND_TOKENS.get(args.target)
    if args.action == "install" and token is not None:
        note = command_note(req.command or default_command(token))
        if note is not None:
            out.write(note + "\n")
    return 0


_COMMAND_TOKENS: dict[str, str] = {"claude-code": "claude", "openhands": "openhands"}
"""The targets whose hooks run a ``tao hook <token>`` command."""


def _cmd_hook(args: argparse.Namespace, out: TextIO) -> int:
    from shared.harness.hookclient import run_hook

    return run_hook([args.harness])


def add_hooks_parsers(sub: Any) -> None:
    """Register ``hook`` (the hook process) and ``hooks install|uninstall`` on ``tao``."""
    hook = sub.add_parser(
        "hook",
        help="forward one harness hook payload from stdin to TAO (always exits 0, silently)",
        description="Read a hook payload on stdin and publish it on tao.v1.hook.<harness>.",
    )
    hook.add_argument("harness", metavar="HARNESS", help="claude, openhands, …")
    hook.set_defaults(run=_cmd_hook)

    hooks = sub.add_parser(
        "hooks",
        help="install or uninstall TAO's hooks in an agent harness",
        description="Merge TAO's hook entries into a harness's settings, or remove them.",
    )
    actions = hooks.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action in ("install", "uninstall"):
        p = actions.add_parser(action, help=f"{action} the hooks of TARGET")
        p.add_argument(
            "target", choices=sorted(TARGETS), metavar="TARGET",
            help=f"one of: {', '.join(sorted(TARGETS))}",
        )  # fmt: skip
        p.add_argument(
            "--scope", choices=SCOPES, default="user", help="settings scope (default user)"
        )
        p.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
        p.add_argument(
            "--command",
            dest="hook_command",  # ``command`` is the top-level subcommand's dest
            metavar="CMD",
            help="the hook command (default: tao hook …, with tao's absolute path when the "
            "tao on PATH is another one)",
        )
        p.set_defaults(run=_cmd_hooks)
