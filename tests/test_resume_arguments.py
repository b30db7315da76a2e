"""Resuming with arguments that differ from the saved ones (item 17).

A resume continues the saved run, so the saved arguments win (as Hugging
Face and Lightning restore them), except the ones a class declares in
``state_live_args`` (options a snapshot must not switch on). Either way the
difference is never silent: one warning per callback, naming it readably and
each differing argument with both values and which one was used, logged with
the other restore warnings and listed in ``StateRestored``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from structlog.testing import capture_logs

from eventbus import StateRestored
from eventbus.log import read_log
from eventbus.state import StateStore
from handlers import EarlyStopping

SCRIPT = textwrap.dedent(
    """
    import sys

    import anyio

    from eventbus import configure_logging
    from handlers import EarlyStopping, open_run


    async def main(patience: int, resume_from: str | None) -> None:
        early = EarlyStopping("loss", patience=patience)
        async with open_run(
            world_size=1,
            callbacks=[early],
            state_dir="runs/a",
            log="runs/a/run.evlog",
            resume_from=resume_from,
        ) as run:
            for step in range(5 if resume_from else 1, 9):
                checkpoint = None
                if step % 4 == 0:
                    checkpoint = f"runs/a/checkpoint_{step:06d}"
                    await anyio.Path(checkpoint).mkdir(parents=True, exist_ok=True)
                await run.reporter(0).report({"loss": 1.0 / step}, checkpoint)
        print("patience", early.patience)


    configure_logging()
    resume_from = sys.argv[2] if len(sys.argv) > 2 else None
    anyio.run(main, int(sys.argv[1]), resume_from)
    """
)

WARNING = (
    "EarlyStopping(metric='loss', mode='min'): resumed with the saved patience=3, "
    "not patience=10 given now (a resume continues the saved run)"
)


def run_script(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, str(where / "train.py"), *args],
        capture_output=True,
        text=True,
        cwd=where,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done


def test_a_resume_with_a_changed_argument_warns_on_the_console_and_in_the_event(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    first = run_script(tmp_path, "3")
    assert "resumed with" not in first.stderr
    resumed = run_script(tmp_path, "10", "runs/a/checkpoint_000004")
    assert resumed.stdout.strip() == "patience 3"  # the saved one wins
    assert WARNING in resumed.stderr
    assert resumed.stderr.count("resumed with the saved") == 1  # once per callback
    (restored,) = [
        e for e in read_log(tmp_path / "runs/a/run.evlog").events if isinstance(e, StateRestored)
    ]
    assert WARNING in restored.warnings


def test_one_warning_per_callback_names_every_differing_argument(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    store = StateStore(tmp_path)
    store.register([EarlyStopping("loss", patience=3, threshold=0.5)])
    store.snapshot(str(tmp_path / "ck"))
    live = EarlyStopping("loss", patience=10, threshold=0.25)
    with capture_logs() as logs:
        _, report = StateStore(tmp_path).restore([live], str(tmp_path / "ck"), in_place=True)
    assert (live.patience, live.threshold) == (3, 0.5)
    (warning,) = report.warnings
    assert warning == (
        "EarlyStopping(metric='loss', mode='min'): resumed with the saved patience=3, "
        "not patience=10 given now; the saved threshold=0.5, not threshold=0.25 given now "
        "(a resume continues the saved run)"
    )
    (line,) = logs
    assert line["log_level"] == "warning" and line["problems"] == (warning,)


def test_the_same_arguments_resume_without_a_warning(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    store = StateStore(tmp_path)
    store.register([EarlyStopping("loss", patience=4)])
    store.snapshot(str(tmp_path / "ck"))
    _, report = StateStore(tmp_path).restore(
        [EarlyStopping("loss", patience=4)], str(tmp_path / "ck")
    )
    assert report.warnings == ()


def test_an_argument_left_at_its_default_takes_the_saved_value_silently(tmp_path: Path) -> None:
    """A callback built with defaults to take a saved state asked for nothing else."""
    (tmp_path / "ck").mkdir()
    store = StateStore(tmp_path)
    store.register([EarlyStopping("loss", patience=7)])
    store.snapshot(str(tmp_path / "ck"))
    live = EarlyStopping("loss")
    _, report = StateStore(tmp_path).restore([live], str(tmp_path / "ck"), in_place=True)
    assert live.patience == 7 and report.warnings == ()
