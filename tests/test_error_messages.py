"""Every option a message names exists (item 18).

An error that tells the user to pass ``require_snapshot=False`` when the call
they made (``open_run``) takes ``allow_fresh_state=True`` sends them to an
option that is not there. These tests read the source: every ``name=`` in a
user-facing string of ``eventbus``, ``handlers`` and ``adapters`` must be a
parameter of some public callable or class of the project, or an attribute
users set on their callbacks.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventbus import StatefulCallback
from eventbus.state import StateRestoreError, StateStore
from handlers import EarlyStopping, UserCallback, open_run

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("eventbus", "handlers", "adapters")


def public_modules() -> Iterator[str]:
    """Every module of the project a user imports: no part of its name is private."""
    for package in PACKAGES:
        yield package
        for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                yield info.name


#: ``name=`` not preceded by a word character or a dot, and not ``==``.
OPTION = re.compile(r"(?<![\w.])([a-z_][a-z0-9_]*)=(?!=)")
#: HTML markup (a tag, or a fragment starting with an attribute, `` class="{}"``) and
#: ``<Name ...>`` reprs: their ``name=`` are attributes and fields, not options.
MARKUP = re.compile(r'<[A-Za-z!/]|\A\s*[a-z-]+="')
#: Tokens that look like options but are not ours, each with why.
NOT_OURS = {
    # ``class Name(Event, tag="pkg.Name")``: msgspec's class keyword, in a code example.
    "tag",
    # Hugging Face ``Trainer.train``'s option, passed on by ``run_with_failures(**kwargs)``.
    "resume_from_checkpoint",
    # Lightning ``Trainer``'s option, which decides when the Lightning adapter gets rounds.
    "log_every_n_steps",
}

pytest.importorskip("transformers", reason="adapters.transformers is one of the checked modules")
pytest.importorskip("ray", reason="adapters.ray is one of the checked modules")


def _text(node: ast.expr) -> str | None:
    """A string literal's text; an f-string's with ``{}`` for each replacement field."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
        return "".join(str(part) for part in parts)
    return None


def messages() -> Iterator[tuple[str, str]]:
    """(where, text) of every string literal outside docstrings and markup.

    Messages are often built before they are raised or logged (a variable, a
    list of warnings, a reason kept in an event), so every literal counts, not
    only those written inside a ``raise`` or a log call.
    """
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            skipped: set[int] = set()
            for node in ast.walk(tree):
                body = getattr(node, "body", None)
                documented = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
                if isinstance(node, documented) and body:
                    first = body[0]
                    if isinstance(first, ast.Expr):
                        skipped.add(id(first.value))
                if isinstance(node, ast.JoinedStr):
                    skipped.update(id(inner) for inner in ast.walk(node) if inner is not node)
            for node in ast.walk(tree):
                if not isinstance(node, ast.expr) or id(node) in skipped:
                    continue
                text = _text(node)
                if text is not None and not MARKUP.search(text):
                    yield f"{path.relative_to(ROOT)}:{node.lineno}", text


def _parameters(function: Any) -> set[str]:
    try:
        return set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return set()


def known_options() -> set[str]:
    """Parameters of every public callable and class (their public methods and fields
    included), and the attributes users set on their callbacks."""
    names: set[str] = set()
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if not callable(obj):
                continue
            names |= _parameters(obj)
            if inspect.isclass(obj):
                names |= set(getattr(obj, "__struct_fields__", ()))
                for attribute, member in inspect.getmembers(obj):
                    if not attribute.startswith("_") and callable(member):
                        names |= _parameters(member)
    for cls in (UserCallback, StatefulCallback):
        names |= {name for klass in cls.__mro__ for name in vars(klass).get("__annotations__", {})}
    return names


def test_the_scan_sees_the_options_messages_name() -> None:
    found = {match for _, text in messages() for match in OPTION.findall(text)}
    assert {"allow_fresh_state", "state_dir", "max_bytes", "blocking"} <= found
    assert {"timeout", "over_budget", "delivery", "max_faults"} <= known_options()


def test_every_option_a_message_names_exists() -> None:
    known = known_options() | NOT_OURS
    unknown = sorted(
        f"{where}: {option}= in {text[:120]!r}"
        for where, text in messages()
        for option in OPTION.findall(text)
        if option not in known
    )
    assert unknown == []


def test_the_allow_list_holds_only_names_still_used_and_not_ours() -> None:
    found = {match for _, text in messages() for match in OPTION.findall(text)}
    assert found >= NOT_OURS
    assert not NOT_OURS & known_options()


# --- the message that named a missing option ------------------------------------------------


def test_a_missing_snapshot_names_the_options_of_open_run_and_of_the_store(
    tmp_path: Path,
) -> None:
    old = tmp_path / "old-checkpoint"
    old.mkdir()
    with pytest.raises(StateRestoreError) as info:
        StateStore(tmp_path).restore([EarlyStopping("loss")], str(old), require_snapshot=True)
    message = str(info.value)
    assert "open_run(allow_fresh_state=True)" in message
    assert "StateStore.restore(require_snapshot=False)" in message
    assert "allow_fresh_state" in inspect.signature(open_run).parameters
    assert "require_snapshot" in inspect.signature(StateStore.restore).parameters


@pytest.mark.anyio
async def test_resuming_through_open_run_without_states_names_allow_fresh_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    os.makedirs("runs/a/checkpoint_000004")  # a checkpoint written without the state store
    with pytest.raises(StateRestoreError, match=r"allow_fresh_state=True"):
        async with open_run(
            world_size=1,
            callbacks=[EarlyStopping("loss")],
            state_dir="runs/a",
            resume_from="runs/a/checkpoint_000004",
        ):
            pass
